package logwrites

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/stack"
)

// Type is the log-writes target type (dm-log-writes 1.1.0): every write
// to the data device is passed on and also recorded, with its data, on a log
// device in the kernel's format (format.go), together with flushes,
// FUA writes, discards and named marks, in the order that tells what a power
// loss could have left on the device. `dmfuse replay-log` and xfstests'
// replay-log read the log back.
var Type = &stack.TargetType{Name: "log-writes", Version: [3]int{1, 1, 0}, New: newLogWrites}

// logWritesMemLimit caps the bytes of copied write data a log-writes target
// holds before the worker has logged them (writes wait for the next flush).
// The kernel copies into pages until an allocation fails; past the cap a
// write fails with EIO and logging stops, as it does then
// (drivers/md/dm-log-writes.c: log_writes_map). It is a quarter of the
// machine's memory.
var logWritesMemLimit = func() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil || si.Totalram == 0 {
		return 1 << 30
	}
	return int64(si.Totalram) * int64(si.Unit) / 4
}()

// blockSizer is implemented by devices whose logical block size is not 512
// bytes. The log unit is the data device's logical block size
// (bdev_logical_block_size in log_writes_ctr); a device without the method
// has 512-byte blocks, as files and dmfuse devices do.
type blockSizer interface {
	LogicalBlockSize() int64
}

// logWrites is one constructed log-writes target.
type logWrites struct {
	dev, logdev stack.BlockDevice
	s           int64 // log unit: the data device's logical block size
	unit        int64 // s in 512-byte sectors
	logger      *log.Logger

	enabled atomic.Bool
	held    atomic.Int64 // bytes of block buffers not yet logged

	// memory is Ctor.Memory: the copies held until a flush are accounted
	// in the daemon's memory plan, in steps of memStep, so that a run
	// without flushes does not push the daemon's heap past its soft limit
	// (where the collector would run at every allocation). reserved is
	// what is accounted now; memMu serialises changing it.
	memory   func(int64)
	memMu    sync.Mutex
	reserved atomic.Int64
	// queued counts the blocks ever put on the logging list (under mu),
	// logged those the worker has logged or dropped: Status waits for the
	// worker to reach what was queued before it was called.
	queued, logged atomic.Uint64

	// mu guards the two lists (the kernel's blocks_lock). It is held only
	// to append to them or take them whole.
	mu        sync.Mutex
	unflushed []*pending // completed, not covered by a flush yet
	logging   []*pending // ready for the log, in order
	stopping  bool
	kick      chan struct{} // wakes the worker
	done      chan struct{} // closed when the worker has exited

	// next and end are the worker's, in 512-byte sectors of the log device;
	// nextSector and entries mirror what Status prints.
	next, end  int64
	super      []byte
	nextSector atomic.Int64
	entries    atomic.Uint64
}

// pending is one pending entry: a header unit and, for a write, its data
// right after it, so that the worker logs it with one write. A flush holds
// the unflushed blocks it took over when it was submitted.
type pending struct {
	flags       uint64
	sector, nr  uint64 // log units
	name        string // mark
	buf         []byte // header unit + data; len = s + data
	children    []*pending
	class       int
	accountable bool // buf counts in held
}

var (
	_ stack.Target       = (*logWrites)(nil)
	_ stack.Flusher      = (*logWrites)(nil)
	_ stack.Discarder    = (*logWrites)(nil)
	_ stack.DiscardOwner = (*logWrites)(nil)
	_ stack.Messager     = (*logWrites)(nil)
	_ stack.MapAccounter = (*logWrites)(nil)
)

