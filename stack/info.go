package stack

import "golang.org/x/sys/unix"

// Info is a snapshot of what `dmfuse info` prints about a device.
type Info struct {
	Name, UUID string
	Minor      uint32
	Suspended  bool
	ReadOnly   bool
	// DeferredRemove is a pending deferred removal.
	DeferredRemove bool
	// Live and Inactive report which table slots are filled.
	Live, Inactive bool
	// Targets counts the lines of the live table (with inactive: of the
	// inactive table).
	Targets   int
	OpenCount int32
	EventNr   uint32
	// ReadAhead is the read-ahead in sectors (Device.ReadAhead).
	ReadAhead uint32
	// Sectors is the live table's size.
	Sectors int64
}

// Info returns a consistent snapshot of the device's state. With inactive,
// Targets counts the inactive table's lines.
func (d *Device) Info(inactive bool) Info {
	var in Info
	d.WithTables(func(live, inact *Table) {
		d.mu.Lock()
		in = Info{Name: d.mu.name, UUID: d.mu.uuid, Minor: d.minor, Suspended: d.mu.suspended, ReadOnly: d.mu.readOnly,
			Live: live != nil, Inactive: inact != nil, OpenCount: d.OpenCount(), EventNr: d.EventNr(), ReadAhead: d.ReadAhead(), DeferredRemove: d.mu.deferred}
		d.mu.Unlock()
		t := live
		if inactive {
			t = inact
		}
		if t != nil {
			in.Targets = t.NumTargets()
		}
		if live != nil {
			in.Sectors = live.Sectors()
		}
	})
	return in
}

// FormatTable returns the live (or, with inactive, the inactive) table as
// `dmfuse table` (StatusTable) or `dmfuse status` (StatusInfo) print it; ""
// when the slot is empty.
func (d *Device) FormatTable(st StatusType, inactive bool) string {
	var out string
	d.WithTables(func(live, inact *Table) {
		t := live
		if inactive {
			t = inact
		}
		if t != nil {
			out = t.Format(st)
		}
	})
	return out
}

// DevNo returns the device number d reports: the manager's major and d's
// minor, fixed from its creation on.
func (m *Manager) DevNo(d *Device) (major, minor uint32) {
	return d.major, d.minor
}

// Exported returns the number of the block device d is exported as (the
// system daemon's loop device); ok is false when it is not.
func (m *Manager) Exported(d *Device) (major, minor uint32, ok bool) {
	if e := m.getExporter(); e != nil {
		return e.Block(d)
	}
	return 0, 0, false
}

// OpenCount is d's open count as dm reports it: the users of its file and
// block device plus the tables that stack on it.
func (m *Manager) OpenCount(d *Device) int32 {
	return m.openers(d) + d.holders.Load()
}

// FileOpenCount is OpenCount without the users of d's exported block
// device: the tables that stack on it and the handles of its file other
// than the block device's own. It costs two loads, where the block
// device's users take a look at every process's descriptors
// (milliseconds on a busy machine).
func (m *Manager) FileOpenCount(d *Device) int32 {
	n := d.opens.Load()
	if _, _, ok := m.Exported(d); ok {
		n-- // the loop device's handle
	}
	return max(n, 0) + d.holders.Load()
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
