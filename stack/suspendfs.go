package stack

// lockFS says whether a suspend with o freezes the file system on d, as
// drivers/md/dm.c: __dm_suspend does: only without noflush, with lockfs
// wanted, with a live table, when d is exported, and when d is not
// suspended already.
func (m *Manager) lockFS(d *Device, o Flags) Exporter {
	e := m.getExporter()
	if e == nil || o.NoFlush || o.NoLockFS || d.Live() == nil || d.Suspended() {
		return nil
	}
	return e
}

// Suspend suspends the device called name (Device.Suspend with o.NoFlush)
// and, unless o.NoLockFS or o.NoFlush, first freezes a file system mounted
// on its exported block device, which writes back its dirty data and stops
// new writers, as dm's lock_fs does. A failed freeze fails the suspend.
func (m *Manager) Suspend(name string, o Flags) error {
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	defer d.ctl.Unlock()
	if e := m.lockFS(d, o); e != nil {
		if err := e.Freeze(d); err != nil {
			return &DeviceError{Name: name, Err: err}
		}
	}
	d.suspendLocked(o.NoFlush)
	return nil
}

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
