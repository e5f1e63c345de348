package stack

// Exporter makes devices usable outside the daemon as block devices (the
// system daemon's loop devices). A Manager with one asks it for the block
// device a device is exported as, for
// the users of a device that its file does not show, for
// the device behind a block device a table names, and to freeze a file
// system mounted on a device that suspends, as drivers/md/dm.c: lock_fs
// does. Its methods may be called with a device's control lock held and
// must not call the Manager's control operations.
type Exporter interface {
	// Block returns the number of the block device d is exported as; ok is
	// false when d is not exported.
	Block(d *Device) (major, minor uint32, ok bool)
	// Users counts the users of d's block device (mounts, open file
	// descriptors, holders), which d's file does not see, and own, the
	// handles of d's file that the exporter holds itself.
	Users(d *Device) (users, own int32)
	// Lookup returns the device exported as block device major:minor, nil
	// if there is none.
	Lookup(major, minor uint32) *Device
	// Freeze freezes the file system mounted on d's block device (or syncs
	// the block device if none is mounted) before d suspends.
	Freeze(d *Device) error
	// Thaw thaws what Freeze froze, after d resumed, even if the file
	// system was unmounted in between; its error fails the resume.
	Thaw(d *Device) error
}

// SetExporter makes m consult e; call it before devices are used.
func (m *Manager) SetExporter(e Exporter) {
	m.mu.Lock()
	m.exporter = e
	m.mu.Unlock()
}

func (m *Manager) getExporter() Exporter {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exporter
}
