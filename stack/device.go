package stack

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

// Device is one mapped device: a name, a minor, a live table that I/O uses
// and an inactive slot that load fills, a suspend gate and its own counters.
// Its I/O methods make it a BlockDevice, which is how devices stack
// in-process.
type Device struct {
	major uint32
	minor uint32
	ino   uint64
	disk  *stats.Disk

	live atomic.Pointer[Table]
	gate gate
	// noflush is set from the start of a `suspend --noflush` until resume:
	// I/O that a target pushes back (ErrPushBack) then waits for resume and
	// is issued again instead of failing.
	noflush atomic.Bool

	opens     atomic.Int32 // open file handles (fs)
	holders   atomic.Int32 // live or inactive tables of other devices that stack on this one
	events    atomic.Uint32
	readAhead atomic.Uint32 // sectors

	// ctl serialises control operations (load, clear, suspend, resume, rename,
	// remove) on this device; messages do not take it. It may be held while a
	// suspend drains I/O, so nothing on the I/O path or in the fs layer takes
	// it. The package documentation gives the lock order.
	ctl sync.Mutex
	// tmu makes retiring a table wait for readers of table contents (table,
	// status, info, messages): readers hold it shared while they use a table
	// pointer they loaded; retire takes it exclusively once, after the
	// pointer is gone, before closing the table. I/O does not take it: the
	// suspend gate already keeps I/O off a table that is swapped out.
	tmu sync.RWMutex

	// mu guards the fields in it; it is held only briefly, never while
	// waiting for I/O.
	mu struct {
		sync.Mutex
		name      string
		uuid      string
		readOnly  bool
		inactive  *Table
		suspended bool
		removed   bool
		// deferred is a pending deferred removal (remove --deferred of a
		// device in use): the device goes once its last user is gone.
		deferred bool
	}
	// ev wakes WaitEvent's callers when the event counter moves.
	ev eventWaiters
	// onChange is called after the live table or the name changed (fs
	// invalidates its caches); set by the manager.
	onChange func(*Device)
	// onEvent is called after the event counter moved (the manager's
	// global event); set by the manager.
	onEvent func()
}

var (
	_ BlockDevice = (*Device)(nil)
	_ Limiter     = (*Device)(nil)
)

// Name returns the device's current name.
func (d *Device) Name() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.name
}

// UUID returns the device's uuid ("" if none).
func (d *Device) UUID() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.uuid
}

// Major returns the device's major number, its manager's (Manager.Major).
func (d *Device) Major() uint32 { return d.major }

// Minor returns the device's minor number, decided at its creation.
func (d *Device) Minor() uint32 { return d.minor }

// DevNo returns the device's number as the kernel prints one: "MAJOR:MINOR".
func (d *Device) DevNo() string {
	return strconv.FormatUint(uint64(d.major), 10) + ":" + strconv.FormatUint(uint64(d.minor), 10)
}

// Ino is a number unique to this device for the daemon's lifetime.
func (d *Device) Ino() uint64 { return d.ino }

// Disk returns the device's I/O counters.
func (d *Device) Disk() *stats.Disk { return d.disk }

// ReadOnly reports whether the device refuses writes.
func (d *Device) ReadOnly() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.readOnly
}

// Live returns the live table, nil if there is none. Reading the contents of
// the table (Format, NumTargets, TargetAt) while control commands may run
// needs WithTables.
func (d *Device) Live() *Table { return d.live.Load() }

// WithTables calls f with the live and inactive tables (either may be nil)
// and guarantees that neither is closed until f returns. f must not call
// control operations of d.
func (d *Device) WithTables(f func(live, inactive *Table)) {
	d.tmu.RLock()
	defer d.tmu.RUnlock()
	f(d.live.Load(), d.Inactive())
}

// retire closes a table that is no longer reachable from d, once every
// reader that may still hold it (WithTables) is done.
func (d *Device) retire(t *Table) {
	if t == nil {
		return
	}
	d.tmu.Lock()
	//lint:ignore SA2001 an empty critical section is the barrier: it waits for readers of t.
	d.tmu.Unlock()
	t.Close()
}

// Size is the live table's size in bytes (0 without a table).
func (d *Device) Size() int64 {
	if t := d.live.Load(); t != nil {
		return t.size
	}
	return 0
}

// Limits says whether the device takes discards and write-zeroes: what its
// live table takes (none without one). A table stacked on the device reads
// it when it is built, as dm reads the queue limits of the devices below
// when it calculates a new table's limits.
func (d *Device) Limits() Limits {
	if t := d.live.Load(); t != nil {
		return t.limits
	}
	return Limits{}
}

// OpenCount is the number of open handles on the device file plus the
// tables that stack on it.
func (d *Device) OpenCount() int32 { return d.opens.Load() + d.holders.Load() }

// AddOpen adjusts the count of open handles (the fs layer calls it on open
// and release).
func (d *Device) AddOpen(n int32) { d.opens.Add(n) }

// DefaultReadAhead is a new device's read-ahead in sectors: the block
// layer's default for a new disk (VM_READAHEAD_PAGES, 128 KiB), which a dm
// device keeps until someone sets another.
const DefaultReadAhead = 256

// ReadAhead is the device's read-ahead in sectors, as BLKRAGET and
// /sys/block/dm-N/bdi/read_ahead_kb report it. dmfuse keeps it for the
// tools that set and read it (dmsetup --readahead, lvm's read_ahead); the
// kernel's read-ahead of the loop device a device is exported as is the
// loop device's own.
func (d *Device) ReadAhead() uint32 { return d.readAhead.Load() }

