package stack

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// SectorSize is the size of a device-mapper sector in bytes. Every start, length
// and offset in table text is in sectors; inside dmfuse offsets are bytes.
const SectorSize = 512

// StatusType selects which form of its status a target returns.
type StatusType int

const (
	// StatusInfo is the form printed by `dmfuse status` (dm's STATUSTYPE_INFO).
	StatusInfo StatusType = iota
	// StatusTable is the form printed by `dmfuse table` (dm's STATUSTYPE_TABLE);
	// it must be accepted back by the target's constructor.
	StatusTable
	// StatusInfoNoFlush asks a table (Table.Format, Device.FormatTable) for
	// the INFO form without the work a target does first (dm's
	// DM_STATUS_NOFLUSH_FLAG, `dmsetup status --noflush`): a
	// NoFlushStatuser answers StatusNoFlush, any other target
	// Status(StatusInfo). A target's Status never receives it.
	StatusInfoNoFlush
)

// Target is one constructed table line. Offsets are bytes relative to the start
// of the target's segment, and the table never hands a target a range that
// crosses the segment's end or the target's MaxIO boundary. Every method may be
// called concurrently, as with io.ReaderAt.
//
// A method returns the number of bytes transferred and an error; a short count
// without an error is not allowed. Errors should wrap a syscall.Errno (EIO, ...).
//
// Durability follows the block layer's contract for a device with a volatile
// write cache. A completed write need not be on stable media until a flush
// (Flusher) that was issued after it completes. A write whose ctx carries the
// FUA mark (FUA(ctx), set with WithFUA; the kernel's REQ_FUA) must be on
// stable media when WriteAt returns, but says nothing about earlier writes. A
// target that remaps I/O passes ctx down unchanged with every write, so the
// mark reaches the underlying device (a backing file then writes with
// RWF_DSYNC); a target that caches writes (powercut) writes a marked write
// through. The fs layer marks the writes that FUSE sends with O_DSYNC in
// fuse_write_in.flags: writes to a device file opened with O_DSYNC or
// O_SYNC, and pwritev2 with RWF_DSYNC or RWF_SYNC (fs/fuse/file.c:
// fuse_write_flags; a FOPEN_DIRECT_IO file gets no FSYNC after them). A file
// system on a loop device sends no FUA: loop advertises a write cache but no
// FUA, so the block layer turns a REQ_FUA write into the write followed by a
// flush (block/blk-flush.c: blk_flush_policy), which reaches dmfuse as FSYNC.
type Target interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	// Status returns the target's parameter string without the
	// "<start> <len> <type> " prefix.
	Status(t StatusType) string
	// Close releases what the constructor acquired, other than the devices
	// opened through Ctor.Open, which the table owns.
	Close() error
}

// Flusher is implemented by targets that pass flushes (fsync) down. A target
// without it completes a flush at once with success (dm sends no flush to zero
// and error). When Flush returns nil, every write that completed before it was
// called is on stable media.
type Flusher interface {
	Flush(ctx context.Context) error
}

// fuaKey is the context key of the FUA mark.
type fuaKey struct{}

// fuaBackground is WithFUA(context.Background()), built once: the fs layer
// marks its writes without an allocation per write.
var fuaBackground = context.WithValue(context.Background(), fuaKey{}, true)

// WithFUA returns ctx with the FUA mark (the kernel's REQ_FUA): a write made
// with it must be on stable media before it completes. Targets read the mark
// with FUA and pass ctx on unchanged; see Target.
func WithFUA(ctx context.Context) context.Context {
	if ctx == context.Background() {
		return fuaBackground
	}
	if FUA(ctx) {
		return ctx
	}
	return context.WithValue(ctx, fuaKey{}, true)
}

// FUA reports whether ctx carries the FUA mark of WithFUA.
func FUA(ctx context.Context) bool {
	v, _ := ctx.Value(fuaKey{}).(bool)
	return v
}

// Discarder is implemented by targets that take discards (fallocate
// PUNCH_HOLE), as dm targets that set num_discard_bios. A table takes
// discards only if every target does and, unless it is a DiscardOwner,
// every device the target opened through Ctor.Open does too
// (drivers/md/dm-table.c: dm_table_supports_discards). On a table that does
// not, a discard fails with EOPNOTSUPP before any target sees it.
type Discarder interface {
	Discard(ctx context.Context, off, n int64) error
}

