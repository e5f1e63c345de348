package stats

// dm-stats: per-region statistics, as drivers/md/dm-stats.c keeps them
// (dm_stats_account_io). A region is a range of sectors cut into areas of step
// sectors; each area has its own counters, updated from the same two calls as
// the device's diskstats (StartAt and DoneAt). A Disk without regions pays one
// atomic pointer load per accounted piece and nothing else.
//
// The counting follows the kernel's code rather than its documentation:
//
//   - a piece is counted in every area it overlaps, with ios += 1 in each and
//     only the overlapping sectors; pieces of 0 sectors (empty flushes) are
//     not counted;
//   - at every start, end, print and clear, each touched area is "rounded":
//     Δ = now - stamp, read busy += Δ if reads are in flight, write busy += Δ
//     if writes are in flight, io_ticks += Δ and time_in_queue += in_flight × Δ
//     if anything is, then stamp = now; now is in ticks of 1 ms, or in
//     nanoseconds for a precise_timestamps region;
//   - durations are whole ticks (end tick - start tick), or nanoseconds;
//   - the merged columns reproduce the kernel's misplaced parenthesis: a piece
//     counts as merged if its start sector equals the truth value of "the
//     previous piece ended at a non-zero sector and went the same direction";
//     before the device's first counted piece the previous one counts as a
//     read (dm_stats_init's last_sector ULLONG_MAX, last_rw UINT_MAX), and
//     deleting every region does not reset it;
//   - discards count as writes (dm-stats indexes by data direction);
//   - every line of @stats_print shows +step, the last area's too.
//
// A piece that started before a region was created is never counted in it:
// the set of regions a piece is counted in is the one it saw at its start
// (the kernel gets the same result by suspending the device while it creates
// a region). So a new region starts with 0 in flight in every area.

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// MaxAreas is the most areas one region may have (the kernel's
// DM_STAT_MAX_ENTRIES).
const MaxAreas = 8388608

// maxRegionID is the largest region id (the kernel's INT_MAX).
const maxRegionID = 1<<31 - 1

// RegionRef is what one accounted piece carries from StartAt to DoneAt: the
// regions it was counted in at its start, its sector range and its merged
// flag. The zero RegionRef (no regions) makes DoneAt a plain Done.
type RegionRef struct {
	set         *regionSet
	sector, end uint64 // [sector, end) in 512-byte sectors
	write       bool
	merged      bool
}

// StartAt is Start for a piece covering the bytes [off, off+n) of the device:
// it also starts the piece in the areas of the device's dm-stats regions it
// overlaps. Pass the result to DoneAt.
func (d *Disk) StartAt(op ioop.Op, startNs int64, off, n int64) RegionRef {
	if !Accounting {
		return RegionRef{}
	}
	d.Start(op, startNs)
	set := d.regions.Load()
	if set == nil {
		return RegionRef{}
	}
	return set.start(d.clock.Nanotime(), op, off, n)
}

// DoneAt is Done for a piece that StartAt started: it also ends the piece in
// the areas that StartAt counted it in.
func (d *Disk) DoneAt(op ioop.Op, sectors uint64, startNs int64, r RegionRef) {
	if !Accounting {
		return
	}
	d.Done(op, sectors, startNs)
	if r.set != nil {
		r.set.done(d.clock.Nanotime(), startNs, r)
	}
}

// regionSet is an immutable list of regions, sorted by id, replaced as a
// whole when a region is created or deleted.
type regionSet struct {
	regions []*region
	// last is the direction of the device's previous counted piece:
	// lastWrite or not. The kernel keeps it per CPU; dmfuse keeps one per
	// device (Disk.statsLast), for the device's life.
	last *atomic.Uint32
}

// The values of regionSet.last; 0, its value before the device's first
// counted piece, is not lastWrite.
const (
	lastRead  uint32 = 1
	lastWrite uint32 = 2
)

