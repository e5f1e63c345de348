package stack

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Powercut is the powercut target type: a disk with a volatile write cache
// that a message switches off, losing exactly what a real power cut loses.
// It is a dmfuse extension; no kernel target has it.
//
// Writes go to an in-memory cache and are visible to reads at once. A flush
// writes every cached write back to the device below, in the order the
// writes arrived, and then flushes that device; a FUA write (WithFUA) reaches
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
var Powercut = &TargetType{Name: "powercut", Version: [3]int{1, 0, 0}, New: newPowercut}

// pcDefaultCacheSectors is the default cache bound: 32 MiB.
const pcDefaultCacheSectors = 65536

// pcSeedStream is the second PCG seed word of the cut draws; the seed sets
// the first.
const pcSeedStream = 0x5eed_c0de_9e37_79b9

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
	dev   BlockDevice
	start int64 // offset on dev, bytes
	off   int64 // offset on dev, sectors, as given
	limit int64 // cache bound, sectors
	// hasLimit is set when cache_sectors was given, for the table form.
	hasLimit bool

	wb sync.RWMutex
	// wbLong is set while wb is held for a long write-back (pcLongEntries,
	// pcLongSectors).
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

	idx pcIndex

	// masks serialises FUA writes masking cached entries.
	masks sync.Mutex

	list struct {
		sync.Mutex
		head, tail *pcEntry // arrival order
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
	_ Target        = (*powercut)(nil)
	_ Flusher       = (*powercut)(nil)
	_ Discarder     = (*powercut)(nil)
	_ ZeroWriter    = (*powercut)(nil)
	_ Messager      = (*powercut)(nil)
	_ Postsuspender = (*powercut)(nil)
)

// pcKind is what a cached entry does.
type pcKind uint8

const (
	pcWrite pcKind = iota
	pcDiscard
	pcZeroes
)

var pcKindNames = [...]string{pcWrite: "write", pcDiscard: "discard", pcZeroes: "zeroes"}

// pcSpan is a byte range [off, end) of the segment.
type pcSpan struct{ off, end int64 }

// pcEntry is one cached request. Everything but next and holes is fixed
// once it is in the list.
type pcEntry struct {
	next *pcEntry
	kind pcKind
	off  int64  // segment bytes
	end  int64  // segment bytes
	data []byte // pcWrite: the cached copy, end-off bytes
	buf  *[]byte
	// holes are the parts a later FUA write replaced on the device: never
	// written back. Sorted, disjoint. Changed under wb (shared) and masks.
	holes []pcSpan
}

// sectors is the number of sectors e touches.
func (e *pcEntry) sectors() int64 {
	return (e.end+SectorSize-1)/SectorSize - e.off/SectorSize
}

// mask adds [a, b) to e's holes.
func (e *pcEntry) mask(a, b int64) {
	h := e.holes
	i := 0
	for i < len(h) && h[i].end < a {
		i++
	}
	j := i
	for j < len(h) && h[j].off <= b {
		a, b = min(a, h[j].off), max(b, h[j].end)
		j++
	}
	e.holes = slices.Replace(h, i, j, pcSpan{a, b})
}

// pieces calls f for each part of [e.off, e.off+keep) that is not a hole.
func (e *pcEntry) pieces(keep int64, f func(a, b int64) error) error {
	a, end := e.off, e.off+keep
	for _, h := range e.holes {
		if h.off >= end {
			break
		}
		if h.off > a {
			if err := f(a, h.off); err != nil {
				return err
			}
		}
		a = max(a, h.end)
	}
	if a < end {
		return f(a, end)
	}
	return nil
}

// pcBufClasses are the pooled sizes of cached copies: 512 B << i.
const pcBufClasses = 12 // up to 1 MiB, the largest FUSE write

var (
	pcEntryPool = sync.Pool{New: func() any { return new(pcEntry) }}
	pcBufPools  [pcBufClasses]sync.Pool
)

// pcGetBuf returns a buffer of at least n bytes, from a pool when n is at
// most 1 MiB.
func pcGetBuf(n int) *[]byte {
	c := pcBufClass(n)
	if c >= pcBufClasses {
		b := make([]byte, n)
		return &b
	}
	if bp, ok := pcBufPools[c].Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, SectorSize<<c)
	return &b
}

