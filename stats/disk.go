// Package stats keeps the I/O counters of mapped devices and renders them in the
// kernel's /proc/diskstats, /sys/block/X/stat and /sys/block/X/inflight formats,
// as Prometheus metrics, and as iostat-style rates.
//
// # Accounting rules
//
// A Disk follows the accounting of a bio-based device-mapper device
// (drivers/md/dm.c: dm_io_acct; block/blk-core.c: bdev_start_io_acct,
// bdev_end_io_acct): the device layer calls Start when a piece is passed on and
// Done when it completes. Counts, sectors and durations are added at
// completion; in-flight counts go up at Start and down at Done; an empty flush
// is a write of 0 sectors and a discard is its own group but a write in the
// in-flight counts.
//
// # Scalability
//
// The counters live in cache-line-padded shards, so that concurrent I/O on many
// cores does not write a shared cache line, as the kernel keeps its in-flight
// counts per CPU (block/genhd.c: part_in_flight, bdev_count_inflight since
// 6.16): shared in-flight counters cost a dm-linear device two thirds of its
// IOPS, as reported on the device-mapper list. Shards are summed only when
// someone reads: Snapshot, and the io_ticks update, which sums the in-flight
// counts at most once per tick per device.
//
// A piece's shard is a hash of its start time (and op), which Start and Done
// are both given: pieces starting at different nanoseconds spread over the
// shards like random picks, but the +1 of Start and the -1 of Done of one piece
// land on the same counter. So no shard's in-flight count is ever negative, and
// a sum taken while pieces come and go is never negative either (unlike
// per-CPU counters, whose pieces may end on another CPU); it is clamped at 0
// all the same, as the kernel does.
//
// # io_ticks and time_in_queue
//
// io_ticks (field 10, "time spent doing I/O") is kept by the current kernel
// algorithm (block/blk-core.c: update_io_ticks, since 6.10): a stamp in ticks
// of 1 ms moved forward by compare-and-swap; the one caller per tick that wins
// it adds the time since the old stamp if the device was busy (end of an I/O,
// or something in flight). Readers bring io_ticks up to date while I/O is in
// flight, so a hung I/O shows 100% busy. time_in_queue (field 11) is the sum of
// the durations of completed I/Os, kept in nanoseconds and divided once when
// printed.
package stats

import (
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/ioop"
)

// Group is a statistics group of the kernel's disk_stats: the ios, sectors and
// nsecs arrays are indexed by it.
type Group uint8

const (
	GroupRead    Group = iota // reads
	GroupWrite                // writes, write-zeroes and empty flushes
	GroupDiscard              // discards
	NumGroups    = 3
)

var groupNames = [NumGroups]string{"read", "write", "discard"}

// String returns "read", "write" or "discard".
func (g Group) String() string {
	if int(g) < len(groupNames) {
		return groupNames[g]
	}
	return "group?"
}

// groupOf returns the statistics group op is counted in: discards in
// DISCARD, reads in READ, and everything else (writes, write-zeroes and
// empty flushes, counted as writes of 0 sectors as bio-based dm does; the
// kernel's flush fields 16 and 17 stay 0) in WRITE.
func groupOf(op ioop.Op) Group {
	switch op {
	case ioop.Read:
		return GroupRead
	case ioop.Discard:
		return GroupDiscard
	}
	return GroupWrite
}

// dirOf is op's direction in the in-flight counts: 0 for reads, 1 for
// everything else (ioop.Op.IsWrite).
func dirOf(op ioop.Op) int {
	if op == ioop.Read {
		return 0
	}
	return 1
}

// TickNs is the io_ticks resolution in nanoseconds: 1 ms, as a kernel with HZ=1000.
const TickNs = int64(time.Millisecond)

// latencyBoundsNs are the upper bounds (inclusive, Prometheus "le") of the
// latency histogram buckets; a last bucket holds everything slower.
var latencyBoundsNs = [...]int64{
	5e3, 10e3, 25e3, 50e3, 100e3, 250e3, 500e3, // 5 µs .. 500 µs
	1e6, 2.5e6, 5e6, 10e6, 25e6, 50e6, 100e6, 250e6, 500e6, // 1 ms .. 500 ms
	1e9, 2.5e9, 5e9, 10e9, // 1 s .. 10 s
}

// NumBuckets is the number of latency histogram buckets, the last one being +Inf.
const NumBuckets = len(latencyBoundsNs) + 1

// LatencyBounds returns the upper bounds of the latency histogram buckets in
// seconds, without the final +Inf bucket.
func LatencyBounds() []float64 {
	b := make([]float64, len(latencyBoundsNs))
	for i, ns := range latencyBoundsNs {
		b[i] = float64(ns) / 1e9
	}
	return b
}

