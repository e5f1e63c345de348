package stack

import (
	"syscall"
	"time"
)

// Remove removes the device called name. It refuses (EBUSY) a device that is
// open or that another table stacks on. A device that is not suspended is
// suspended first (its presuspend and postsuspend hooks run, as in dm).
//
// With f.Force, as dmsetup does, it first replaces the live table with an
// `error` table of the same size (load and resume), so that outstanding and
// new I/O fails, and then removes the device if nothing holds it; if
// something still does, the error table stays live and the removal fails
// with EBUSY.
//
// With f.Deferred, a device that is open or that another table stacks on
// is flagged instead (its info shows "DEFERRED REMOVE") and the call
// succeeds; the manager removes it once nothing uses it, checking every
// ReapInterval, until the message @cancel_deferred_remove clears the flag.
//
// The listeners' OnRemove runs after the device has left the table of
// names, before Remove returns.
func (m *Manager) Remove(name string, f Flags) error {
	return m.removeWith(name, f, false)
}

// removeWith is Remove; with onlyDeferred it removes the device only if a
// deferred removal is pending and nothing uses it any more, and is silent
// otherwise.
func (m *Manager) removeWith(name string, o Flags, onlyDeferred bool) error {
	force := o.Force
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	if onlyDeferred && !d.DeferredRemove() {
		d.ctl.Unlock()
		return nil
	}
	swapped := false
	if force {
		if live := d.Live(); live != nil {
			t, err := Build([]Line{{N: 1, Start: 0, Len: uint64(live.Sectors()), Type: Error.Name}},
				BuildOptions{Registry: m.reg, ReadOnly: d.ReadOnly(), Clock: m.clock, Context: m.ctx, Previous: live, Event: d.RaiseEvent, Memory: m.memory, Shared: &m.shared})
			if err == nil {
				d.loadLocked(t)
				swapped, err = d.resumeLocked()
			}
			if err != nil {
				d.ctl.Unlock()
				if swapped {
					m.changed(d)
				}
				return &DeviceError{Name: name, Err: err}
			}
		}
	}
	// The users of an exported block device are counted before m.mu is
	// taken: counting them reads /proc.
	users := m.openers(d) - d.opens.Load()
	m.mu.Lock()
	busy := ""
	switch {
	case d.holders.Load() > 0:
		busy = "device is in use by another table"
	case d.opens.Load()+users > 0:
		busy = "device is open"
	default:
		m.unlinkLocked(d)
	}
	m.mu.Unlock()
	if busy != "" && o.Deferred {
		// As drivers/md/dm-ioctl.c: dev_remove with DM_DEFERRED_REMOVE:
		// flag the device, succeed, and remove it once it is unused.
		d.mu.Lock()
		d.mu.deferred = true
		d.mu.Unlock()
		d.ctl.Unlock()
		if swapped {
			m.changed(d)
		}
		m.startReaper()
		return nil
	}
	if busy != "" {
		d.ctl.Unlock()
		if swapped {
			m.changed(d)
		}
		if onlyDeferred {
			return nil
		}
		return &DeviceError{Name: name, Err: &ArgError{Reason: busy, Errno: syscall.EBUSY}}
	}
	d.suspendLocked(false)
	d.destroy()
	d.RaiseEvent()
	d.ctl.Unlock()
	m.removed(d)
	return nil
}

// isRemoved reports whether the device was removed.
func (d *Device) isRemoved() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.removed
}

// destroy marks a device removed, destroys both tables and releases any held
// I/O (it then fails with ENXIO). The caller holds d.ctl and has taken d out
// of the manager's maps.
func (d *Device) destroy() {
	d.mu.Lock()
	d.mu.removed = true
	in := d.mu.inactive
	d.mu.inactive = nil
	d.mu.Unlock()
	d.retire(in)
	live := d.live.Swap(nil)
	d.gate.open()
	if live != nil {
		// Wait for I/O that entered before the swap to leave the table.
		d.gate.close()
		d.gate.open()
	}
	d.retire(live)
}

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

// openers counts the users of d outside the manager: the open handles of
// its file, less the exporter's own, plus the users of its block device.
func (m *Manager) openers(d *Device) int32 {
	n := d.opens.Load()
	if e := m.getExporter(); e != nil {
		users, own := e.Users(d)
		n += users - own
	}
	return max(n, 0)
}

// Busy says why d cannot be removed ("" if it can): another table stacks on
// it, or something has it open.
func (m *Manager) Busy(d *Device) string {
	switch {
	case d.holders.Load() > 0:
		return "device is in use by another table"
	case m.openers(d) > 0:
		return "device is open"
	}
	return ""
}

// drop takes d out of the manager's maps and destroys it; the caller holds
// d.ctl.
func (m *Manager) drop(d *Device) {
	m.mu.Lock()
	m.unlinkLocked(d)
	m.mu.Unlock()
	d.destroy()
}

// unlinkLocked takes d out of the manager's maps; the caller holds m.mu.
func (m *Manager) unlinkLocked(d *Device) {
	name := d.Name()
	if m.byName[name] == d {
		delete(m.byName, name)
	}
	if m.byMinor[d.minor] == d {
		delete(m.byMinor, d.minor)
	}
}