// newLogWrites constructs a log-writes target. Table syntax:
//
//	<dev_path> <log_dev_path>
//
// Both are device arguments: files, block devices or other mapped devices.
// Arguments after the two are ignored, as in the kernel. Sector x of the
// segment is sector x of dev and is logged as sector x (in log units). The
// kernel does not subtract the segment's start (normal_map_bio only sets the
// device), so its log-writes maps sector X of the mapped device to sector X
// of dev; the two agree for the one line starting at 0 that log-writes is
// used with, and dmfuse maps every segment from the start of its devices, as
// for every target. dev must hold the segment's length; the log device
// takes entries until the next one would reach its last 512-byte sector,
// and logging stops there ("Ran out of space on the logdev"; status then
// ends in logging_disabled).
//
// Nothing is written to the log device until the first FUA write or mark:
// the super in log unit 0 is written after each of those, with the count of
// entries logged so far. Plain writes and discards are logged when a flush
// that was submitted after they completed completes; FUA writes and marks
// are logged at once; removing the table logs what is left, then the mark
// dm-log-writes-end, and waits until the log is written.
//
// Writes and discards must be aligned to the log unit (EINVAL otherwise),
// as the block layer guarantees for a block device. The target takes
// discards whatever dev takes (dm's discards_supported), and no
// write-zeroes: those become writes of zeros, logged with their data.
// Message: `mark <name>` (verb case-insensitive) queues a mark; the name is
// cut to S-33 bytes. Status: `<logged entries> <next log sector -
// 1>[ logging_disabled]`; table: `<dev> <log_dev>`.
func newLogWrites(c *stack.Ctor, args []string) (stack.Target, error) {
	if len(args) < 2 {
		return nil, stack.Errorf("Invalid argument count")
	}
	r, err := stack.OpenRemap(c, args[0], 0, c.Len)
	if err != nil {
		return nil, err
	}
	dev := r.Dev
	logdev, err := c.Open(args[1])
	if err != nil {
		return nil, logLookupError(err)
	}
	s := int64(stack.SectorSize)
	if bs, ok := dev.(blockSizer); ok {
		s = bs.LogicalBlockSize()
	}
	if s < MinSectorSize || s > MaxSectorSize || s&(s-1) != 0 {
		return nil, stack.Errorf("Device logical block size %d not supported", s)
	}
	l := &logWrites{
		dev: dev, logdev: logdev, s: s, unit: s / stack.SectorSize,
		logger: log.Default(),
		kick:   make(chan struct{}, 1), done: make(chan struct{}),
		super: make([]byte, s),
	}
	l.next = l.unit
	l.nextSector.Store(l.next)
	l.end = logdev.Size() / stack.SectorSize
	l.enabled.Store(true)
	l.memory = c.Memory
	go l.run()
	return l, nil
}

// memStep is the step in which held copies are accounted.
const memStep = 16 << 20

// account brings the reservation in the memory plan to what is held,
// rounded up to a step, with one step of room: called when held passes
// the reservation, and by the worker as it frees blocks.
func (l *logWrites) account() {
	if l.memory == nil {
		return
	}
	l.memMu.Lock()
	defer l.memMu.Unlock()
	want := (l.held.Load()/memStep + 2) * memStep
	if r := l.reserved.Load(); want > r || want < r-memStep {
		l.memory(want - r)
		l.reserved.Store(want)
	}
}

// logLookupError is lookupError for the log device, whose failed lookup
// the kernel reports as "Log device lookup failed".
func logLookupError(err error) error {
	var ae *stack.ArgError
	if !errors.As(stack.LookupError(err), &ae) {
		return err
	}
	reason, ok := strings.CutPrefix(ae.Reason, "Device lookup failed")
	if !ok {
		reason = ": " + ae.Reason
	}
	return &stack.ArgError{Reason: "Log device lookup failed" + reason, Errno: ae.Errno}
}

// AccountsAtMap marks that a write may be killed at map time (misaligned, or
// no memory left for its copy) and is then not counted.
func (l *logWrites) AccountsAtMap() {}

// OwnsDiscards marks that the target takes discards whatever its data
// device takes (log_writes_ctr sets discards_supported).
func (l *logWrites) OwnsDiscards() {}

func (l *logWrites) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	stack.StartAccounting(ctx)
	return l.dev.ReadAt(ctx, p, off)
}

// WriteAt copies the data (the caller's buffer is not kept), passes the
// write on, and queues the copy when it completes, whatever its result
// (drivers/md/dm-log-writes.c: log_writes_map, normal_end_io): a FUA write
// goes straight to the log, any other waits on the unflushed list.
func (l *logWrites) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if len(p) == 0 || !l.enabled.Load() {
		stack.StartAccounting(ctx)
		return l.dev.WriteAt(ctx, p, off)
	}
	if off%l.s != 0 || int64(len(p))%l.s != 0 {
		return 0, syscall.EINVAL
	}
	b := l.getBlock(len(p), true)
	if b == nil {
		return 0, syscall.EIO
	}
	b.sector, b.nr = uint64(off/l.s), uint64(int64(len(p))/l.s)
	if stack.FUA(ctx) {
		b.flags = FlagFUA
	}
	copy(b.buf[l.s:], p)
	stack.StartAccounting(ctx)
	n, err := l.dev.WriteAt(ctx, p, off)
	l.endIO(b)
	return n, err
}

