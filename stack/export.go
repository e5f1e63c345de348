package stack

import (
	"golang.org/x/sys/unix"
)

// Exporter makes devices usable outside the daemon as block devices (the
// system daemon's loop devices). A Manager with one asks it for the numbers
// devices report, for the users of a device that its file does not show, for
// the device behind a block device a table names, and to freeze a file
// system mounted on a device that suspends, as drivers/md/dm.c: lock_fs
// does. Its methods may be called with a device's control lock held and
// must not call the Manager's control operations.
type Exporter interface {
	// DevNo returns the number of the block device d is exported as; ok is
	// false when d is not exported.
	DevNo(d *Device) (major, minor uint32, ok bool)
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

// DevNo returns the device number d reports: its exported block device's,
// else Major and its minor.
func (m *Manager) DevNo(d *Device) (major, minor uint32) {
	if e := m.getExporter(); e != nil {
		if maj, min, ok := e.DevNo(d); ok {
			return maj, min
		}
	}
	return Major, d.minor
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

// OpenCount is d's open count as dm reports it: the users of its file and
// block device plus the tables that stack on it.
func (m *Manager) OpenCount(d *Device) int32 {
	return m.openers(d) + d.holders.Load()
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

// exported returns the device exported as the block device at path or of
// number major:minor, nil if none.
func (m *Manager) exportedAt(path string) *Device {
	e := m.getExporter()
	if e == nil {
		return nil
	}
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	return e.Lookup(unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// Dep is one device a table uses, as `dmsetup deps` lists it.
type Dep struct {
	// Mapped is the device when it is one of the manager's.
	Mapped *Device
	// Major and Minor are a block device's number (zero for a regular file).
	Major, Minor uint32
	// Block reports a block device (Major and Minor are set).
	Block bool
	// Path is how the table names a file or block device.
	Path string
}

// Deps lists the devices d's live (or inactive) table uses, in the order the
// kernel keeps them: each device once, the one first named last
// (drivers/md/dm-table.c: dm_get_device adds new devices at the head).
func (m *Manager) Deps(d *Device, inactive bool) []Dep {
	var out []Dep
	d.WithTables(func(live, inact *Table) {
		t := live
		if inactive {
			t = inact
		}
		if t == nil {
			return
		}
		seen := map[any]bool{}
		for _, bd := range t.devs {
			var dep Dep
			var key any
			switch x := bd.(type) {
			case interface{ mapped() *Device }:
				dep.Mapped = x.mapped()
				key = dep.Mapped
			case *fileDev:
				dep.Path, dep.Block = x.name, x.block
				if x.block {
					dep.Major, dep.Minor = unix.Major(x.rdev), unix.Minor(x.rdev)
					key = x.rdev
				} else {
					key = x.name
				}
			default:
				dep.Path = bd.Name()
				key = bd
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			out = append([]Dep{dep}, out...)
		}
	})
	return out
}

// Types returns the target type of each line of t, in order.
func (t *Table) Types() []string {
	out := make([]string, len(t.segs))
	for i := range t.segs {
		out[i] = t.segs[i].typ.Name
	}
	return out
}