// pcPutBuf returns bp, of capacity size, to its pool. The caller passes the
// capacity it knows, so that a free does not load the slice header bp
// points to (a cache miss per entry in a full cache).
func pcPutBuf(bp *[]byte, size int) {
	if c := pcBufClass(size); c < pcBufClasses && size == SectorSize<<c {
		pcBufPools[c].Put(bp)
	}
}

// pcBufClass is the smallest class holding n bytes.
func pcBufClass(n int) int {
	if n <= SectorSize {
		return 0
	}
	return bits.Len(uint((n - 1) / SectorSize)) // ceil(log2(n/512))
}

func pcNewEntry(kind pcKind, off, n int64) *pcEntry {
	e := pcEntryPool.Get().(*pcEntry)
	e.kind, e.off, e.end = kind, off, off+n
	if kind == pcWrite {
		e.buf = pcGetBuf(int(n))
		e.data = (*e.buf)[:n]
	}
	return e
}

func pcFreeEntry(e *pcEntry) {
	if e.buf != nil {
		pcPutBuf(e.buf, cap(e.data))
	}
	*e = pcEntry{holes: e.holes[:0]}
	pcEntryPool.Put(e)
}

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
//	<up|down> cached <entries> <sectors> flushes <n> fua <n> destaged <entries> around <writes> cuts <n> last_cut <none|all|random|torn> seed <seed|->
//
// flushes counts flush requests, fua the FUA writes written through,
// destaged the entries written back by flushes, the bound and suspends,
// around the writes written around a full cache.
func newPowercut(c *Ctor, args []string) (Target, error) {
	if len(args) < 2 {
		return nil, Errorf("Invalid argument count")
	}
	a := NewArgs(args[2:])
	p := &powercut{limit: pcDefaultCacheSectors}
	if a.Len() > 0 {
		n, err := a.Group(0, 2, "Invalid number of feature args")
		if err != nil {
			return nil, err
		}
		for n > 0 {
			name, _ := a.Next()
			n--
			if !strings.EqualFold(name, "cache_sectors") {
				return nil, Errorf("Unrecognised powercut feature %q", name)
			}
			if p.hasLimit {
				return nil, Errorf("Feature cache_sectors duplicated")
			}
			if n == 0 {
				return nil, Errorf("Feature cache_sectors requires a parameter")
			}
			// powercut has no kernel twin: its count takes kstrtouint's
			// rules (a leading '+', no wrap), as dust's block size does.
			arg, _ := a.Next()
			v, err := ParseUint32(arg)
			if err != nil {
				return nil, Errorf("Invalid cache_sectors: want 0 to 4294967295 sectors")
			}
			p.limit, p.hasLimit = int64(v), true
			n--
		}
		if a.Len() > 0 {
			return nil, Errorf("Too many arguments")
		}
	}
	r, err := OpenArea(c, args[0], args[1], "Invalid device sector", c.Len)
	if err != nil {
		return nil, err
	}
	p.dev, p.start, p.off = r.Dev, r.Off, r.Off/SectorSize
	if p.memory = c.Memory; p.memory != nil {
		p.reserved = 2 * p.limit * SectorSize
		p.memory(p.reserved)
	}
	p.msg.lastMode = "none"
	p.idx.init(c.Len * SectorSize)
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
	if FUA(ctx) {
		return p.writeFUA(ctx, b, off)
	}
	if p.sectors.Load() > p.hard() {
		if n, ok, err := p.writeAround(ctx, b, off); ok {
			return n, err
		}
	}
	e := pcNewEntry(pcWrite, off, int64(len(b)))
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
	return p.span(ctx, pcDiscard, off, n)
}

// WriteZeroes implements ZeroWriter: write-zeroes is cached like a write.
func (p *powercut) WriteZeroes(ctx context.Context, off, n int64) error {
	return p.span(ctx, pcZeroes, off, n)
}

func (p *powercut) span(ctx context.Context, kind pcKind, off, n int64) error {
	if p.down.Load() {
		return syscall.EIO
	}
	if n <= 0 {
		return nil
	}
	return p.add(ctx, pcNewEntry(kind, off, n))
}