// DiscardOwner is implemented by Discarders that complete discards
// themselves whatever their devices take (dm's discards_supported): zero
// drops them, error fails them.
type DiscardOwner interface {
	OwnsDiscards()
}

// ZeroWriter is implemented by targets that take write-zeroes (fallocate
// ZERO_RANGE), as dm targets that set num_write_zeroes_bios. A table takes
// write-zeroes only if every target does and every device the target opened
// through Ctor.Open does too (drivers/md/dm-table.c:
// dm_table_supports_write_zeroes). On a table that does not, the device
// writes zeros through WriteAt instead (block/blk-lib.c:
// blkdev_issue_zeroout falls back to blkdev_issue_zero_pages).
type ZeroWriter interface {
	WriteZeroes(ctx context.Context, off, n int64) error
}

// Messager is implemented by targets that take messages (`dmfuse message`).
// A target without it answers "Target type does not support messages" (EINVAL).
type Messager interface {
	Message(ctx context.Context, args []string) (string, error)
}

// NoFlushStatuser is implemented by targets whose INFO status does work
// first that a status request with noflush skips (the status_flags
// DM_STATUS_NOFLUSH_FLAG of dm's status hook): thin-pool commits its
// metadata (pool_status). StatusNoFlush returns the StatusInfo form without
// that work. Without it, the flag is ignored, as by every kernel target that
// does nothing first.
type NoFlushStatuser interface {
	StatusNoFlush() string
}

// Presuspender is implemented by targets with a presuspend hook (dm-delay
// releases its queue there). noflush is true for `suspend --noflush`.
type Presuspender interface {
	Presuspend(noflush bool)
}

// Postsuspender is implemented by targets with a postsuspend hook.
type Postsuspender interface {
	Postsuspend()
}

// Preresumer is implemented by targets whose preresume hook may refuse the resume.
type Preresumer interface {
	Preresume() error
}

// Resumer is implemented by targets with a resume hook.
type Resumer interface {
	Resume()
}

// MaxIOer is implemented by targets whose I/O the core must split, like dm's
// max_io_len: no piece handed to the target crosses a multiple of MaxIO()
// bytes, counted from the start of the segment (striped: one chunk; dust: one
// block).
type MaxIOer interface {
	MaxIO() int64
}

// MapAccounter is implemented by targets that decide, at map time, whether an
// I/O is passed on or killed (error, flakey, dust, delay, multipath). For such
// a target the device does not start accounting before calling it; the target
// calls StartAccounting(ctx) when it passes the piece on or completes it
// itself. A piece that returns an error without accounting started was killed
// at map time and is not counted at all (drivers/md/dm.c: __map_bio on
// DM_MAPIO_KILL); one that succeeds without it is counted at completion.
type MapAccounter interface {
	AccountsAtMap()
}

// BlockDevice is an underlying device: a backing file, a block device or
// another mapped device of the same daemon. Offsets and sizes are bytes.
type BlockDevice interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
	Discard(ctx context.Context, off, n int64) error
	WriteZeroes(ctx context.Context, off, n int64) error
	// Size is the device's size in bytes.
	Size() int64
	// Name is how table and status print the device: a mapped device's
	// name, a file's absolute path, or MAJOR:MINOR. Targets print it
	// through EscapeArg.
	Name() string
}

// Limits says which optional operations an underlying device takes, as a
// block device's queue limits do (a max_discard_sectors or
// max_write_zeroes_sectors of 0 means no).
type Limits struct {
	Discard, WriteZeroes bool
}

// Limiter is implemented by BlockDevices that may not take discards or
// write-zeroes. A device without it takes both.
type Limiter interface {
	Limits() Limits
}

// LimitsOf returns the limits of dev: its Limits if it is a Limiter, else
// both discards and write-zeroes, as for a device without the method. A
// target that decides per device whether to pass a discard on reads it here.
func LimitsOf(dev BlockDevice) Limits {
	if l, ok := dev.(Limiter); ok {
		return l.Limits()
	}
	return Limits{Discard: true, WriteZeroes: true}
}

