package stack

import (
	"syscall"
)

// Suspend holds new I/O at the gate and waits for the I/O already mapped
// (spec §1.5): presuspend hooks first (delay releases its queue), then the
// gate closes and drains, then postsuspend hooks. Suspending a suspended
// device is a successful no-op.
func (d *Device) Suspend(noflush bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.suspendLocked(noflush)
	return nil
}

func (d *Device) suspendLocked(noflush bool) {
	if d.mu.suspended {
		return
	}
	t := d.live.Load()
	if t != nil {
		for i := range t.segs {
			if h, ok := t.segs[i].target.(Presuspender); ok {
				h.Presuspend(noflush)
			}
		}
	}
	d.gate.close()
	if t != nil {
		for i := range t.segs {
			if h, ok := t.segs[i].target.(Postsuspender); ok {
				h.Postsuspend()
			}
		}
	}
	d.mu.suspended = true
}

// Load puts t in the inactive slot, destroying any table there before.
func (d *Device) Load(t *Table) {
	d.mu.Lock()
	old := d.mu.inactive
	d.mu.inactive = t
	d.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// Clear destroys the inactive table, if any.
func (d *Device) Clear() {
	d.Load(nil)
}

// Resume makes the inactive table live, if there is one (suspending first),
// runs the preresume and resume hooks and releases held I/O (spec §1.4). With
// no inactive table, resuming an active device is a no-op, and a suspended
// device with no live table gives EINVAL.
func (d *Device) Resume() error {
	d.mu.Lock()
	var old *Table
	swapped := false
	if t := d.mu.inactive; t != nil {
		d.suspendLocked(false)
		old = d.live.Swap(t)
		d.mu.inactive = nil
		d.mu.readOnly = t.readOnly
		swapped = true
	}
	if !d.mu.suspended {
		d.mu.Unlock()
		return nil
	}
	t := d.live.Load()
	if t == nil || t.size == 0 {
		d.mu.Unlock()
		return &ArgError{Reason: "no table to resume", Errno: syscall.EINVAL}
	}
	for i := range t.segs {
		if h, ok := t.segs[i].target.(Preresumer); ok {
			if err := h.Preresume(); err != nil {
				d.mu.Unlock()
				if old != nil {
					old.Close()
				}
				return err
			}
		}
	}
	for i := range t.segs {
		if h, ok := t.segs[i].target.(Resumer); ok {
			h.Resume()
		}
	}
	d.mu.suspended = false
	d.gate.open()
	d.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if swapped && d.onChange != nil {
		d.onChange(d)
	}
	return nil
}
