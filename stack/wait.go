package stack

import (
	"context"
	"sync"
	"syscall"
)

// eventWaiters wakes the callers of WaitEvent when a device's event counter
// moves: each waiter takes the current channel, which wake closes and drops.
type eventWaiters struct {
	mu sync.Mutex
	ch chan struct{}
}

// channel returns the channel the next wake closes.
func (w *eventWaiters) channel() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// wake releases every waiter.
func (w *eventWaiters) wake() {
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	w.mu.Unlock()
}

// WaitEvent blocks until the device's event counter differs from eventNr
// (drivers/md/dm-ioctl.c: dev_wait tests for "not equal", whatever the man
// page says), or ctx ends, and returns the counter. The counter moves on
// rename, on remove and on target events, not on load or resume.
func (d *Device) WaitEvent(ctx context.Context, eventNr uint32) (uint32, error) {
	for {
		ch := d.ev.channel()
		if n := d.EventNr(); n != eventNr {
			return n, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return d.EventNr(), ctx.Err()
		}
	}
}

// WaitEvent is `dmsetup wait NAME EVENT_NR` on the device called name: it
// blocks until the device's event counter differs from eventNr, ctx ends or
// the manager's context ends.
func (m *Manager) WaitEvent(ctx context.Context, name string, eventNr uint32) (uint32, error) {
	d := m.Lookup(name)
	if d == nil {
		return 0, NoSuchDevice(name)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(m.ctx, cancel)
	defer stop()
	n, err := d.WaitEvent(ctx, eventNr)
	if err != nil {
		return n, &DeviceError{Name: name, Err: &ArgError{Reason: "wait interrupted", Errno: syscall.EINTR}}
	}
	return n, nil
}