// Ctor is what a target constructor gets besides its arguments.
type Ctor struct {
	// Begin and Len are the segment's start and length in sectors.
	Begin, Len int64
	// ReadOnly is set for tables of read-only devices.
	ReadOnly bool
	// Clock is the daemon's monotonic clock.
	Clock Clock
	// Open resolves a device argument (a mapped device's name, MAJOR:MINOR
	// or a file's path), as dm_get_device does. The table owns what it
	// returns, lists it and closes it with the table.
	Open func(arg string) (BlockDevice, error)
	// Context is the daemon's long-lived context, for constructors that start
	// goroutines.
	Context context.Context
	// Event raises a table event on the device (its event counter goes up).
	Event func()
	// Device is the mapped device the table is being built for: the
	// identity a target needs when it must tell its own device from the
	// devices it opens (a thin device and its pool). It is nil for a table
	// built outside a Manager (Build without BuildOptions.Device). A
	// constructor must not do I/O to it: it has no live table of this
	// one's yet, and its control lock is held.
	Device *Device
	// Memory, when set, accounts n more bytes (negative: n fewer) that a
	// target holds in the daemon's memory for as long as it lives, beyond
	// what requests in flight hold: the daemon's memory plan makes room for
	// them (dmfuse mount raises its soft memory limit). A target that
	// keeps data in memory calls it from its constructor, once it cannot
	// fail, and gives the bytes back in Close.
	Memory func(n int64)
	// Shared holds the objects the targets of the Manager share (nil when
	// the table is built without a Manager: nothing is shared).
	Shared *SharedSet
}

// Clock returns monotonic nanoseconds (clock.Clock). Targets whose behaviour
// depends on time take it from Ctor.Clock so that tests can drive them with a
// manual clock.
type Clock = clock.Clock

// TargetType describes one target type: its name, version and constructor.
type TargetType struct {
	Name    string
	Version [3]int
	// Singleton types must be alone in a table; Immutable types cannot be
	// mixed with other types and cannot be replaced by another type on reload
	// (except by a Wildcard type). Multipath is both; error is Wildcard.
	Singleton, Immutable, Wildcard bool
	// New constructs a target from its arguments. Errors are *ArgError or
	// plain errors carrying the reason in dm's words.
	New func(c *Ctor, args []string) (Target, error)
}

// ArgError is a constructor failure: the reason, in dm's words (ti->error),
// and the errno the kernel would return (EINVAL when zero).
type ArgError struct {
	Reason string
	Errno  syscall.Errno
}

func (e *ArgError) Error() string { return e.Reason }

// Unwrap returns the errno.
func (e *ArgError) Unwrap() error {
	if e.Errno == 0 {
		return syscall.EINVAL
	}
	return e.Errno
}

// Errorf returns an *ArgError with a formatted reason and errno EINVAL.
func Errorf(format string, a ...any) error {
	return &ArgError{Reason: fmt.Sprintf(format, a...)}
}

// Registry is a set of target types by name.
type Registry struct {
	mu    sync.RWMutex
	types map[string]*TargetType
}

// NewRegistry returns a registry holding the given types; a duplicate name is
// an error.
func NewRegistry(types ...*TargetType) (*Registry, error) {
	r := &Registry{types: make(map[string]*TargetType)}
	for _, t := range types {
		if err := r.Register(t); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Register adds a type; a second type of the same name is refused (EEXIST).
func (r *Registry) Register(t *TargetType) error {
	if t.Name == "" || len(t.Name) > 15 {
		return fmt.Errorf("target type name %q: must be 1 to 15 bytes", t.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.types[t.Name]; ok {
		return fmt.Errorf("target type %q: %w", t.Name, syscall.EEXIST)
	}
	r.types[t.Name] = t
	return nil
}

// Lookup finds a type by name.
func (r *Registry) Lookup(name string) (*TargetType, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.types[name]
	return t, ok
}

// Types returns every registered type, sorted by name.
func (r *Registry) Types() []*TargetType {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*TargetType, 0, len(r.types))
	for _, t := range r.types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FormatVersion prints a type as `dmsetup targets` does.
func (t *TargetType) FormatVersion() string {
	return fmt.Sprintf("%-16s v%d.%d.%d", t.Name, t.Version[0], t.Version[1], t.Version[2])
}

// EventLogger is implemented by targets that keep a log of what they did to
// the I/O (the fault target's injected faults). The fs layer serves it as
// MOUNTPOINT/stats/NAME/events: AppendEvents appends the log's text.
type EventLogger interface {
	AppendEvents(b []byte) []byte
}