func (s *regionSet) start(nowNs int64, op ioop.Op, off, n int64) RegionRef {
	if n <= 0 || off < 0 {
		return RegionRef{}
	}
	r := RegionRef{set: s, sector: uint64(off) >> 9, end: (uint64(off+n) + 511) >> 9, write: op.IsWrite()}
	// The kernel's test (dm_stats_account_io) is
	//	bi_sector == (last_sector && (rw == WRITE) == (last_rw == WRITE))
	// where last_sector is the end of the previous bio: never 0, neither
	// after a bio (it ends past sector 0) nor before the first one
	// (dm_stats_init sets ULLONG_MAX). last_rw starts at UINT_MAX, which is
	// not WRITE, so before the first piece the previous one counts as a read.
	st := lastRead
	if r.write {
		st = lastWrite
	}
	prev := s.last.Load()
	same := (prev == lastWrite) == r.write
	r.merged = (same && r.sector == 1) || (!same && r.sector == 0)
	if prev != st {
		s.last.Store(st)
	}
	for _, rg := range s.regions {
		rg.account(r, false, nowNs, 0)
	}
	return r
}

func (s *regionSet) done(nowNs, startNs int64, r RegionRef) {
	for _, rg := range s.regions {
		rg.account(r, true, nowNs, startNs)
	}
}

// area is the state of one area of a region. The kernel keeps the counters
// per CPU and the in-flight counts and stamp shared; dmfuse keeps them
// together under one lock per area, so that every rounding is exact.
type area struct {
	mu       sync.Mutex
	inflight [2]int64
	stamp    uint64
	c        areaCounters
}

// areaCounters are the counters of one area that @stats_clear resets.
type areaCounters struct {
	ios, merges, sectors, ticks [2]uint64
	busy                        [2]uint64 // io_ticks[READ], io_ticks[WRITE]
	ioTicks, timeInQueue        uint64
}

// region is one dm-stats region.
type region struct {
	id               int
	start, end, step uint64 // sectors
	precise          bool
	bounds           []uint64 // histogram boundaries, strictly increasing
	programID        string
	aux              atomic.Pointer[string]
	areas            []area
	hist             []uint64 // len(areas) × (len(bounds)+1), guarded by the area locks
	mem              *regionMem
}

// regionMem is the memory a region holds against the cap. It is given back
// when the region is deleted, or when the region is collected after its
// device went away.
type regionMem struct {
	bytes uint64
	freed bool // guarded by ctlMu
}

func (m *regionMem) free() {
	if !m.freed {
		m.freed = true
		memUsed -= m.bytes
	}
}

func (rg *region) nbuckets() int {
	if len(rg.bounds) == 0 {
		return 0
	}
	return len(rg.bounds) + 1
}

// now converts the clock's nanoseconds to the region's time unit.
func (rg *region) now(ns int64) uint64 {
	if rg.precise {
		return uint64(ns)
	}
	return uint64(ns / TickNs)
}

// round is the kernel's dm_stat_round; the caller holds a.mu.
func (a *area) round(now uint64) {
	if now <= a.stamp {
		return
	}
	diff := now - a.stamp
	r, w := a.inflight[0], a.inflight[1]
	if r != 0 {
		a.c.busy[0] += diff
	}
	if w != 0 {
		a.c.busy[1] += diff
	}
	if r+w != 0 {
		a.c.ioTicks += diff
		a.c.timeInQueue += uint64(r+w) * diff
	}
	a.stamp = now
}