// bucketStart[L] is the first bucket whose bound is >= 2^(L-1), the smallest
// duration of bit length L; the search for a bucket starts there and takes at
// most two steps, since the bounds grow by at most 2.5x.
var bucketStart [65]uint8

func init() {
	for l := 1; l <= 64; l++ {
		lo := uint64(1) << (l - 1)
		i := 0
		for i < len(latencyBoundsNs) && uint64(latencyBoundsNs[i]) < lo {
			i++
		}
		bucketStart[l] = uint8(i)
	}
}

// bucketOf returns the histogram bucket of a duration.
func bucketOf(ns int64) int {
	if ns <= 0 {
		return 0
	}
	i := int(bucketStart[bits.Len64(uint64(ns))])
	for i < len(latencyBoundsNs) && ns > latencyBoundsNs[i] {
		i++
	}
	return i
}

// groupCounters are the counters of one group in one shard. The number of
// completed I/Os is the sum of the histogram buckets, so that a histogram's
// count always equals the completed counter and Done does one add less.
type groupCounters struct {
	sectors atomic.Uint64
	nsecs   atomic.Uint64
	hist    [NumBuckets]atomic.Uint64
}

type counters struct {
	inflight [2]atomic.Int64 // reads, writes; never negative (see shardOf)
	g        [NumGroups]groupCounters
}

const cacheLine = 64

// shard is one set of counters, padded so that the counters of two shards are
// at least a cache line apart whatever the alignment of the array.
type shard struct {
	counters
	_ [cacheLine + (cacheLine-unsafe.Sizeof(counters{})%cacheLine)%cacheLine]byte
}

// Disk is the set of counters of one mapped device. Its methods may be called
// concurrently.
type Disk struct {
	clock  clock.Clock
	shift  uint // 64 - log2(len(shards))
	shards []shard
	// regions are the dm-stats regions (nil while there are none): the
	// one load the accounting path pays for dm-stats.
	regions atomic.Pointer[regionSet]
	// statsLast is the direction of the previous piece counted for
	// dm-stats (regionSet.last), made by the first region and kept for the
	// device's life, as the kernel's stats->last; guarded by ctlMu.
	statsLast *atomic.Uint32
	_         [cacheLine]byte
	// stamp (in ticks) is read by every Start and Done but written at most
	// once per tick; io_ticks is written by the winner of that write.
	stamp   atomic.Int64
	ioTicks atomic.Uint64
	_       [cacheLine]byte
}

// shardCount returns the number of shards: the power of two at or above twice
// the number of Ps (or of CPUs, if GOMAXPROCS is lower now and is raised
// later), so that goroutines running at the same time seldom share a shard.
func shardCount() int {
	p := 2 * max(runtime.GOMAXPROCS(0), runtime.NumCPU())
	n := 1
	for n < p {
		n <<= 1
	}
	return n
}

// NewDisk returns zeroed counters that take time from c (clock.System if nil).
func NewDisk(c clock.Clock) *Disk {
	if c == nil {
		c = clock.System
	}
	n := shardCount()
	return &Disk{clock: c, shift: uint(64 - bits.TrailingZeros(uint(n))), shards: make([]shard, n)}
}

// Now returns the disk clock's current time in nanoseconds.
func (d *Disk) Now() int64 {
	if !Accounting {
		return 0
	}
	return d.clock.Nanotime()
}

// shardOf returns the shard of the piece of kind op that started at startNs:
// the top bits of a Fibonacci hash, so that consecutive nanoseconds spread.
func (d *Disk) shardOf(op ioop.Op, startNs int64) *counters {
	h := (uint64(startNs) + uint64(op)) * 0x9E3779B97F4A7C15
	return &d.shards[h>>d.shift].counters
}

// Start begins accounting of one piece that arrived at startNs (the disk
// clock's time, as returned by Now): it updates io_ticks as of startNs, then
// counts the piece in flight.
func (d *Disk) Start(op ioop.Op, startNs int64) {
	if !Accounting {
		return
	}
	d.updateIOTicks(startNs/TickNs, false)
	d.shardOf(op, startNs).inflight[dirOf(op)].Add(1)
}

// Done ends accounting of one piece that Start counted, given the same op and
// startNs, at the clock's current time: it updates io_ticks, adds one
// completed I/O with its sectors and its duration since startNs to op's group,
// and takes the piece out of flight.
func (d *Disk) Done(op ioop.Op, sectors uint64, startNs int64) {
	if !Accounting {
		return
	}
	now := d.clock.Nanotime()
	d.updateIOTicks(now/TickNs, true)
	dur := now - startNs
	if dur < 0 {
		dur = 0
	}
	s := d.shardOf(op, startNs)
	g := &s.g[groupOf(op)]
	g.hist[bucketOf(dur)].Add(1)
	if sectors != 0 {
		g.sectors.Add(sectors)
	}
	g.nsecs.Add(uint64(dur))
	s.inflight[dirOf(op)].Add(-1)
}

