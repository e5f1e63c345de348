package powercut

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
)

// Type is the powercut target type: a disk with a volatile write cache
// that a message switches off, losing exactly what a real power cut loses.
// It is a dmfuse extension; no kernel target has it.
//
// Writes go to an in-memory cache and are visible to reads at once. A flush
// writes every cached write back to the device below, in the order the
// writes arrived, and then flushes that device; a FUA write (stack.WithFUA) reaches
// the device before it completes. So the file system's own flush and FUA
// protocol decides what survives a cut, as on real hardware.
//
// This is what flakey's drop_writes is not. drop_writes drops every write
// from the moment it is switched on and lets the flushes that follow
// succeed: the file system carries on, and what it synced after the switch
// is gone after a remount (files fsynced, renamed over or deleted come back
// older, shorter or missing), a "corruption" that no disk produces; and it
// never loses a write that completed before the switch, so the file
// system's flush ordering is never put to the test. After a powercut cut
// every I/O fails with EIO, flushes included, until power_on; what an
// acknowledged flush covered is on the device, and exactly the writes no
// flush covered are lost (or, with random and torn, partly kept).
var Type = &stack.TargetType{Name: "powercut", Version: [3]int{1, 0, 0}, New: newPowercut}

// defaultCacheSectors is the default cache bound: 32 MiB.
const defaultCacheSectors = 65536

// seedStream is the second PCG seed word of the cut draws; the seed sets
// the first.
const seedStream = 0x5eed_c0de_9e37_79b9

// powercut is one constructed powercut target.
//
// Locks, in the order they are taken: wb, the index's stripes (ascending),
// masks, list, then room and msg on their own. No lock is held during
// device I/O but wb.
//
//   - wb orders what reaches the device: writing cached entries back (a
//     flush, a destage, a cut) holds it exclusively, a FUA write and the
//     dirty report hold it shared. Entries are written back oldest first,
//     always a prefix of the list, so that overlapping writes reach the
//     device in arrival order; a FUA write masks the older cached entries
//     it overlaps (holes), so that none of them can later land on top of
//     it. Only a holder of wb exclusively takes entries off the list.
//   - The index is locked a stripe of chunks at a time: a write holds the
//     stripes of its range while it joins the list and the index, so that
//     two overlapping writes join both in the same order, and writes to
//     other chunks do not wait for each other. A cut holds every stripe.
//   - list guards the arrival list and its counters, for a few
//     instructions at a time.
//
// The counters are atomic so that the write path (the bound) and reads of
// an empty cache take no lock.
type powercut struct {
	dev   stack.BlockDevice
	start int64 // offset on dev, bytes
	off   int64 // offset on dev, sectors, as given
	limit int64 // cache bound, sectors
	// hasLimit is set when cache_sectors was given, for the table form.
	hasLimit bool

	wb sync.RWMutex
	// wbLong is set while wb is held for a long write-back (longEntries,
	// longSectors).
	wbLong atomic.Bool
	// memory is Ctor.Memory; reserved what the cache accounted there.
	memory   func(n int64)
	reserved int64

	down atomic.Bool // changed under wb and every stripe

	// gen changes whenever data leaves the index without being newer:
	// written back, masked by a FUA write, or cut. A read that went to the
	// device without its stripes held tries again when it changed.
	gen atomic.Uint64

	count   atomic.Int64 // entries cached; changed under list
	sectors atomic.Int64 // sectors they touch; changed under list

	flushes  atomic.Uint64
	fuas     atomic.Uint64
	destaged atomic.Uint64 // entries written back, by any means but a cut
	around   atomic.Uint64 // writes written around a full cache
	inAround atomic.Int64  // of them on their way; counted under their stripes

	idx index

	// masks serialises FUA writes masking cached entries.
	masks sync.Mutex

	list struct {
		sync.Mutex
		head, tail *entry // arrival order
	}

	// destaging is set, under room, while the destager (a goroutine of
	// the target's own, started the first time the cache passes its
	// bound) writes the oldest entries back: writes that find the cache
	// over its bound meanwhile carry on, unless it holds more than 9/8 of
	// the bound (hard); those wait on room.cond, which a batch of the
	// write-back signals when the cache is back under that.
	destaging atomic.Bool
	waiters   atomic.Int32 // writes in makeRoom's slow path
	room      struct {
		sync.Mutex
		cond sync.Cond
		// err is the destager's last failed write-back, for the next
		// write that needs room; a flush that writes everything back
		// clears it.
		err  error
		kick chan struct{} // sets the destager to work: one token at most
		done chan struct{} // closed when the destager has stopped
	}

	msg struct {
		sync.Mutex
		cuts     uint64
		lastMode string // "none", "all", "random" or "torn"
		lastSeed uint64
	}
}