// Flush takes over the unflushed list when it is submitted, passes the flush
// on, and then queues those blocks and a FLUSH entry. Writes that complete
// while the flush is under way wait for the next one.
func (l *logWrites) Flush(ctx context.Context) error {
	if !l.enabled.Load() {
		return l.dev.Flush(ctx)
	}
	b := l.getBlock(0, false)
	b.flags = FlagFlush
	l.mu.Lock()
	b.children, l.unflushed = l.unflushed, b.children
	l.mu.Unlock()
	err := l.dev.Flush(ctx)
	l.mu.Lock()
	l.queued.Add(uint64(len(b.children)) + 1)
	l.logging = append(l.logging, b.children...)
	clear(b.children)
	b.children = b.children[:0]
	// Once b is on the list the worker may log and recycle it at any time.
	l.logging = append(l.logging, b)
	l.mu.Unlock()
	l.wake()
	return err
}

// Discard passes the discard on, unless the data device takes none (then
// the target completes it itself, as log_writes_map does when
// device_supports_discard is off), and queues a DISCARD entry on the
// unflushed list, as writes are.
func (l *logWrites) Discard(ctx context.Context, off, n int64) error {
	if n == 0 || !l.enabled.Load() {
		stack.StartAccounting(ctx)
		return l.discard(ctx, off, n)
	}
	if off%l.s != 0 || n%l.s != 0 {
		return syscall.EINVAL
	}
	b := l.getBlock(0, false)
	b.flags = FlagDiscard
	b.sector, b.nr = uint64(off/l.s), uint64(n/l.s)
	stack.StartAccounting(ctx)
	err := l.discard(ctx, off, n)
	l.endIO(b)
	return err
}

func (l *logWrites) discard(ctx context.Context, off, n int64) error {
	if !stack.LimitsOf(l.dev).Discard {
		return nil
	}
	return l.dev.Discard(ctx, off, n)
}

// Message implements `mark <name>`.
func (l *logWrites) Message(_ context.Context, args []string) (string, error) {
	if len(args) != 2 {
		return "", &stack.ArgError{Reason: fmt.Sprintf("Invalid log-writes message arguments, expect 2 arguments, got %d", len(args)), Errno: syscall.EINVAL}
	}
	if !strings.EqualFold(args[0], "mark") {
		return "", &stack.ArgError{Reason: "Unrecognised log writes target message received: " + args[0], Errno: syscall.EINVAL}
	}
	l.mark(args[1])
	return "", nil
}

// mark queues a mark; it does not wait for any I/O. As kstrndup does, the
// name ends at its first zero byte and is cut to S-33 bytes.
func (l *logWrites) mark(name string) {
	if i := strings.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	if m := MaxMarkLen(int(l.s)); len(name) > m {
		name = name[:m]
	}
	b := l.getBlock(0, false)
	b.flags, b.name = FlagMark, name
	l.mu.Lock()
	l.queued.Add(1)
	l.logging = append(l.logging, b)
	l.mu.Unlock()
	l.wake()
}

// logWritesStatusWait bounds how long Status waits for the worker.
const logWritesStatusWait = time.Second

// Status prints the table line, or the count of logged entries and the last
// log sector in use (log_writes_status). The kernel prints the counters as
// its worker has left them; Status first waits until the worker has logged
// what was queued before the call (at most logWritesStatusWait, in case the
// log device does not answer), so that status after a flush or a mark
// shows them.
func (l *logWrites) Status(t stack.StatusType) string {
	if t == stack.StatusTable {
		return stack.EscapeArg(l.dev.Name()) + " " + stack.EscapeArg(l.logdev.Name())
	}
	want := l.queued.Load()
	for start := time.Now(); l.logged.Load() < want && time.Since(start) < logWritesStatusWait; {
		time.Sleep(20 * time.Microsecond)
	}
	s := fmt.Sprintf("%d %d", l.entries.Load(), l.nextSector.Load()-1)
	if !l.enabled.Load() {
		s += " logging_disabled"
	}
	return s
}

// Close queues the unflushed blocks and the end mark and returns once the
// worker has logged them (drivers/md/dm-log-writes.c: log_writes_dtr).
func (l *logWrites) Close() error {
	end := l.getBlock(0, false)
	end.flags, end.name = FlagMark, EndMark
	l.mu.Lock()
	l.queued.Add(uint64(len(l.unflushed)) + 1)
	l.logging = append(l.logging, l.unflushed...)
	l.logging = append(l.logging, end)
	l.unflushed = nil
	l.stopping = true
	l.mu.Unlock()
	l.wake()
	<-l.done
	if l.memory != nil {
		l.memMu.Lock()
		l.memory(-l.reserved.Swap(0))
		l.memMu.Unlock()
	}
	return nil
}

