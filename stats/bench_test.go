package stats

import (
	"sync/atomic"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/ioop"
)

// sharedDisk is the baseline for the benchmarks: the same accounting with one
// shared set of atomic counters, as the kernel's bio-based in-flight counters
// were before they went per-CPU. Every I/O writes the same cache lines.
type sharedDisk struct {
	clock    clock.Clock
	stamp    atomic.Int64
	ioTicks  atomic.Uint64
	inflight [2]atomic.Int64
	ios      [NumGroups]atomic.Uint64
	sectors  [NumGroups]atomic.Uint64
	nsecs    [NumGroups]atomic.Uint64
	hist     [NumGroups][NumBuckets]atomic.Uint64
}

func (d *sharedDisk) updateIOTicks(now int64, end bool) {
	stamp := d.stamp.Load()
	if now > stamp && d.stamp.CompareAndSwap(stamp, now) {
		if end || d.inflight[0].Load()+d.inflight[1].Load() > 0 {
			d.ioTicks.Add(uint64(now - stamp))
		}
	}
}

func (d *sharedDisk) Start(op ioop.Op, startNs int64) {
	d.updateIOTicks(startNs/TickNs, false)
	d.inflight[dirOf(op)].Add(1)
}

func (d *sharedDisk) Done(op ioop.Op, sectors uint64, startNs int64) {
	now := d.clock.Nanotime()
	d.updateIOTicks(now/TickNs, true)
	g := groupOf(op)
	dur := max(now-startNs, 0)
	d.ios[g].Add(1)
	d.hist[g][bucketOf(dur)].Add(1)
	d.sectors[g].Add(sectors)
	d.nsecs[g].Add(uint64(dur))
	d.inflight[dirOf(op)].Add(-1)
}

type accounter interface {
	Start(op ioop.Op, startNs int64)
	Done(op ioop.Op, sectors uint64, startNs int64)
}

// benchStartDone measures one I/O's accounting (clock read, Start, Done) with
// b.RunParallel; run with -cpu 1,2,4,8 to see how it scales.
func benchStartDone(b *testing.B, a accounter, clk clock.Clock) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t0 := clk.Nanotime()
			a.Start(ioop.Read, t0)
			a.Done(ioop.Read, 8, t0)
		}
	})
}

func BenchmarkStartDone(b *testing.B) {
	b.Run("sharded", func(b *testing.B) {
		benchStartDone(b, NewDisk(clock.System), clock.System)
	})
	b.Run("shared", func(b *testing.B) {
		benchStartDone(b, &sharedDisk{clock: clock.System}, clock.System)
	})
}

// BenchmarkStartDoneCounters measures the counters alone: the clock is a fixed
// fake one (a shared read-only word) and each goroutine makes up distinct
// start times, so the system clock's cost (two reads per I/O, which dominate
// BenchmarkStartDone) is left out.
func BenchmarkStartDoneCounters(b *testing.B) {
	run := func(b *testing.B, a accounter) {
		var seed atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			t0 := seed.Add(1 << 40)
			for pb.Next() {
				t0++
				a.Start(ioop.Read, t0)
				a.Done(ioop.Read, 8, t0)
			}
		})
	}
	c := new(clock.Manual)
	c.Set(msNs(1))
	b.Run("sharded", func(b *testing.B) { run(b, NewDisk(c)) })
	b.Run("shared", func(b *testing.B) { run(b, &sharedDisk{clock: c}) })
}

// BenchmarkSnapshot is the cost of one read of the counters (a stats file
// read or a scrape), which sums every shard.
func BenchmarkSnapshot(b *testing.B) {
	d := NewDisk(clock.System)
	d.Start(ioop.Read, d.Now())
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		s := d.Snapshot()
		buf = AppendDiskstats(buf[:0], 253, 0, "linear0", &s)
	}
}
