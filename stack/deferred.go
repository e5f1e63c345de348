package stack

import (
	"syscall"
	"time"
)

// ReapInterval is how often a manager with pending deferred removals checks
// whether their devices are still in use. dm removes such a device at its
// last close; the users of an exported block device (a mount, say) cannot
// be watched, so the manager looks.
const ReapInterval = 50 * time.Millisecond

// DeferredRemove reports whether a deferred removal of d is pending.
func (d *Device) DeferredRemove() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.deferred
}

// startReaper starts the goroutine that removes deferred devices, unless it
// runs.
func (m *Manager) startReaper() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reaping {
		return
	}
	m.reaping = true
	go m.reap()
}

// reap removes deferred devices once unused, until none is pending or the
// manager's context ends.
func (m *Manager) reap() {
	t := time.NewTicker(ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			m.mu.Lock()
			m.reaping = false
			m.mu.Unlock()
			return
		case <-t.C:
		}
		pending := false
		for _, d := range m.Devices() {
			if d.DeferredRemove() {
				m.removeWith(d.Name(), Flags{}, true)
				pending = pending || (d.DeferredRemove() && !d.isRemoved())
			}
		}
		if !pending {
			m.mu.Lock()
			// A removal deferred since the scan started sees reaping set
			// and relies on this goroutine: look once more under the lock.
			for _, d := range m.byName {
				if d.DeferredRemove() {
					pending = true
				}
			}
			if !pending {
				m.reaping = false
			}
			m.mu.Unlock()
			if !pending {
				return
			}
		}
	}
}

// cancelDeferred is the core message @cancel_deferred_remove, as
// drivers/md/dm-ioctl.c: message_for_md and dm.c: dm_cancel_deferred_remove:
// exactly one word; it clears a pending deferred removal (and succeeds if
// there is none); a device already being removed answers EBUSY.
func (m *Manager) cancelDeferred(d *Device, words int) error {
	if words != 1 {
		return Errorf("Invalid arguments for @cancel_deferred_remove")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.removed {
		return &ArgError{Reason: "device is being removed", Errno: syscall.EBUSY}
	}
	d.mu.deferred = false
	return nil
}

// RemoveAll is `dmsetup remove_all`, as drivers/md/dm-ioctl.c:
// dm_hash_remove_all with keep_open_devices: it removes every device that is
// not in use, upper devices first so that the ones they stack on become
// unused, and returns the names of those left. With f.Deferred, those left
// are flagged for deferred removal; other flags are ignored.
func (m *Manager) RemoveAll(f Flags) []string {
	for {
		progress := false
		for _, d := range m.Devices() {
			if d.holders.Load() > 0 {
				continue
			}
			if m.Busy(d) != "" {
				continue
			}
			if m.Remove(d.Name(), Flags{}) == nil {
				progress = true
			}
		}
		if !progress {
			break
		}
	}
	var left []string
	for _, d := range m.Devices() {
		if f.Deferred {
			m.Remove(d.Name(), Flags{Deferred: true})
		}
		if !d.isRemoved() {
			left = append(left, d.Name())
		}
	}
	return left
}

// useExported is useMapped for a device argument that names the block
// device another device of m is exported as (/dev/mapper/NAME, /dev/loopN
// or its MAJOR:MINOR): it resolves in-process, with no round trip through
// the block device.
func (m *Manager) useExported(self, d *Device, arg string) (BlockDevice, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d.isRemoved() || m.byName[d.Name()] != d {
		return nil, Errorf("Device lookup failed: %s: no such mapped device", arg)
	}
	return m.useMapped(self, d)
}
