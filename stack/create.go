package stack

import (
	"fmt"
	"syscall"

	"github.com/dmfuse/dmfuse/stats"
)

// CreateOptions describes a device to create.
type CreateOptions struct {
	// Name and UUID must pass ValidName and ValidUUID.
	Name, UUID string
	// Minor is the minor to use; negative picks the lowest free one.
	Minor    int
	ReadOnly bool
	// Table is the table text; empty with NoTable creates a device without one.
	Table   string
	NoTable bool
	// Dir is the folder relative device paths are resolved against.
	Dir string
}

// Create makes a device and, unless NoTable, loads and resumes its table,
// as dmsetup create does with DM_DEV_CREATE, DM_TABLE_LOAD and
// DM_DEV_SUSPEND. It is all-or-nothing: on any failure nothing is left
// behind.
func (m *Manager) Create(o CreateOptions) (*Device, error) {
	d, err := m.add(o)
	if err != nil {
		return nil, &DeviceError{Name: o.Name, Err: err}
	}
	// d.ctl is held from add on: nobody can run a control operation on d
	// before its table is live.
	if !o.NoTable {
		err = m.load(d, o.Table, o.Dir)
		if err == nil {
			_, err = d.resumeLocked()
		}
		if err != nil {
			m.drop(d)
			d.ctl.Unlock()
			return nil, &DeviceError{Name: o.Name, Err: err}
		}
	}
	d.ctl.Unlock()
	m.raiseGlobal()
	if !o.NoTable {
		m.changed(d)
	}
	return d, nil
}

// add makes a device of o's name, uuid and minor (the lowest free one when
// o.Minor is negative), refusing names, uuids and minors in use (EBUSY), and
// enters it in the manager's maps with its control lock held.
func (m *Manager) add(o CreateOptions) (*Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byName[o.Name]; ok {
		return nil, &ArgError{Reason: "device already exists", Errno: syscall.EBUSY}
	}
	if o.UUID != "" {
		for _, d := range m.byName {
			if d.UUID() == o.UUID {
				return nil, &ArgError{Reason: "uuid " + o.UUID + " already in use", Errno: syscall.EBUSY}
			}
		}
	}
	minor := uint32(0)
	if o.Minor >= 0 {
		minor = uint32(o.Minor)
		if _, ok := m.byMinor[minor]; ok {
			return nil, &ArgError{Reason: fmt.Sprintf("minor %d already in use", minor), Errno: syscall.EBUSY}
		}
	} else {
		for m.byMinor[minor] != nil {
			minor++
		}
	}
	m.nextIno++
	d := newDevice(o.Name, o.UUID, m.major, minor, m.nextIno, o.ReadOnly, m.clock)
	d.onChange = m.changed
	d.onEvent = m.raiseGlobal
	d.ctl.Lock()
	m.byName[o.Name] = d
	m.byMinor[minor] = d
	return d, nil
}

func newDevice(name, uuid string, major, minor uint32, ino uint64, readOnly bool, clock Clock) *Device {
	d := &Device{major: major, minor: minor, ino: ino, disk: stats.NewDisk(clock)}
	d.gate.init()
	d.readAhead.Store(DefaultReadAhead)
	d.mu.name, d.mu.uuid, d.mu.readOnly = name, uuid, readOnly
	return d
}