// add caches e, or writes it through when it is larger than the cache, and
// destages the oldest entries while the cache is over its bound.
func (p *powercut) add(ctx context.Context, e *pcEntry) error {
	s := e.sectors()
	if s > p.limit {
		return p.writeThrough(ctx, e)
	}
	m := p.idx.lock(e.off, e.end)
	if p.down.Load() {
		p.idx.unlock(m)
		pcFreeEntry(e)
		return syscall.EIO
	}
	p.list.Lock()
	if p.list.tail == nil {
		p.list.head = e
	} else {
		p.list.tail.next = e
	}
	p.list.tail = e
	p.count.Add(1)
	total := p.sectors.Add(s)
	p.list.Unlock()
	// A write-back that takes e off the list meanwhile clears it from the
	// index under these stripes: after this.
	p.idx.put(e.off, e.end, e)
	p.idx.unlock(m)
	if total > p.limit {
		return p.makeRoom(ctx)
	}
	return nil
}

// hard is how many sectors the cache may hold while a write destages: 9/8
// of the bound.
func (p *powercut) hard() int64 { return p.limit + p.limit/8 }

// makeRoom returns at once if the cache is within its bound. Else it sets
// the destager to work, unless it is at work already, and returns at once
// if the cache holds at most 9/8 of the bound (hard); else once the
// destager has brought it back there. The write that crossed the bound and
// those that come while the destager works thus go on as long as the
// write-back keeps up, and wait only when it does not. A write-back of the
// destager that failed is reported here, to the first write that needs
// room after it, unless a flush wrote the entries it left cached back
// since.
func (p *powercut) makeRoom(ctx context.Context) error {
	if p.destaging.Load() && p.sectors.Load() <= p.hard() {
		return nil
	}
	p.room.Lock()
	defer p.room.Unlock()
	// waiters goes up before sectors is read, and drop lowers sectors
	// before it reads waiters: one of the two sees the other.
	p.waiters.Add(1)
	defer p.waiters.Add(-1)
	for {
		switch sectors := p.sectors.Load(); {
		case p.down.Load():
			return syscall.EIO
		case p.room.err != nil:
			err := p.room.err
			p.room.err = nil
			return err
		case sectors <= p.limit:
			return nil
		case !p.destaging.Load():
			p.startDestagerLocked()
			continue
		case sectors <= p.hard():
			return nil
		}
		Waiting(ctx)
		p.room.cond.Wait()
	}
}

// startDestagerLocked sets the destager to work, starting it the first
// time; the caller holds room and found destaging clear.
func (p *powercut) startDestagerLocked() {
	p.destaging.Store(true)
	if p.room.kick == nil {
		p.room.kick = make(chan struct{}, 1)
		p.room.done = make(chan struct{})
		go p.destager(p.room.kick, p.room.done)
	}
	// destaging was clear: the destager took the last token and is done
	// with it, so the channel has room.
	p.room.kick <- struct{}{}
}

// destager writes the oldest entries back each time kick gives it a token,
// until the cache is within its bound, and then clears destaging. It stops
// when kick is closed (Close).
func (p *powercut) destager(kick <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	ctx := context.Background()
	for range kick {
		var err error
		for err == nil {
			p.wb.Lock()
			// down changes only under wb: an error below is the
			// device's.
			if p.down.Load() || p.sectors.Load() <= p.limit {
				p.wb.Unlock()
				break
			}
			if err = p.destageLocked(ctx); err != nil {
				// Under wb, so that a cut, which clears it, comes
				// before or after.
				p.room.Lock()
				p.room.err = err
				p.room.Unlock()
			}
			p.wb.Unlock()
		}
		p.room.Lock()
		p.destaging.Store(false)
		p.room.cond.Broadcast()
		p.room.Unlock()
	}
}

// idleLocked waits until the destager is not at work; the caller holds
// room.
func (p *powercut) idleLocked() {
	for p.destaging.Load() {
		p.room.cond.Wait()
	}
}

// stopDestager waits for the destager to finish its work and stops it.
func (p *powercut) stopDestager() {
	p.room.Lock()
	p.idleLocked()
	kick, done := p.room.kick, p.room.done
	p.room.kick, p.room.done = nil, nil
	p.room.Unlock()
	if kick != nil {
		close(kick)
		<-done
	}
}

// wakeRoom wakes the writes waiting for room.
func (p *powercut) wakeRoom() {
	p.room.Lock()
	p.room.cond.Broadcast()
	p.room.Unlock()
}

// snapshot returns the oldest cached entry, how many entries are cached and
// the sectors they touch, read together. The first n-1 entries' next links
// may be followed without list held (pcWalk): they were set before.
func (p *powercut) snapshot() (head *pcEntry, n, sectors int64) {
	p.list.Lock()
	defer p.list.Unlock()
	return p.list.head, p.count.Load(), p.sectors.Load()
}