// account is the kernel's __dm_stat_bio: the piece's sectors are cut at area
// boundaries and each part is counted in its area.
func (rg *region) account(r RegionRef, end bool, nowNs, startNs int64) {
	if r.end <= rg.start || r.sector >= rg.end {
		return
	}
	var rel, todo uint64
	if r.sector < rg.start {
		rel, todo = 0, r.end-rg.start
	} else {
		rel, todo = r.sector-rg.start, r.end-r.sector
	}
	if r.end > rg.end {
		todo -= r.end - rg.end
	}
	idx := 0
	if r.write {
		idx = 1
	}
	now := rg.now(nowNs)
	var dur uint64
	if end {
		if rg.precise {
			dur = uint64(max(nowNs-startNs, 0))
		} else {
			dur = uint64(max(nowNs/TickNs-startNs/TickNs, 0))
		}
	}
	entry, offset := rel/rg.step, rel%rg.step
	for todo > 0 && entry < uint64(len(rg.areas)) {
		frag := min(todo, rg.step-offset)
		a := &rg.areas[entry]
		a.mu.Lock()
		a.round(now)
		if !end {
			a.inflight[idx]++
		} else {
			a.inflight[idx]--
			a.c.sectors[idx] += frag
			a.c.ios[idx]++
			if r.merged {
				a.c.merges[idx]++
			}
			a.c.ticks[idx] += dur
			if nb := rg.nbuckets(); nb > 0 {
				rg.hist[int(entry)*nb+histBucket(rg.bounds, dur)]++
			}
		}
		a.mu.Unlock()
		todo -= frag
		entry++
		offset = 0
	}
}

// histBucket returns the bucket of duration d: the number of boundaries at or
// below d (bucket 0 holds d < b1, the last one d >= bn).
func histBucket(bounds []uint64, d uint64) int {
	lo, hi := 0, len(bounds)+1
	for lo+1 < hi {
		mid := (lo + hi) / 2
		if bounds[mid-1] > d {
			hi = mid
		} else {
			lo = mid
		}
	}
	return lo
}

// RegionSpec describes a region to create.
type RegionSpec struct {
	Start, Len, Step uint64 // sectors; Len and Step at least 1
	Precise          bool   // precise_timestamps: times in ns instead of ms
	Bounds           []uint64
	ProgramID, Aux   string // "-" when not given
}

// areaBytes is the memory one area costs, for the kernel's memory cap.
const areaBytes = uint64(unsafe.Sizeof(area{}))

// ctlMu serialises the dm-stats control operations of all devices (the
// kernel's stats->mutex); the I/O path never takes it.
var ctlMu sync.Mutex

// memUsed is the memory of all live regions, capped at 1/4 of RAM as the
// kernel caps it (shared_memory_amount).
var memUsed uint64

// memLimit returns the cap on memUsed; tests may replace it.
var memLimit = func() uint64 { return totalRAM() / 4 }

// StatsCreate creates a region and returns its id, the smallest unused one.
// Errors: EINVAL for an empty range or a zero step, EOVERFLOW for more than
// MaxAreas areas, ENOMEM past the memory cap, ENFILE when no id is left.
func (d *Disk) StatsCreate(sp RegionSpec) (int, error) {
	end := sp.Start + sp.Len
	if sp.Len == 0 || end < sp.Start || sp.Step == 0 {
		return -1, &StatsError{Reason: fmt.Sprintf("%d+%d step %d: empty range or zero step", sp.Start, sp.Len, sp.Step), Errno: syscall.EINVAL}
	}
	n := sp.Len / sp.Step
	if sp.Len%sp.Step != 0 {
		n++
	}
	if n > MaxAreas {
		return -1, &StatsError{Reason: fmt.Sprintf("%d areas, more than %d", n, MaxAreas), Errno: syscall.EOVERFLOW}
	}
	nb := uint64(0)
	if len(sp.Bounds) > 0 {
		nb = uint64(len(sp.Bounds) + 1)
	}
	mem := n*areaBytes + n*nb*8 + uint64(len(sp.Bounds))*8
	ctlMu.Lock()
	defer ctlMu.Unlock()
	if memUsed+mem < memUsed || memUsed+mem > memLimit() {
		return -1, &StatsError{Reason: fmt.Sprintf("%d areas need %d bytes, over the limit of a quarter of RAM", n, mem), Errno: syscall.ENOMEM}
	}
	old := d.regions.Load()
	var regions []*region
	if old != nil {
		regions = old.regions
	}
	if d.statsLast == nil {
		d.statsLast = new(atomic.Uint32)
	}
	id := 0
	for _, r := range regions {
		if r.id > id {
			break
		}
		if id == maxRegionID {
			return -1, &StatsError{Reason: "too many regions", Errno: syscall.ENFILE}
		}
		id++
	}
	rg := &region{id: id, start: sp.Start, end: end, step: sp.Step, precise: sp.Precise,
		bounds: slices.Clone(sp.Bounds), programID: sp.ProgramID, areas: make([]area, n), mem: &regionMem{bytes: mem}}
	runtime.AddCleanup(rg, func(m *regionMem) {
		ctlMu.Lock()
		m.free()
		ctlMu.Unlock()
	}, rg.mem)
	if nb > 0 {
		rg.hist = make([]uint64, n*nb)
	}
	aux := sp.Aux
	rg.aux.Store(&aux)
	memUsed += mem
	nr := make([]*region, 0, len(regions)+1)
	nr = append(nr, regions...)
	nr = append(nr, rg)
	slices.SortFunc(nr, func(a, b *region) int { return a.id - b.id })
	d.regions.Store(&regionSet{regions: nr, last: d.statsLast})
	return id, nil
}

