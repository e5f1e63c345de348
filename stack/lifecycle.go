package stack

import (
	"syscall"
)

// The device lifecycle follows device-mapper (drivers/md/dm-ioctl.c: do_resume;
// drivers/md/dm.c: __dm_suspend, dm_resume). Every operation here takes the
// device's control lock, so that control operations on one device run one at a
// time while I/O keeps flowing through the gate. Hooks that reach the fs layer
// (onChange) run after the lock is released.

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

// Load puts t in the inactive slot, destroying any table there before. Live
// I/O is not affected.
func (d *Device) Load(t *Table) {
	d.ctl.Lock()
	defer d.ctl.Unlock()
	d.loadLocked(t)
}

// loadLocked fills the inactive slot; the caller holds d.ctl.
func (d *Device) loadLocked(t *Table) {
	d.mu.Lock()
	old := d.mu.inactive
	d.mu.inactive = t
	d.mu.Unlock()
	d.retire(old)
}

// Clear destroys the inactive table, if any.
func (d *Device) Clear() {
	d.Load(nil)
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
	if in := d.Inactive(); in != nil {
		d.suspendLocked(false)
		old := d.live.Swap(in)
		d.mu.Lock()
		d.mu.inactive = nil
		d.mu.readOnly = in.readOnly
		d.mu.Unlock()
		swapped = true
		// No I/O can be inside the old table: the gate is closed and drained.
		defer d.retire(old)
	}
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
			Live: live != nil, Inactive: inact != nil, OpenCount: d.OpenCount(), EventNr: d.EventNr(), DeferredRemove: d.mu.deferred}
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