// pcWalk calls f on the k entries from first, in list order, until f
// returns false, and returns the last entry it called f on. It follows a
// next link only to an entry it visits, so that the last entry's link,
// which a write joining the list may be setting, is never read.
func pcWalk(first *pcEntry, k int64, f func(e *pcEntry) bool) *pcEntry {
	e := first
	for ; k > 0; k-- {
		if !f(e) || k == 1 {
			break
		}
		e = e.next
	}
	return e
}

// destageLocked writes back the oldest entries, once the cache is over its
// bound, until it holds at most 7/8 of the bound: a batch, so that the
// writes that follow find room without waiting for it one by one. The
// caller holds wb.
func (p *powercut) destageLocked(ctx context.Context) error {
	first, n, total := p.snapshot()
	k, excess := int64(0), total-(p.limit-p.limit/8)
	long := excess > pcLongSectors
	if total > p.limit {
		pcWalk(first, n, func(e *pcEntry) bool {
			excess -= e.sectors()
			k++
			return excess > 0
		})
	}
	return p.writeBack(ctx, k, long || k > pcLongEntries)
}

// writeThrough writes e, larger than the cache, to the device after every
// cached entry, and frees it.
func (p *powercut) writeThrough(ctx context.Context, e *pcEntry) error {
	defer pcFreeEntry(e)
	Waiting(ctx)
	p.wb.Lock()
	defer p.wb.Unlock()
	if err := p.writeBackAllLocked(ctx); err != nil {
		return err
	}
	return p.writeEntry(ctx, e, e.end-e.off)
}

// writeFUA writes b through to the device and masks the cached entries it
// overlaps, so that they neither show over it nor land on it later.
func (p *powercut) writeFUA(ctx context.Context, b []byte, off int64) (int, error) {
	if !p.wb.TryRLock() {
		if p.wbLong.Load() {
			Waiting(ctx)
		}
		p.wb.RLock()
	}
	defer p.wb.RUnlock()
	if p.down.Load() {
		return 0, syscall.EIO
	}
	n, err := p.dev.WriteAt(ctx, b, p.start+off)
	if err != nil {
		return n, err
	}
	end := off + int64(len(b))
	// With the range's stripes held no write overlapping it joins the
	// list; with wb held (shared) none leaves it.
	m := p.idx.lock(off, end)
	if p.count.Load() > 0 {
		p.gen.Add(1)
		p.masks.Lock()
		first, k, _ := p.snapshot()
		pcWalk(first, k, func(e *pcEntry) bool {
			if e.off < end && off < e.end {
				e.mask(max(e.off, off), min(e.end, end))
			}
			return true
		})
		p.masks.Unlock()
		p.idx.clear(off, end, nil)
	}
	p.idx.unlock(m)
	p.fuas.Add(1)
	return n, nil
}

// Flush implements Flusher: every cached entry is written back in order,
// then the device is flushed.
func (p *powercut) Flush(ctx context.Context) error {
	if p.down.Load() {
		return syscall.EIO
	}
	p.flushes.Add(1)
	p.lockWB(ctx)
	err := p.writeBackAllLocked(ctx)
	p.wb.Unlock()
	if err != nil {
		return err
	}
	if p.down.Load() {
		return syscall.EIO
	}
	return p.dev.Flush(ctx)
}

// lockWB takes wb exclusively. A request that finds it held by a long
// write-back is going to wait for longer than a round trip, and tells its
// transport (stack.Waiting): on io_uring the requests behind it then go on
// on another thread. A short write-back is not worth the hand-off.
func (p *powercut) lockWB(ctx context.Context) {
	if !p.wb.TryLock() {
		if p.wbLong.Load() {
			Waiting(ctx)
		}
		p.wb.Lock()
	}
}

// A write-back of more than pcLongEntries entries or pcLongSectors sectors
// is long: its request tells its transport that it waits (4 MiB, or 1024
// writes: milliseconds). A shorter one is cheaper than a hand-off of the
// queue.
const (
	pcLongEntries = 1024
	pcLongSectors = 8192
)

// writeBackAllLocked writes back every cached entry; the caller holds wb.
func (p *powercut) writeBackAllLocked(ctx context.Context) error {
	if p.down.Load() {
		return syscall.EIO
	}
	_, k, sectors := p.snapshot()
	if err := p.writeBack(ctx, k, k > pcLongEntries || sectors > pcLongSectors); err != nil {
		return err
	}
	// Every entry the destager failed to write back is on the device
	// now: its error is void.
	p.room.Lock()
	p.room.err = nil
	p.room.Unlock()
	return nil
}

