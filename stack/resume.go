package stack

import "syscall"

// Resume resumes the device called name, making its inactive table live if
// there is one (Device.Resume). When it has to suspend first to make an
// inactive table live, it does so with o's flags, freezing the file system
// unless they say not to; once the device runs again, a file system frozen
// by a suspend is thawed (dm's unlock_fs), and a thaw that fails fails
// the resume (the device runs all the same).
func (m *Manager) Resume(name string, o Flags) error {
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	if d.Inactive() != nil && !d.Suspended() {
		if e := m.lockFS(d, o); e != nil {
			if err := e.Freeze(d); err != nil {
				d.ctl.Unlock()
				return &DeviceError{Name: name, Err: err}
			}
		}
		d.suspendLocked(o.NoFlush)
	}
	swapped, err := d.resumeLocked()
	running := !d.Suspended()
	d.ctl.Unlock()
	if swapped {
		m.changed(d)
	}
	if e := m.getExporter(); e != nil && running {
		if terr := e.Thaw(d); terr != nil && err == nil {
			err = terr
		}
	}
	if err != nil {
		return &DeviceError{Name: name, Err: err}
	}
	return nil
}

// Resume makes the inactive table live, if there is one (suspending first),
// runs the preresume and resume hooks and releases held I/O
// (drivers/md/dm-ioctl.c: do_resume). With no inactive table, resuming an
// active device is a no-op, and a suspended device with no live table gives
// EINVAL. If a preresume hook fails, the swap has already happened (as in dm):
// the new table is live and the device stays suspended.
func (d *Device) Resume() error {
	d.ctl.Lock()
	swapped, err := d.resumeLocked()
	d.ctl.Unlock()
	if swapped && d.onChange != nil {
		d.onChange(d)
	}
	return err
}

// resumeLocked resumes d; the caller holds d.ctl and, if swapped, tells the
// fs layer once it has released it.
func (d *Device) resumeLocked() (swapped bool, err error) {
	old, swapped := d.swapLocked()
	// The old table goes once the device runs again, as do_resume destroys
	// it after dm_resume.
	defer d.retire(old)
	if !d.Suspended() {
		return swapped, nil
	}
	t := d.live.Load()
	if t == nil || t.size == 0 {
		return swapped, &ArgError{Reason: "device has no table to resume", Errno: syscall.EINVAL}
	}
	for i := range t.segs {
		if h, ok := t.segs[i].target.(Preresumer); ok {
			if err := h.Preresume(); err != nil {
				return swapped, &TableError{Line: t.segs[i].line.N, Target: t.segs[i].typ.Name, Err: err}
			}
		}
	}
	for i := range t.segs {
		if h, ok := t.segs[i].target.(Resumer); ok {
			h.Resume()
		}
	}
	d.mu.Lock()
	d.mu.suspended = false
	d.mu.Unlock()
	d.noflush.Store(false)
	d.gate.open()
	return swapped, nil
}

// swapLocked makes the inactive table live, if there is one, suspending d
// first (dm_swap_table is legal only while suspended), and returns the old
// live table, which no I/O can be inside any more (the gate is closed and
// drained), for the caller to retire; swapped reports whether it swapped.
// The caller holds d.ctl.
func (d *Device) swapLocked() (old *Table, swapped bool) {
	in := d.Inactive()
	if in == nil {
		return nil, false
	}
	d.suspendLocked(false)
	old = d.live.Swap(in)
	d.mu.Lock()
	d.mu.inactive = nil
	d.mu.readOnly = in.readOnly
	d.mu.Unlock()
	return old, true
}
