package stack

// The device lifecycle follows device-mapper (drivers/md/dm-ioctl.c:
// do_suspend, do_resume; drivers/md/dm.c: __dm_suspend, dm_resume). Each verb
// has its file: create.go, load.go (load and clear), suspend.go, resume.go,
// remove.go (remove, remove_all, deferred removal), rename.go (rename and
// set-uuid), message.go, wait.go, info.go (info, table, status, deps), and
// resolve.go resolves the device arguments of tables. Every verb takes the
// device's control lock, so that control operations on one device run one at
// a time while I/O keeps flowing through the gate. Hooks that reach the fs
// layer (the listeners) run after the lock is released.

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

// Suspend holds new I/O at the gate and waits for the I/O already mapped
// (drivers/md/dm.c: __dm_suspend): presuspend hooks first (delay releases its
// queue), then the gate closes and drains, then postsuspend hooks. With noflush
// the targets are told (presuspend) so that they keep queued I/O queued instead
// of failing it. Suspending a suspended device is a successful no-op.
func (d *Device) Suspend(noflush bool) error {
	d.ctl.Lock()
	defer d.ctl.Unlock()
	d.suspendLocked(noflush)
	return nil
}

// suspendLocked suspends d; the caller holds d.ctl.
func (d *Device) suspendLocked(noflush bool) {
	if d.Suspended() {
		return
	}
	if noflush {
		// Hold new I/O before the presuspend hooks run, so that I/O a
		// target pushes back from them waits at the gate for resume.
		d.noflush.Store(true)
		d.gate.block()
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
	d.mu.Lock()
	d.mu.suspended = true
	d.mu.Unlock()
}