// updateIOTicks is block/blk-core.c: update_io_ticks. At most one caller per
// tick gets past the compare-and-swap, so the in-flight sum is computed at most
// once per tick.
func (d *Disk) updateIOTicks(now int64, end bool) {
	stamp := d.stamp.Load()
	if now <= stamp || !d.stamp.CompareAndSwap(stamp, now) {
		return
	}
	if end {
		d.ioTicks.Add(uint64(now - stamp))
		return
	}
	if r, w := d.inflightRaw(); r+w > 0 {
		d.ioTicks.Add(uint64(now - stamp))
	}
}

// inflightRaw sums the per-shard in-flight counts. Each shard's count is
// exact and never negative; the sum counts each piece that was in flight when
// its shard was read.
func (d *Disk) inflightRaw() (r, w int64) {
	for i := range d.shards {
		s := &d.shards[i]
		r += s.inflight[0].Load()
		w += s.inflight[1].Load()
	}
	return r, w
}

// InFlight returns the pieces in flight for reads and writes (discards and
// flushes count as writes), each clamped at 0: the /sys/block/X/inflight numbers.
func (d *Disk) InFlight() (reads, writes uint32) {
	r, w := d.inflightRaw()
	return clampU32(r), clampU32(w)
}

func clampU32(v int64) uint32 {
	if v < 0 {
		return 0
	}
	return uint32(v)
}

// Snapshot is the sum of a Disk's counters at one moment.
type Snapshot struct {
	IOs     [NumGroups]uint64 // completed I/Os
	Sectors [NumGroups]uint64 // 512-byte sectors of the completed I/Os
	Nsecs   [NumGroups]uint64 // summed durations of the completed I/Os, ns

	InFlight      [2]uint32 // reads, writes in flight, each clamped at 0
	InFlightTotal uint32    // both directions summed, then clamped at 0 (field 9)
	IOTicks       uint64    // busy time in ticks of TickNs (field 10)

	// Latency holds the completed I/Os of each group by duration: bucket i
	// counts durations in (bound[i-1], bound[i]] of LatencyBounds, the last one
	// those above the last bound. IOs[g] is the sum of Latency[g].
	Latency [NumGroups][NumBuckets]uint64
}

// Snapshot sums the shards. As a kernel stats reader does, it first brings
// io_ticks up to date if anything is in flight (block/genhd.c: part_stat_show
// calls update_io_ticks with end set).
func (d *Disk) Snapshot() Snapshot {
	var s Snapshot
	r, w := d.inflightRaw()
	if r+w > 0 {
		d.updateIOTicks(d.clock.Nanotime()/TickNs, true)
	}
	s.InFlight = [2]uint32{clampU32(r), clampU32(w)}
	s.InFlightTotal = clampU32(r + w)
	for i := range d.shards {
		sh := &d.shards[i]
		for g := range sh.g {
			gc := &sh.g[g]
			s.Sectors[g] += gc.sectors.Load()
			s.Nsecs[g] += gc.nsecs.Load()
			for b := range gc.hist {
				s.Latency[g][b] += gc.hist[b].Load()
			}
		}
	}
	for g := range s.Latency {
		for _, n := range s.Latency[g] {
			s.IOs[g] += n
		}
	}
	s.IOTicks = d.ioTicks.Load()
	return s
}

// ms converts nanoseconds to whole milliseconds truncated to 32 bits, as the
// kernel prints its time fields.
func ms(ns uint64) uint64 { return uint64(uint32(ns / 1e6)) }

// Fields returns the 17 numbers of a /proc/diskstats line after major, minor
// and name (also the /sys/block/X/stat numbers), computed as block/genhd.c:
// diskstats_show does: merges and the flush fields are 0, each time field is
// floor(ns/1e6) truncated to 32 bits, and field 11 divides the sum of all
// durations once.
func (s *Snapshot) Fields() [17]uint64 {
	var f [17]uint64
	f[0] = s.IOs[GroupRead]
	f[2] = s.Sectors[GroupRead]
	f[3] = ms(s.Nsecs[GroupRead])
	f[4] = s.IOs[GroupWrite]
	f[6] = s.Sectors[GroupWrite]
	f[7] = ms(s.Nsecs[GroupWrite])
	f[8] = uint64(s.InFlightTotal)
	f[9] = uint64(uint32(s.IOTicks * uint64(TickNs/1e6)))
	f[10] = ms(s.Nsecs[GroupRead] + s.Nsecs[GroupWrite] + s.Nsecs[GroupDiscard])
	f[11] = s.IOs[GroupDiscard]
	f[13] = s.Sectors[GroupDiscard]
	f[14] = ms(s.Nsecs[GroupDiscard])
	return f
}