// pcWriteBackBatch is how many written-back entries leave the cache at a
// time, so that a long write-back makes room (and lets waiting writes in)
// as it goes.
const pcWriteBackBatch = 32

// writeBack writes the k oldest entries to the device in order, dropping
// them from the cache pcWriteBackBatch at a time; long says they make a
// long write-back. The caller holds wb exclusively: nothing else takes
// entries off the head of the list.
func (p *powercut) writeBack(ctx context.Context, k int64, long bool) error {
	if long {
		Waiting(ctx)
		p.wbLong.Store(true)
		defer p.wbLong.Store(false)
	}
	for k > 0 {
		first, _, _ := p.snapshot()
		var err error
		done := int64(0)
		pcWalk(first, min(k, pcWriteBackBatch), func(e *pcEntry) bool {
			if err = p.writeEntry(ctx, e, e.end-e.off); err != nil {
				return false
			}
			done++
			return true
		})
		p.drop(first, done)
		if err != nil {
			return err
		}
		k -= done
	}
	return nil
}

// drop takes the k oldest entries, from first, written back, off the cache
// and frees them. The caller holds wb exclusively.
func (p *powercut) drop(first *pcEntry, k int64) {
	if k == 0 {
		return
	}
	p.gen.Add(1)
	var sectors int64
	last := pcWalk(first, k, func(e *pcEntry) bool {
		m := p.idx.lock(e.off, e.end)
		p.idx.clear(e.off, e.end, e)
		p.idx.unlock(m)
		sectors += e.sectors()
		return true
	})
	p.list.Lock()
	p.list.head = last.next
	if p.list.head == nil {
		p.list.tail = nil
	}
	p.count.Add(-k)
	left := p.sectors.Add(-sectors)
	p.list.Unlock()
	p.destaged.Add(uint64(k))
	if p.waiters.Load() > 0 && left <= p.hard() {
		p.wakeRoom()
	}
	for e := first; k > 0; k-- {
		next := e.next
		pcFreeEntry(e)
		e = next
	}
}

// writeEntry applies the first keep bytes of e to the device, less its
// holes.
func (p *powercut) writeEntry(ctx context.Context, e *pcEntry, keep int64) error {
	return e.pieces(keep, func(a, b int64) error {
		switch e.kind {
		case pcDiscard:
			return p.dev.Discard(ctx, p.start+a, b-a)
		case pcZeroes:
			return p.dev.WriteZeroes(ctx, p.start+a, b-a)
		}
		_, err := p.dev.WriteAt(ctx, e.data[a-e.off:b-e.off], p.start+a)
		return err
	})
}

// Postsuspend implements Postsuspender: the cache is written back, so that
// a table swap does not lose it.
func (p *powercut) Postsuspend() {
	p.wb.Lock()
	defer p.wb.Unlock()
	_ = p.writeBackAllLocked(context.Background())
}

// pcMsgError is a failed message: EINVAL with the reason.
func pcMsgError(format string, a ...any) error {
	return &ArgError{Reason: fmt.Sprintf(format, a...), Errno: syscall.EINVAL}
}

// Message implements Messager: power_cut, power_on and dirty (see
// newPowercut).
func (p *powercut) Message(ctx context.Context, args []string) (string, error) {
	if len(args) == 0 {
		return "", pcMsgError("Empty message")
	}
	verb := args[0]
	switch {
	case strings.EqualFold(verb, "power_cut"):
		mode, seed, err := parseCut(args[1:])
		if err != nil {
			return "", err
		}
		return p.cut(ctx, mode, seed)
	case strings.EqualFold(verb, "power_on"):
		if len(args) > 1 {
			return "", pcMsgError("power_on takes no arguments")
		}
		p.wb.Lock()
		defer p.wb.Unlock()
		if !p.down.Load() {
			return "", pcMsgError("power_on: the power is already on")
		}
		m := p.idx.lockAll()
		p.down.Store(false)
		p.idx.unlock(m)
		return "", nil
	case strings.EqualFold(verb, "dirty"):
		if len(args) > 1 {
			return "", pcMsgError("dirty takes no arguments")
		}
		return p.dirty(), nil
	}
	return "", pcMsgError("Unrecognised message %q (want power_cut, power_on or dirty)", verb)
}

