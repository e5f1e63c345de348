package powercut

import (
	"context"
	"math/bits"
	"slices"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
)

// span is a byte range [off, end) of the segment.
type span struct{ off, end int64 }

// entry is one cached request. Everything but next and holes is fixed
// once it is in the list.
type entry struct {
	next *entry
	kind ioop.Op // ioop.Write, ioop.Discard or ioop.Zeroes
	off  int64   // segment bytes
	end  int64   // segment bytes
	data []byte  // a write: the cached copy, end-off bytes
	buf  *[]byte
	// holes are the parts a later FUA write replaced on the device: never
	// written back. Sorted, disjoint. Changed under wb (shared) and masks.
	holes []span
}

// sectors is the number of sectors e touches.
func (e *entry) sectors() int64 {
	return (e.end+stack.SectorSize-1)/stack.SectorSize - e.off/stack.SectorSize
}

// mask adds [a, b) to e's holes.
func (e *entry) mask(a, b int64) {
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
	e.holes = slices.Replace(h, i, j, span{a, b})
}

// within calls f on the parts of [a, b) that no hole of e covers (a and b
// may lie outside e: only e's holes are skipped).
func (e *entry) within(a, b int64, f func(a, b int64) error) error {
	for _, h := range e.holes {
		if h.off >= b {
			break
		}
		if h.end <= a {
			continue
		}
		if h.off > a {
			if err := f(a, h.off); err != nil {
				return err
			}
		}
		a = max(a, h.end)
	}
	if a < b {
		return f(a, b)
	}
	return nil
}

// bufClasses are the pooled sizes of cached copies: 512 B << i.
const bufClasses = 12 // up to 1 MiB, the largest FUSE write

var (
	entryPool = sync.Pool{New: func() any { return new(entry) }}
	bufPools  [bufClasses]sync.Pool
)

// getBuf returns a buffer of at least n bytes, from a pool when n is at
// most 1 MiB.
func getBuf(n int) *[]byte {
	c := bufClass(n)
	if c >= bufClasses {
		b := make([]byte, n)
		return &b
	}
	if bp, ok := bufPools[c].Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, stack.SectorSize<<c)
	return &b
}

// putBuf returns bp, of capacity size, to its pool. The caller passes the
// capacity it knows, so that a free does not load the slice header bp
// points to (a cache miss per entry in a full cache).
func putBuf(bp *[]byte, size int) {
	if c := bufClass(size); c < bufClasses && size == stack.SectorSize<<c {
		bufPools[c].Put(bp)
	}
}

// bufClass is the smallest class holding n bytes.
func bufClass(n int) int {
	if n <= stack.SectorSize {
		return 0
	}
	return bits.Len(uint((n - 1) / stack.SectorSize)) // ceil(log2(n/512))
}

func newEntry(kind ioop.Op, off, n int64) *entry {
	e := entryPool.Get().(*entry)
	e.kind, e.off, e.end = kind, off, off+n
	if kind == ioop.Write {
		e.buf = getBuf(int(n))
		e.data = (*e.buf)[:n]
	}
	return e
}

func freeEntry(e *entry) {
	if e.buf != nil {
		putBuf(e.buf, cap(e.data))
	}
	*e = entry{holes: e.holes[:0]}
	entryPool.Put(e)
}

// add caches e, or writes it through when it is larger than the cache, and
// destages the oldest entries while the cache is over its bound.
func (p *powercut) add(ctx context.Context, e *entry) error {
	s := e.sectors()
	if s > p.limit {
		return p.writeThrough(ctx, e)
	}
	m := p.idx.lock(e.off, e.end)
	if p.down.Load() {
		p.idx.unlock(m)
		freeEntry(e)
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
		stack.Waiting(ctx)
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
// may be followed without list held (walk): they were set before.
func (p *powercut) snapshot() (head *entry, n, sectors int64) {
	p.list.Lock()
	defer p.list.Unlock()
	return p.list.head, p.count.Load(), p.sectors.Load()
}

// walk calls f on the k entries from first, in list order, until f
// returns false, and returns the last entry it called f on. It follows a
// next link only to an entry it visits, so that the last entry's link,
// which a write joining the list may be setting, is never read.
func walk(first *entry, k int64, f func(e *entry) bool) *entry {
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
	long := excess > longSectors
	if total > p.limit {
		walk(first, n, func(e *entry) bool {
			excess -= e.sectors()
			k++
			return excess > 0
		})
	}
	return p.writeBack(ctx, k, long || k > longEntries)
}

// writeThrough writes e, larger than the cache, to the device after every
// cached entry, and frees it.
func (p *powercut) writeThrough(ctx context.Context, e *entry) error {
	defer freeEntry(e)
	stack.Waiting(ctx)
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
			stack.Waiting(ctx)
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
		walk(first, k, func(e *entry) bool {
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
			stack.Waiting(ctx)
		}
		p.wb.Lock()
	}
}

// A write-back of more than longEntries entries or longSectors sectors
// is long: its request tells its transport that it waits (4 MiB, or 1024
// writes: milliseconds). A shorter one is cheaper than a hand-off of the
// queue.
const (
	longEntries = 1024
	longSectors = 8192
)

// writeBackAllLocked writes back every cached entry; the caller holds wb.
func (p *powercut) writeBackAllLocked(ctx context.Context) error {
	if p.down.Load() {
		return syscall.EIO
	}
	_, k, sectors := p.snapshot()
	if err := p.writeBack(ctx, k, k > longEntries || sectors > longSectors); err != nil {
		return err
	}
	// Every entry the destager failed to write back is on the device
	// now: its error is void.
	p.room.Lock()
	p.room.err = nil
	p.room.Unlock()
	return nil
}

// writeBackBatch is how many written-back entries leave the cache at a
// time, so that a long write-back makes room (and lets waiting writes in)
// as it goes.
const writeBackBatch = 32

// writeBack writes the k oldest entries to the device in order, dropping
// them from the cache writeBackBatch at a time; long says they make a
// long write-back. The caller holds wb exclusively: nothing else takes
// entries off the head of the list.
func (p *powercut) writeBack(ctx context.Context, k int64, long bool) error {
	if long {
		stack.Waiting(ctx)
		p.wbLong.Store(true)
		defer p.wbLong.Store(false)
	}
	for k > 0 {
		first, _, _ := p.snapshot()
		var err error
		done := int64(0)
		walk(first, min(k, writeBackBatch), func(e *entry) bool {
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
func (p *powercut) drop(first *entry, k int64) {
	if k == 0 {
		return
	}
	p.gen.Add(1)
	var sectors int64
	last := walk(first, k, func(e *entry) bool {
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
		freeEntry(e)
		e = next
	}
}

// writeRange writes bytes [a, b) of e (segment offsets within e) to the
// device, less the parts a later FUA write replaced.
func (p *powercut) writeRange(ctx context.Context, e *entry, a, b int64) error {
	return e.within(a, b, func(a, b int64) error {
		switch e.kind {
		case ioop.Discard:
			return p.dev.Discard(ctx, p.start+a, b-a)
		case ioop.Zeroes:
			return p.dev.WriteZeroes(ctx, p.start+a, b-a)
		}
		_, err := p.dev.WriteAt(ctx, e.data[a-e.off:b-e.off], p.start+a)
		return err
	})
}

// writeEntry applies the first keep bytes of e to the device, less its
// holes.
func (p *powercut) writeEntry(ctx context.Context, e *entry, keep int64) error {
	return p.writeRange(ctx, e, e.off, e.off+keep)
}