var (
	_ stack.Target        = (*powercut)(nil)
	_ stack.Flusher       = (*powercut)(nil)
	_ stack.Discarder     = (*powercut)(nil)
	_ stack.ZeroWriter    = (*powercut)(nil)
	_ stack.Messager      = (*powercut)(nil)
	_ stack.Postsuspender = (*powercut)(nil)
)

// newPowercut constructs a powercut target. Table syntax:
//
//	<dev_path> <offset> [<#features> <feature args>...]
//
// offset is in sectors on dev. #features counts the words after it (0 or
// 2); the one feature is
//
//	cache_sectors <n>   the cache bound, 0 to 2^32-1 sectors (default 65536: 32 MiB)
//
// The cache holds writes, discards and write-zeroes, each counted by the
// sectors it touches. When it holds more than the bound, the oldest entries
// are written back beside the writes, until it holds at most 7/8 of the
// bound, as a real cache destages: a goroutine of the target's own does it
// (started the first time the cache passes its bound, stopped by Close),
// and the writes, the one that crossed the bound included, go on into the
// cache meanwhile while it holds at most 9/8 of the bound; past that a
// write that overlaps no cached entry is written around the cache, straight
// to the device, as a disk with a full cache does, and one that overlaps a
// cached entry waits for room. A write-back of that goroutine that fails
// leaves the entries it did not write cached: the first write that then
// needs room gets the error, unless a flush has written them back since
// (the next flush writes them back again, and fails if the device still
// does). A request larger than the bound is written through, after every
// cached entry (so cache_sectors 0 is a disk without a volatile cache). The
// cache lives in the daemon's memory: while the target lives it accounts
// twice the bound in the daemon's memory plan (Ctor.Memory: the
// cache, up to 9/8 of the bound, and the buffers its pools keep; dmfuse
// mount raises its soft memory limit, --memory-limit, by that), so that a
// full cache does not starve the rest of the daemon. A suspend writes the
// whole cache back, as dm-writecache does (so that a new table never loses
// it); a power state belongs to one table and a new table starts powered on
// with an empty cache.
//
// Messages (verbs case-insensitive):
//
//	power_cut                   every cached entry is lost
//	power_cut random [<seed>]   each cached entry survives, independently, with probability 1/2
//	power_cut torn [<seed>]     as random, and each surviving entry of k > 1 sectors keeps only its
//	                            first j sectors, j drawn uniformly from 1..k (a torn write: the tear
//	                            falls on a 512-byte boundary of the device)
//	power_cut subset [<seed>]   random's model (dmfuse crash's subset mode), with the options below
//	power_cut sector [<seed>]   each tear unit of each cached entry survives on its own with
//	                            probability 1/2 (dmfuse crash's sector mode)
//
// random, torn, subset and sector take options after the seed, as
// dmfuse crash does: unit=<bytes> is the tear unit of torn and sector (a
// power of two from 512; default 512: a unit larger than a write damages
// the neighbouring sectors it holds, as a 512e disk's torn
// read-modify-write does), fill=old|zero|junk what a lost unit reads as
// (default old: what the device held; junk is drawn from the seed), and
// clean=<p> the probability that the cut loses nothing.
//
//	power_on                    power back: I/O works again, on what survived
//	dirty                       the cached entries, oldest first, one per line:
//	                            "<sector>+<sectors> <write|discard|zeroes>" (rounded out to whole
//	                            sectors), or "no cached writes"
//
// The draws of a cut come from a PCG generator seeded with the unsigned
// 64-bit seed and go over the entries oldest first (survival, then for torn
// the tear), so the same seed on the same cache gives the same result; a
// missing seed is picked at random and reported. Survivors are written to
// the device in their original order, less any part a later FUA write
// replaced, and the device is flushed; the reply says how many survived.
// After a cut every read, write, flush, discard and write-zeroes fails with
// EIO until power_on. A cut while powered off, or power_on while on, is an
// error and changes nothing.
//
// TABLE is "<dev> <offset>" plus " 2 cache_sectors <n>" when given. INFO is
//
//	<up|down> cached <entries> <sectors> flushes <n> fua <n> destaged <entries> around <writes> cuts <n> last_cut <none|all|random|torn|subset|sector> seed <seed|->
//
// flushes counts flush requests, fua the FUA writes written through,
// destaged the entries written back by flushes, the bound and suspends,
// around the writes written around a full cache.
func newPowercut(c *stack.Ctor, args []string) (stack.Target, error) {
	if len(args) < 2 {
		return nil, stack.Errorf("Invalid argument count")
	}
	a := stack.NewArgs(args[2:])
	p := &powercut{limit: defaultCacheSectors}
	if a.Len() > 0 {
		n, err := a.Group(0, 2, "Invalid number of feature args")
		if err != nil {
			return nil, err
		}
		for n > 0 {
			name, _ := a.Next()
			n--
			if !strings.EqualFold(name, "cache_sectors") {
				return nil, stack.Errorf("Unrecognised powercut feature %q", name)
			}
			if p.hasLimit {
				return nil, stack.Errorf("Feature cache_sectors duplicated")
			}
			if n == 0 {
				return nil, stack.Errorf("Feature cache_sectors requires a parameter")
			}
			// powercut has no kernel twin: its count takes kstrtouint's
			// rules (a leading '+', no wrap), as dust's block size does.
			arg, _ := a.Next()
			v, err := stack.ParseUint32(arg)
			if err != nil {
				return nil, stack.Errorf("Invalid cache_sectors: want 0 to 4294967295 sectors")
			}
			p.limit, p.hasLimit = int64(v), true
			n--
		}
		if a.Len() > 0 {
			return nil, stack.Errorf("Too many arguments")
		}
	}
	r, err := stack.OpenArea(c, args[0], args[1], "Invalid device sector", c.Len)
	if err != nil {
		return nil, err
	}
	p.dev, p.start, p.off = r.Dev, r.Off, r.Off/stack.SectorSize
	if p.memory = c.Memory; p.memory != nil {
		p.reserved = 2 * p.limit * stack.SectorSize
		p.memory(p.reserved)
	}
	p.msg.lastMode = "none"
	p.idx.init(c.Len * stack.SectorSize)
	p.room.cond.L = &p.room.Mutex
	return p, nil
}