// parseCut reads the arguments after power_cut: mode "all" for none, else
// random or torn with an optional seed (picked at random when missing).
func parseCut(args []string) (mode string, seed uint64, err error) {
	if len(args) == 0 {
		return "all", 0, nil
	}
	switch {
	case strings.EqualFold(args[0], "random"):
		mode = "random"
	case strings.EqualFold(args[0], "torn"):
		mode = "torn"
	default:
		return "", 0, pcMsgError("power_cut %s: unknown mode (want random or torn)", args[0])
	}
	switch len(args) {
	case 1:
		return mode, rand.Uint64(), nil
	case 2:
		seed, err = ParseUint64(args[1])
		if err != nil {
			return "", 0, pcMsgError("power_cut %s %s: invalid seed (want an unsigned 64-bit decimal)", mode, args[1])
		}
		return mode, seed, nil
	}
	return "", 0, pcMsgError("power_cut %s: too many arguments", mode)
}

// cut switches the power off: the cache is emptied, the entries that
// survive mode are written to the device, and every I/O fails from now on.
func (p *powercut) cut(ctx context.Context, mode string, seed uint64) (string, error) {
	p.wb.Lock()
	defer p.wb.Unlock()
	if p.down.Load() {
		return "", pcMsgError("power_cut: the power is already off")
	}
	m := p.idx.lockAll()
	p.down.Store(true)
	p.list.Lock()
	first, k, sectors := p.list.head, p.count.Load(), p.sectors.Load()
	p.list.head, p.list.tail = nil, nil
	p.count.Store(0)
	p.sectors.Store(0)
	p.list.Unlock()
	p.gen.Add(1)
	p.idx.reset()
	p.idx.unlock(m)
	// Every write around that saw the power on is counted: let it land.
	for p.inAround.Load() > 0 {
		runtime.Gosched()
	}
	p.msg.Lock()
	p.msg.cuts++
	p.msg.lastMode, p.msg.lastSeed = mode, seed
	p.msg.Unlock()
	// A write-back that failed before the cut is not reported after it.
	p.room.Lock()
	p.room.err = nil
	p.room.cond.Broadcast()
	p.room.Unlock()

	rng := rand.New(rand.NewPCG(seed, pcSeedStream))
	var survived, torn int64
	var err error
	e := first
	for range k {
		keep := int64(0)
		if mode != "all" && rng.Uint64()&1 == 1 {
			keep = e.end - e.off
			if s := e.sectors(); mode == "torn" && s > 1 {
				j := 1 + rng.Int64N(s)
				keep = min(e.end, (e.off/SectorSize+j)*SectorSize) - e.off
				if keep < e.end-e.off {
					torn++
				}
			}
		}
		if keep > 0 && err == nil {
			survived++
			err = p.writeEntry(ctx, e, keep)
		}
		next := e.next
		pcFreeEntry(e)
		e = next
	}
	if err == nil && survived > 0 {
		err = p.dev.Flush(ctx)
	}
	if err != nil {
		return "", fmt.Errorf("power_cut: writing the surviving entries: %w", err)
	}
	switch mode {
	case "all":
		return fmt.Sprintf("power_cut: %d cached writes lost (%d sectors)", k, sectors), nil
	case "random":
		return fmt.Sprintf("power_cut random seed %d: %d of %d cached writes survived", seed, survived, k), nil
	}
	return fmt.Sprintf("power_cut torn seed %d: %d of %d cached writes survived, %d of them torn", seed, survived, k, torn), nil
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
	pcWalk(first, k, func(e *pcEntry) bool {
		b.WriteString(strconv.FormatInt(e.off/SectorSize, 10))
		b.WriteByte('+')
		b.WriteString(strconv.FormatInt(e.sectors(), 10))
		b.WriteByte(' ')
		b.WriteString(pcKindNames[e.kind])
		b.WriteByte('\n')
		return true
	})
	return b.String()
}