// endIO queues a completed write or discard: a FUA write for the log at
// once, anything else on the unflushed list.
func (l *logWrites) endIO(b *pending) {
	l.mu.Lock()
	if b.flags&FlagFUA != 0 {
		l.queued.Add(1)
		l.logging = append(l.logging, b)
		l.mu.Unlock()
		l.wake()
		return
	}
	l.unflushed = append(l.unflushed, b)
	l.mu.Unlock()
}

func (l *logWrites) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// run is the worker: it takes the logging list whole, in order, and logs
// each block (drivers/md/dm-log-writes.c: log_writes_kthread). It exits once
// Close has asked it to and the list is empty.
func (l *logWrites) run() {
	defer close(l.done)
	var batch []*pending
	for {
		l.mu.Lock()
		batch, l.logging = l.logging, batch[:0]
		stop := l.stopping
		l.mu.Unlock()
		if len(batch) == 0 {
			if stop {
				return
			}
			<-l.kick
			continue
		}
		for i, b := range batch {
			l.logOne(b)
			batch[i] = nil
		}
		if l.reserved.Load() > memStep*2 {
			l.account()
		}
	}
}

// logCtx is the context of the worker's writes to the log device: they are
// not ended by anything but their completion.
var logCtx = context.Background()

// logOne places one block at the next free position of the log, writes its
// header and data with one write, and rewrites the super after a FUA or a
// mark entry (log_one_block, log_super). The position advances even for the
// block that does not fit, as the kernel's next_sector does.
func (l *logWrites) logOne(b *pending) {
	defer func() {
		l.putBlock(b)
		l.logged.Add(1)
	}()
	if !l.enabled.Load() {
		return
	}
	pos := l.next
	l.next += l.unit
	if b.flags&FlagDiscard == 0 {
		l.next += int64(b.nr) * l.unit
	}
	l.nextSector.Store(l.next)
	if l.end == 0 {
		l.end = l.logdev.Size() / stack.SectorSize
	}
	if l.end != 0 && l.next >= l.end {
		l.logger.Printf("log-writes: Ran out of space on the logdev")
		l.enabled.Store(false)
		return
	}
	n := l.entries.Add(1)
	PutHeader(b.buf[:l.s], Header{Sector: b.sector, NrSectors: b.nr, Flags: b.flags, DataLen: uint64(len(b.name))}, b.name)
	if _, err := l.logdev.WriteAt(logCtx, b.buf, pos*stack.SectorSize); err != nil {
		l.logger.Printf("log-writes: Error writing log block, error=%v", err)
		l.enabled.Store(false)
		return
	}
	if b.flags&(FlagFUA|FlagMark) != 0 {
		PutSuper(l.super, Super{Magic: Magic, Version: Version, NrEntries: n, SectorSize: uint32(l.s)})
		if _, err := l.logdev.WriteAt(logCtx, l.super, 0); err != nil {
			l.logger.Printf("log-writes: Error writing log block, error=%v", err)
			l.enabled.Store(false)
		}
	}
}

// Block buffers come from pools by size class (512 bytes each), so that a
// write costs one pool get for its copy instead of an allocation.
const (
	classSize  = 512
	maxPooled  = 1<<20 + 64<<10
	numClasses = maxPooled/classSize + 1
)

var pools [numClasses]sync.Pool

// getBlock returns a block whose buf holds one log unit and n bytes of data.
// A block that counts against logWritesMemLimit (a write's copy) is refused
// past the limit: it returns nil and logging stops.
func (l *logWrites) getBlock(n int, accountable bool) *pending {
	size := int(l.s) + n
	if accountable {
		held := l.held.Add(int64(size))
		if held > logWritesMemLimit {
			l.held.Add(-int64(size))
			l.logger.Printf("log-writes: Error allocating pending block: %d bytes held for the log", l.held.Load())
			l.enabled.Store(false)
			return nil
		}
		if held > l.reserved.Load()-memStep {
			l.account()
		}
	}
	class := (size + classSize - 1) / classSize
	var b *pending
	if class < numClasses {
		if v := pools[class].Get(); v != nil {
			b = v.(*pending)
		} else {
			b = &pending{class: class, buf: make([]byte, class*classSize)}
		}
	} else {
		b = &pending{class: -1, buf: make([]byte, size)}
	}
	b.buf = b.buf[:size]
	b.accountable = accountable
	return b
}

// putBlock returns b to its pool.
func (l *logWrites) putBlock(b *pending) {
	if b.accountable {
		l.held.Add(-int64(len(b.buf)))
	}
	b.flags, b.sector, b.nr, b.name, b.accountable = 0, 0, 0, "", false
	if b.class >= 0 {
		b.buf = b.buf[:cap(b.buf)]
		pools[b.class].Put(b)
	}
}