// ReadAt implements Target: the device's data with the cached entries laid
// over it.
func (p *powercut) ReadAt(ctx context.Context, b []byte, off int64) (int, error) {
	if p.down.Load() {
		return 0, syscall.EIO
	}
	if p.count.Load() == 0 {
		// Nothing cached when the read started: whatever is cached now
		// came concurrently with it.
		return p.dev.ReadAt(ctx, b, p.start+off)
	}
	end := off + int64(len(b))
	for try := 0; ; try++ {
		m := p.idx.lock(off, end)
		if p.down.Load() {
			p.idx.unlock(m)
			return 0, syscall.EIO
		}
		if p.idx.covers(off, end) {
			p.idx.read(b, off)
			p.idx.unlock(m)
			return len(b), nil
		}
		gen := p.gen.Load()
		p.idx.unlock(m)
		// After a few reads raced with write-backs, hold them off.
		held := try >= 3
		if held {
			p.lockWB(ctx)
		}
		n, err := p.dev.ReadAt(ctx, b, p.start+off)
		if err != nil {
			if held {
				p.wb.Unlock()
			}
			return n, err
		}
		m = p.idx.lock(off, end)
		ok := p.gen.Load() == gen || held
		if ok {
			p.idx.read(b, off)
		}
		p.idx.unlock(m)
		if held {
			p.wb.Unlock()
		}
		if ok {
			return len(b), nil
		}
	}
}

// WriteAt implements Target: the data is copied into the cache, unless the
// write is marked FUA.
func (p *powercut) WriteAt(ctx context.Context, b []byte, off int64) (int, error) {
	if len(b) == 0 {
		if p.down.Load() {
			return 0, syscall.EIO
		}
		return 0, nil
	}
	if stack.FUA(ctx) {
		return p.writeFUA(ctx, b, off)
	}
	if p.sectors.Load() > p.hard() {
		if n, ok, err := p.writeAround(ctx, b, off); ok {
			return n, err
		}
	}
	e := newEntry(ioop.Write, off, int64(len(b)))
	copy(e.data, b)
	if err := p.add(ctx, e); err != nil {
		return 0, err
	}
	return len(b), nil
}

// writeAround writes b straight to the device when no cached entry
// overlaps it, as a disk whose cache is full writes around it instead of
// making the write wait for room; ok is false when an entry overlaps it
// (the write then waits for room in the cache, so that it never lands
// under older data). A write that joins the cache while this one is on its
// way is concurrent with it, and either may land last, as on any disk. A
// cut waits for the writes around in flight (inAround), so that none
// lands after it. A write around is durable no earlier than a flush, as
// any write; it only reaches the device before older writes that no flush
// has covered yet, which a real cache may do as well.
func (p *powercut) writeAround(ctx context.Context, b []byte, off int64) (n int, ok bool, err error) {
	end := off + int64(len(b))
	m := p.idx.lock(off, end)
	if p.down.Load() {
		p.idx.unlock(m)
		return 0, true, syscall.EIO
	}
	if p.idx.overlaps(off, end) {
		p.idx.unlock(m)
		return 0, false, nil
	}
	p.inAround.Add(1)
	p.idx.unlock(m)
	n, err = p.dev.WriteAt(ctx, b, p.start+off)
	p.inAround.Add(-1)
	p.around.Add(1)
	return n, true, err
}