// Status implements Target.
func (p *powercut) Status(t StatusType) string {
	if t == StatusTable {
		s := EscapeArg(p.dev.Name()) + " " + strconv.FormatInt(p.off, 10)
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

// pcChunkShift sets the span of one index chunk: 1 MiB.
const pcChunkShift = 20

// pcExtent is a byte range [off, end) whose newest cached data is e's.
type pcExtent struct {
	off, end int64
	e        *pcEntry
}

// pcChunk holds the extents inside one 1 MiB span, sorted and disjoint.
type pcChunk struct{ ext []pcExtent }

// pcFlatChunks is the most chunks an index keeps in a slice indexed by
// chunk (a target of up to 16 GiB: 384 KiB of chunk headers); a larger
// target keeps its chunks in a map.
const pcFlatChunks = 1 << 14

// pcFlatKeep is the most extents an emptied chunk of a slice index keeps
// room for (768 bytes, so that a chunk that empties and fills again does
// not allocate; at most 12 MiB over a 16 GiB target).
const pcFlatKeep = 32

// pcIndex maps each cached byte to the newest entry holding it. It is split
// into chunks so that an insertion moves only the extents of a chunk. The
// chunks of a target of at most pcFlatChunks chunks are a slice indexed by
// chunk, so that finding one touches no map: an index operation is bound by
// the cache misses on the way to the extents. An empty chunk there has no
// extents.
//
// Chunk ck belongs to stripe ck % pcStripes, whose lock guards it (and,
// for a larger target, the map its chunks are kept in): lock and unlock
// take the stripes of a range. The methods below expect the stripes of
// the range they touch held, or no concurrency.
type pcIndex struct {
	flat    []pcChunk
	stripes [pcStripes]pcStripe
}

// pcStripes is the number of stripes of an index: consecutive chunks fall
// in different stripes, so a range of up to 64 MiB locks each stripe once.
const pcStripes = 64

// pcStripe is one lock of an index, and the chunks it guards when they are
// kept in a map. It fills a cache line, so that stripes taken on two CPUs
// do not share one.
type pcStripe struct {
	sync.Mutex
	chunks map[int64]*pcChunk
	free   []*pcChunk
	_      [64 - 8 - 8 - 24]byte
}

// init sets the index up for a target of length bytes.
func (x *pcIndex) init(length int64) {
	if n := (length + 1<<pcChunkShift - 1) >> pcChunkShift; n <= pcFlatChunks {
		x.flat = make([]pcChunk, n)
		return
	}
	for i := range x.stripes {
		x.stripes[i].chunks = make(map[int64]*pcChunk)
	}
}

// pcStripeMask returns the stripes [off, end) touches, as a bit mask.
func pcStripeMask(off, end int64) uint64 {
	first, last := off>>pcChunkShift, (end-1)>>pcChunkShift
	if end <= off {
		last = first
	}
	if last-first >= pcStripes-1 {
		return ^uint64(0)
	}
	a, b := uint(first%pcStripes), uint(last%pcStripes)
	lo := ^uint64(0) >> (63 - b) // stripes 0 to b
	hi := ^(uint64(1)<<a - 1)    // stripes a to 63
	if a <= b {
		return lo & hi
	}
	return lo | hi
}

// lock takes the stripes of [off, end), in ascending order, and returns
// them for unlock.
func (x *pcIndex) lock(off, end int64) uint64 {
	m := pcStripeMask(off, end)
	for s := m; s != 0; s &= s - 1 {
		x.stripes[bits.TrailingZeros64(s)].Lock()
	}
	return m
}

// lockAll takes every stripe.
func (x *pcIndex) lockAll() uint64 {
	for i := range x.stripes {
		x.stripes[i].Lock()
	}
	return ^uint64(0)
}

// unlock releases the stripes of m.
func (x *pcIndex) unlock(m uint64) {
	for s := m; s != 0; s &= s - 1 {
		x.stripes[bits.TrailingZeros64(s)].Unlock()
	}
}

// get returns chunk ck, nil when it has no extents.
func (x *pcIndex) get(ck int64) *pcChunk {
	if x.flat != nil {
		if c := &x.flat[ck]; len(c.ext) > 0 {
			return c
		}
		return nil
	}
	return x.stripes[ck%pcStripes].chunks[ck]
}

// chunk returns chunk ck, making it when it has none.
func (x *pcIndex) chunk(ck int64) *pcChunk {
	if x.flat != nil {
		return &x.flat[ck]
	}
	st := &x.stripes[ck%pcStripes]
	var c *pcChunk
	if c = st.chunks[ck]; c == nil {
		if n := len(st.free); n > 0 {
			c, st.free = st.free[n-1], st.free[:n-1]
		} else {
			c = new(pcChunk)
		}
		st.chunks[ck] = c
	}
	return c
}

// emptied is called when chunk ck, c, has no extents left.
func (x *pcIndex) emptied(ck int64, c *pcChunk) {
	if x.flat != nil {
		if cap(c.ext) > pcFlatKeep {
			c.ext = nil
		}
		return
	}
	st := &x.stripes[ck%pcStripes]
	delete(st.chunks, ck)
	st.free = append(st.free, c)
}

// reset empties the index.
func (x *pcIndex) reset() {
	for i := range x.flat {
		if c := &x.flat[i]; len(c.ext) > 0 {
			c.ext = c.ext[:0]
			x.emptied(int64(i), c)
		}
	}
	for i := range x.stripes {
		st := &x.stripes[i]
		for k, c := range st.chunks {
			c.ext = c.ext[:0]
			st.free = append(st.free, c)
			delete(st.chunks, k)
		}
	}
}

// search returns the index of the first extent of c ending after off.
func (c *pcChunk) search(off int64) int {
	lo, hi := 0, len(c.ext)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c.ext[m].end <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// chunkSpan clips [off, end) to chunk ck.
func chunkSpan(ck, off, end int64) (int64, int64) {
	return max(off, ck<<pcChunkShift), min(end, (ck+1)<<pcChunkShift)
}

// put makes e the newest data of [off, end).
func (x *pcIndex) put(off, end int64, e *pcEntry) {
	for ck := off >> pcChunkShift; ck<<pcChunkShift < end; ck++ {
		c := x.chunk(ck)
		a, b := chunkSpan(ck, off, end)
		c.replace(a, b, e)
	}
}

// replace puts e over [a, b) of c (nil e: clears it), keeping what extents
// overlapping it hold outside it.
func (c *pcChunk) replace(a, b int64, e *pcEntry) {
	i := c.search(a)
	j := i
	for j < len(c.ext) && c.ext[j].off < b {
		j++
	}
	var rep [3]pcExtent
	k := 0
	if i < j && c.ext[i].off < a {
		rep[k] = pcExtent{c.ext[i].off, a, c.ext[i].e}
		k++
	}
	if e != nil {
		rep[k] = pcExtent{a, b, e}
		k++
	}
	if i < j && c.ext[j-1].end > b {
		rep[k] = pcExtent{b, c.ext[j-1].end, c.ext[j-1].e}
		k++
	}
	c.ext = slices.Replace(c.ext, i, j, rep[:k]...)
}

// clear removes [off, end) from the index: all of it when only is nil,
// else only the extents of entry only.
func (x *pcIndex) clear(off, end int64, only *pcEntry) {
	for ck := off >> pcChunkShift; ck<<pcChunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			continue
		}
		a, b := chunkSpan(ck, off, end)
		if only == nil {
			c.replace(a, b, nil)
		} else {
			i := c.search(a)
			j := i
			for j < len(c.ext) && c.ext[j].off < b {
				j++
			}
			kept := i
			for n := i; n < j; n++ {
				if c.ext[n].e != only {
					c.ext[kept] = c.ext[n]
					kept++
				}
			}
			c.ext = slices.Delete(c.ext, kept, j)
		}
		if len(c.ext) == 0 {
			x.emptied(ck, c)
		}
	}
}

// overlaps reports whether any byte of [off, end) is cached.
func (x *pcIndex) overlaps(off, end int64) bool {
	for ck := off >> pcChunkShift; ck<<pcChunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			continue
		}
		a, b := chunkSpan(ck, off, end)
		if i := c.search(a); i < len(c.ext) && c.ext[i].off < b {
			return true
		}
	}
	return false
}

// covers reports whether every byte of [off, end) is cached.
func (x *pcIndex) covers(off, end int64) bool {
	pos := off
	for ck := off >> pcChunkShift; ck<<pcChunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			return false
		}
		_, b := chunkSpan(ck, off, end)
		for i := c.search(pos); pos < b; i++ {
			if i == len(c.ext) || c.ext[i].off > pos {
				return false
			}
			pos = c.ext[i].end
		}
	}
	return true
}

// read lays the cached data of [off, off+len(p)) over p.
func (x *pcIndex) read(p []byte, off int64) {
	end := off + int64(len(p))
	for ck := off >> pcChunkShift; ck<<pcChunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			continue
		}
		a, b := chunkSpan(ck, off, end)
		for i := c.search(a); i < len(c.ext) && c.ext[i].off < b; i++ {
			x := c.ext[i]
			s, t := max(x.off, a), min(x.end, b)
			dst := p[s-off : t-off]
			if x.e.kind == pcWrite {
				copy(dst, x.e.data[s-x.e.off:t-x.e.off])
			} else {
				clear(dst)
			}
		}
	}
}