// find returns the region id; the caller holds ctlMu.
func (d *Disk) find(id int) *region {
	if s := d.regions.Load(); s != nil {
		for _, r := range s.regions {
			if r.id == id {
				return r
			}
		}
	}
	return nil
}

func noRegion(id int) error {
	return &StatsError{Reason: fmt.Sprintf("region %d", id), Errno: syscall.ENOENT}
}

// StatsDelete deletes region id (ENOENT if there is none). With the last
// region gone, the device is back on the no-region path.
func (d *Disk) StatsDelete(id int) error {
	ctlMu.Lock()
	defer ctlMu.Unlock()
	old := d.regions.Load()
	rg := d.find(id)
	if rg == nil {
		return noRegion(id)
	}
	rg.mem.free()
	nr := slices.DeleteFunc(slices.Clone(old.regions), func(r *region) bool { return r == rg })
	if len(nr) == 0 {
		d.regions.Store(nil)
	} else {
		d.regions.Store(&regionSet{regions: nr, last: old.last})
	}
	return nil
}

// StatsDeleteAll deletes every region of the device, as removing the device does.
func (d *Disk) StatsDeleteAll() {
	ctlMu.Lock()
	defer ctlMu.Unlock()
	if old := d.regions.Swap(nil); old != nil {
		for _, r := range old.regions {
			r.mem.free()
		}
	}
}

// StatsClear zeroes every counter of region id except the in-flight counts
// (ENOENT if there is no such region).
func (d *Disk) StatsClear(id int) error {
	ctlMu.Lock()
	defer ctlMu.Unlock()
	rg := d.find(id)
	if rg == nil {
		return noRegion(id)
	}
	now := rg.now(d.clock.Nanotime())
	for i := range rg.areas {
		rg.snapArea(i, now, true)
	}
	return nil
}

// StatsSetAux replaces the aux_data of region id (ENOENT if there is none).
func (d *Disk) StatsSetAux(id int, aux string) error {
	ctlMu.Lock()
	defer ctlMu.Unlock()
	rg := d.find(id)
	if rg == nil {
		return noRegion(id)
	}
	rg.aux.Store(&aux)
	return nil
}