// Discard implements Discarder: the discard is cached like a write; a
// cached discard reads as zeros.
func (p *powercut) Discard(ctx context.Context, off, n int64) error {
	return p.span(ctx, ioop.Discard, off, n)
}

// WriteZeroes implements ZeroWriter: write-zeroes is cached like a write.
func (p *powercut) WriteZeroes(ctx context.Context, off, n int64) error {
	return p.span(ctx, ioop.Zeroes, off, n)
}

func (p *powercut) span(ctx context.Context, kind ioop.Op, off, n int64) error {
	if p.down.Load() {
		return syscall.EIO
	}
	if n <= 0 {
		return nil
	}
	return p.add(ctx, newEntry(kind, off, n))
}

// Postsuspend implements Postsuspender: the cache is written back, so that
// a table swap does not lose it.
func (p *powercut) Postsuspend() {
	p.wb.Lock()
	defer p.wb.Unlock()
	_ = p.writeBackAllLocked(context.Background())
}

// msgError is a failed message: EINVAL with the reason.
func msgError(format string, a ...any) error {
	return &stack.ArgError{Reason: fmt.Sprintf(format, a...), Errno: syscall.EINVAL}
}

// Message implements Messager: power_cut, power_on and dirty (see
// newPowercut).
func (p *powercut) Message(ctx context.Context, args []string) (string, error) {
	if len(args) == 0 {
		return "", msgError("Empty message")
	}
	verb := args[0]
	switch {
	case strings.EqualFold(verb, "power_cut"):
		c, err := parseCut(args[1:])
		if err != nil {
			return "", err
		}
		return p.cut(ctx, c)
	case strings.EqualFold(verb, "power_on"):
		if len(args) > 1 {
			return "", msgError("power_on takes no arguments")
		}
		p.wb.Lock()
		defer p.wb.Unlock()
		if !p.down.Load() {
			return "", msgError("power_on: the power is already on")
		}
		m := p.idx.lockAll()
		p.down.Store(false)
		p.idx.unlock(m)
		return "", nil
	case strings.EqualFold(verb, "dirty"):
		if len(args) > 1 {
			return "", msgError("dirty takes no arguments")
		}
		return p.dirty(), nil
	}
	return "", msgError("Unrecognised message %q (want power_cut, power_on or dirty)", verb)
}

// dirty lists the cached entries.
func (p *powercut) dirty() string {
	p.wb.RLock()
	defer p.wb.RUnlock()
	first, k, _ := p.snapshot()
	if k == 0 {
		return "no cached writes"
	}
	var b strings.Builder
	walk(first, k, func(e *entry) bool {
		b.WriteString(strconv.FormatInt(e.off/stack.SectorSize, 10))
		b.WriteByte('+')
		b.WriteString(strconv.FormatInt(e.sectors(), 10))
		b.WriteByte(' ')
		b.WriteString(e.kind.String())
		b.WriteByte('\n')
		return true
	})
	return b.String()
}

// Status implements Target.
func (p *powercut) Status(t stack.StatusType) string {
	if t == stack.StatusTable {
		s := stack.EscapeArg(p.dev.Name()) + " " + strconv.FormatInt(p.off, 10)
		if p.hasLimit {
			s += " 2 cache_sectors " + strconv.FormatInt(p.limit, 10)
		}
		return s
	}
	_, count, sectors := p.snapshot()
	state := "up"
	if p.down.Load() {
		state = "down"
	}
	p.msg.Lock()
	defer p.msg.Unlock()
	seed := "-"
	if p.msg.lastMode == "random" || p.msg.lastMode == "torn" {
		seed = strconv.FormatUint(p.msg.lastSeed, 10)
	}
	return fmt.Sprintf("%s cached %d %d flushes %d fua %d destaged %d around %d cuts %d last_cut %s seed %s",
		state, count, sectors, p.flushes.Load(), p.fuas.Load(), p.destaged.Load(), p.around.Load(), p.msg.cuts, p.msg.lastMode, seed)
}

// Close implements Target: a cache still holding entries (the table was
// destroyed without a suspend) is written back while the power is on.
func (p *powercut) Close() error {
	p.stopDestager()
	p.wb.Lock()
	defer p.wb.Unlock()
	var err error
	if !p.down.Load() {
		err = p.writeBackAllLocked(context.Background())
	}
	if p.memory != nil && p.reserved != 0 {
		p.memory(-p.reserved)
		p.reserved = 0
	}
	return err
}