// SetReadAhead sets the read-ahead to sectors; with minimum (dmsetup's
// --readahead +N) only when that raises it. The kernel keeps read-ahead
// in pages (bdi->ra_pages): it rounds down to a multiple of 8 sectors.
func (d *Device) SetReadAhead(sectors uint32, minimum bool) {
	if minimum && d.readAhead.Load() >= sectors {
		return
	}
	d.readAhead.Store(sectors &^ 7)
}

// EventNr is the device's event counter.
func (d *Device) EventNr() uint32 { return d.events.Load() }

// RaiseEvent increments the event counter (a target's table event) and
// wakes WaitEvent's callers.
func (d *Device) RaiseEvent() {
	d.events.Add(1)
	d.ev.wake()
	if d.onEvent != nil {
		d.onEvent()
	}
}

// MappedDevice returns the mapped device bd is, when bd is one: a *Device,
// or what Ctor.Open returned for a device argument naming another mapped
// device of the same Manager. A target finds the live target of a device
// it stacks on this way (a thin table its pool: MappedDevice(dev), then
// Live().TargetAt(0)); it must not keep that target past its own Close,
// and must expect a different one after the device below is reloaded.
func MappedDevice(bd BlockDevice) (*Device, bool) {
	switch x := bd.(type) {
	case *Device:
		return x, true
	case interface{ mapped() *Device }:
		return x.mapped(), true
	}
	return nil, false
}

// Suspended reports whether the device is suspended.
func (d *Device) Suspended() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.suspended
}

// Inactive returns the inactive table, nil if there is none.
func (d *Device) Inactive() *Table {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.inactive
}

// enter admits one request through the gate and returns the live table.
func (d *Device) enter(ctx context.Context) (*Table, int, error) {
	i, err := d.gate.enter(ctx)
	if err != nil {
		return nil, 0, err
	}
	t := d.live.Load()
	if t == nil {
		d.gate.exit(i)
		return nil, 0, syscall.ENXIO
	}
	return t, i, nil
}

// readOnce is one pass of ReadAt through the gate and the live table.
func (d *Device) readOnce(ctx context.Context, p []byte, off int64) (int, error) {
	t, g, err := d.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer d.gate.exit(g)
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if off >= t.size {
		return 0, nil
	}
	if rem := t.size - off; int64(len(p)) > rem {
		p = p[:rem]
	}
	return t.rw(ctx, d.disk, ioop.Read, p, off)
}

// writeOnce is one pass of WriteAt through the gate and the live table.
func (d *Device) writeOnce(ctx context.Context, p []byte, off int64) (int, error) {
	t, g, err := d.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer d.gate.exit(g)
	if t.readOnly {
		return 0, syscall.EROFS
	}
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if off >= t.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, syscall.ENOSPC
	}
	if rem := t.size - off; int64(len(p)) > rem {
		p = p[:rem]
	}
	return t.rw(ctx, d.disk, ioop.Write, p, off)
}

// Flush sends an empty flush to every target (and so to every underlying
// device) and waits for it.
func (d *Device) Flush(ctx context.Context) error {
	for {
		err := d.flushOnce(ctx)
		if again, err := d.pushedBack(err); !again {
			return err
		}
	}
}

func (d *Device) flushOnce(ctx context.Context) error {
	t, g, err := d.enter(ctx)
	if err != nil {
		return err
	}
	defer d.gate.exit(g)
	return t.flush(ctx, d.disk)
}

// Discard discards [off, off+n), clipped to the device.
func (d *Device) Discard(ctx context.Context, off, n int64) error {
	return d.span(ctx, ioop.Discard, off, n)
}

// WriteZeroes zeroes [off, off+n), clipped to the device.
func (d *Device) WriteZeroes(ctx context.Context, off, n int64) error {
	return d.span(ctx, ioop.Zeroes, off, n)
}

func (d *Device) span(ctx context.Context, k ioop.Op, off, n int64) error {
	for {
		err := d.spanOnce(ctx, k, off, n)
		if again, err := d.pushedBack(err); !again {
			return err
		}
	}
}

// spanOnce is one pass of span. A discard or write-zeroes that is pushed
// back is issued again whole: both are idempotent.
func (d *Device) spanOnce(ctx context.Context, k ioop.Op, off, n int64) error {
	t, g, err := d.enter(ctx)
	if err != nil {
		return err
	}
	defer d.gate.exit(g)
	if t.readOnly {
		return syscall.EROFS
	}
	if off < 0 || n < 0 {
		return syscall.EINVAL
	}
	if off >= t.size {
		return nil
	}
	n = min(n, t.size-off)
	return t.span(ctx, d.disk, k, off, n)
}

// ReadAt reads from the device. A read that reaches past the end is short
// and one at or past the end reads nothing; neither is an error.
func (d *Device) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	done := 0
	for {
		n, err := d.readOnce(ctx, p[done:], off+int64(done))
		done += n
		if again, err := d.pushedBack(err); !again {
			return done, err
		}
	}
}

// WriteAt writes to the device. A write crossing the end is short; one
// starting at or past the end fails with ENOSPC; a read-only device gives EROFS.
func (d *Device) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	done := 0
	for {
		n, err := d.writeOnce(ctx, p[done:], off+int64(done))
		done += n
		if again, err := d.pushedBack(err); !again {
			return done, err
		}
	}
}

// pushedBack decides what becomes of an I/O whose piece a target pushed back
// (drivers/md/dm.c: dm_handle_requeue): during a noflush suspend it is issued
// again once the device resumes (again is true: the caller re-enters the gate,
// which holds it); otherwise the push-back turns into EIO. Other results pass
// unchanged.
func (d *Device) pushedBack(err error) (again bool, _ error) {
	if err == nil || !errors.Is(err, ErrPushBack) {
		return false, err
	}
	if d.noflush.Load() {
		return true, nil
	}
	return false, syscall.EIO
}