// StatsList returns the @stats_list lines of the regions whose program_id is
// program, or of all regions if all is set.
func (d *Disk) StatsList(program string, all bool) string {
	ctlMu.Lock()
	defer ctlMu.Unlock()
	s := d.regions.Load()
	if s == nil {
		return ""
	}
	var b []byte
	for _, r := range s.regions {
		if !all && r.programID != program {
			continue
		}
		b = strconv.AppendInt(b, int64(r.id), 10)
		b = append(b, ": "...)
		b = strconv.AppendUint(b, r.start, 10)
		b = append(b, '+')
		b = strconv.AppendUint(b, r.end-r.start, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, r.step, 10)
		b = append(b, ' ')
		b = append(b, r.programID...)
		b = append(b, ' ')
		b = append(b, *r.aux.Load()...)
		if r.precise {
			b = append(b, " precise_timestamps"...)
		}
		if len(r.bounds) > 0 {
			b = append(b, " histogram:"...)
			for i, v := range r.bounds {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendUint(b, v, 10)
			}
		}
		b = append(b, '\n')
	}
	return string(b)
}

// areaSnap is one area's counters at one moment.
type areaSnap struct {
	c        areaCounters
	inflight int64
	hist     []uint64
}

// snapArea rounds area i to now and returns its counters; with clear it
// then zeroes them (not the in-flight counts), under the area's lock.
func (rg *region) snapArea(i int, now uint64, reset bool) areaSnap {
	a := &rg.areas[i]
	nb := rg.nbuckets()
	a.mu.Lock()
	a.round(now)
	s := areaSnap{c: a.c, inflight: a.inflight[0] + a.inflight[1]}
	if nb > 0 {
		h := rg.hist[i*nb : (i+1)*nb]
		s.hist = slices.Clone(h)
		if reset {
			clear(h)
		}
	}
	if reset {
		a.c = areaCounters{}
	}
	a.mu.Unlock()
	return s
}

// StatsPrint returns the @stats_print lines of the areas [first, first+n) of
// region id (clipped to the region; n = 0 prints nothing), and with clear
// zeroes each printed area as it is read. ENOENT if there is no such region.
func (d *Disk) StatsPrint(id int, first, n uint64, reset bool) (string, error) {
	ctlMu.Lock()
	defer ctlMu.Unlock()
	rg := d.find(id)
	if rg == nil {
		return "", noRegion(id)
	}
	total := uint64(len(rg.areas))
	last := first + n
	if last < first || last > total {
		last = total
	}
	first = min(first, last)
	now := rg.now(d.clock.Nanotime())
	var b []byte
	for x := first; x < last; x++ {
		s := rg.snapArea(int(x), now, reset)
		b = strconv.AppendUint(b, rg.start+x*rg.step, 10)
		b = append(b, '+')
		b = strconv.AppendUint(b, rg.step, 10)
		c := &s.c
		for _, v := range [...]uint64{c.ios[0], c.merges[0], c.sectors[0], c.ticks[0],
			c.ios[1], c.merges[1], c.sectors[1], c.ticks[1]} {
			b = append(b, ' ')
			b = strconv.AppendUint(b, v, 10)
		}
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(int32(s.inflight)), 10)
		for _, v := range [...]uint64{c.ioTicks, c.timeInQueue, c.busy[0], c.busy[1]} {
			b = append(b, ' ')
			b = strconv.AppendUint(b, v, 10)
		}
		for i, v := range s.hist {
			if i == 0 {
				b = append(b, ' ')
			} else {
				b = append(b, ':')
			}
			b = strconv.AppendUint(b, v, 10)
		}
		b = append(b, '\n')
	}
	return string(b), nil
}

// HasRegions reports whether the device has at least one dm-stats region.
func (d *Disk) HasRegions() bool { return d.regions.Load() != nil }

// StatsError is a failed dm-stats operation: the reason and the kernel's errno.
type StatsError struct {
	Reason string
	Errno  syscall.Errno
}

func (e *StatsError) Error() string {
	if e.Reason == "" {
		return e.Errno.Error()
	}
	return e.Reason + ": " + e.Errno.Error()
}

// Unwrap returns the errno.
func (e *StatsError) Unwrap() error { return e.Errno }
