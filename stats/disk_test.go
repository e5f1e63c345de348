package stats

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/dmfuse/dmfuse/internal/clock"
	goldenfile "github.com/dmfuse/dmfuse/internal/golden"
	"github.com/dmfuse/dmfuse/internal/ioop"
)

func msNs(ms int64) int64 { return ms * int64(time.Millisecond) }

func newFake() (*clock.Manual, *Disk) {
	c := new(clock.Manual)
	return c, NewDisk(c)
}

// golden compares got with testdata/name (golden.Check).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, filepath.Join("testdata", name), got)
}

// doIO does one piece from startMs to endMs on the fake clock.
func doIO(c *clock.Manual, d *Disk, op ioop.Op, sectors uint64, startMs, endMs int64) {
	c.Set(msNs(startMs))
	d.Start(op, msNs(startMs))
	c.Set(msNs(endMs))
	d.Done(op, sectors, msNs(startMs))
}

func checkFiles(t *testing.T, step string, d *Disk) {
	t.Helper()
	s := d.Snapshot()
	golden(t, step+".diskstats.golden", AppendDiskstats(nil, 253, 0, "linear0", &s))
	golden(t, step+".stat.golden", AppendStat(nil, &s))
	golden(t, step+".inflight.golden", AppendInflight(nil, &s))
}

// TestWorkedExample checks the diskstats, stat and inflight lines of a
// bio-based dm device (HZ 1000) byte for byte after each of the workloads A to
// C below.
func TestWorkedExample(t *testing.T) {
	c, d := newFake()

	// A: four sequential 8-sector reads, 3 ms each, 2 ms apart.
	for _, t0 := range []int64{100, 105, 110, 115} {
		doIO(c, d, ioop.Read, 8, t0, t0+3)
	}
	checkFiles(t, "A", d)

	// B: four reads issued together at 200, read at 205, completed at 210.
	c.Set(msNs(200))
	for range 4 {
		d.Start(ioop.Read, msNs(200))
	}
	c.Set(msNs(205))
	checkFiles(t, "B205", d)
	c.Set(msNs(210))
	for range 4 {
		d.Done(ioop.Read, 8, msNs(200))
	}
	checkFiles(t, "B210", d)

	// C: a 16-sector write 300->302, then an empty flush 302->303.
	doIO(c, d, ioop.Write, 16, 300, 302)
	doIO(c, d, ioop.Flush, 0, 302, 303)
	checkFiles(t, "C", d)
}

// Without the read at t=205, the end at 210 adds the 10 ms itself.
func TestWorkedExampleNoReader(t *testing.T) {
	c, d := newFake()
	for _, t0 := range []int64{100, 105, 110, 115} {
		doIO(c, d, ioop.Read, 8, t0, t0+3)
	}
	c.Set(msNs(200))
	for range 4 {
		d.Start(ioop.Read, msNs(200))
	}
	c.Set(msNs(210))
	for range 4 {
		d.Done(ioop.Read, 8, msNs(200))
	}
	s := d.Snapshot()
	golden(t, "B210.diskstats.golden", AppendDiskstats(nil, 253, 0, "linear0", &s))
}

// A hung I/O shows busy time through readers alone, and none of it in
// time_in_queue until it completes.
func TestHungIOBusyThroughReaders(t *testing.T) {
	c, d := newFake()
	c.Set(msNs(1000))
	d.Start(ioop.Write, msNs(1000))
	for _, at := range []int64{1500, 2000, 4000} {
		c.Set(msNs(at))
		s := d.Snapshot()
		f := s.Fields()
		if f[9] != uint64(at-1000) {
			t.Errorf("t=%d: io_ticks %d, want %d", at, f[9], at-1000)
		}
		if f[8] != 1 || f[10] != 0 || f[4] != 0 {
			t.Errorf("t=%d: in flight %d, time_in_queue %d, writes %d; want 1, 0, 0", at, f[8], f[10], f[4])
		}
	}
	c.Set(msNs(5000))
	d.Done(ioop.Write, 8, msNs(1000))
	s := d.Snapshot()
	f := s.Fields()
	if f[9] != 4000 || f[10] != 4000 || f[7] != 4000 || f[4] != 1 || f[8] != 0 {
		t.Errorf("after completion: %v", f)
	}
	// Idle time afterwards adds nothing, even when read.
	c.Set(msNs(9000))
	if s := d.Snapshot(); s.IOTicks != 4000 {
		t.Errorf("idle: io_ticks %d, want 4000", s.IOTicks)
	}
}

// io_ticks counts the time with at least one I/O in flight, exact to a tick,
// whatever the overlap, and does not count idle gaps (the 6.10 algorithm).
func TestIOTicksOverlapAndGaps(t *testing.T) {
	c, d := newFake()
	// Two overlapping reads: 10..20 and 15..30, then a gap, then 50..51.
	c.Set(msNs(10))
	d.Start(ioop.Read, msNs(10))
	c.Set(msNs(15))
	d.Start(ioop.Read, msNs(15))
	c.Set(msNs(20))
	d.Done(ioop.Read, 8, msNs(10))
	c.Set(msNs(30))
	d.Done(ioop.Read, 8, msNs(15))
	doIO(c, d, ioop.Read, 8, 50, 51)
	s := d.Snapshot()
	if s.IOTicks != 21 {
		t.Errorf("io_ticks %d, want 21 (10..30 and 50..51)", s.IOTicks)
	}
	if got := s.Fields()[10]; got != 10+15+1 {
		t.Errorf("time_in_queue %d, want 26", got)
	}
	// A sub-tick I/O that starts and ends within one tick on an idle device
	// adds nothing (its start moves the stamp to that tick); one that crosses a
	// tick boundary adds the tick.
	c.Set(int64(100*time.Millisecond + 100*time.Microsecond))
	t0 := c.Nanotime()
	d.Start(ioop.Read, t0)
	c.Set(int64(100*time.Millisecond + 300*time.Microsecond))
	d.Done(ioop.Read, 1, t0)
	if s = d.Snapshot(); s.IOTicks != 21 {
		t.Errorf("io_ticks %d, want 21", s.IOTicks)
	}
	c.Set(int64(101*time.Millisecond + 900*time.Microsecond))
	t0 = c.Nanotime()
	d.Start(ioop.Read, t0)
	c.Set(int64(102*time.Millisecond + 100*time.Microsecond))
	d.Done(ioop.Read, 1, t0)
	if s = d.Snapshot(); s.IOTicks != 22 {
		t.Errorf("io_ticks %d, want 22", s.IOTicks)
	}
}

// A piece that arrived before the stamp (a delayed I/O whose accounting starts
// late) does not move the stamp back; its duration still counts from arrival.
func TestStartInThePast(t *testing.T) {
	c, d := newFake()
	doIO(c, d, ioop.Read, 8, 100, 101) // stamp 101
	c.Set(msNs(120))
	d.Start(ioop.Write, msNs(90)) // arrived at 90, started at 120
	c.Set(msNs(125))
	d.Done(ioop.Write, 8, msNs(90))
	s := d.Snapshot()
	f := s.Fields()
	if f[7] != 35 {
		t.Errorf("write ms %d, want 35", f[7])
	}
	if s.IOTicks != 1+24 { // 100..101, then the end at 125 adds 125-101
		t.Errorf("io_ticks %d, want 25", s.IOTicks)
	}
}

// Durations are nanoseconds; each time field is floored separately, and field
// 11 divides the sum once, so it can exceed the sum of the others.
func TestTimeFieldsFloorAndOneDivision(t *testing.T) {
	c, d := newFake()
	for _, op := range []ioop.Op{ioop.Read, ioop.Write, ioop.Discard} {
		c.Set(int64(0))
		d.Start(op, 0)
		c.Set(int64(1500 * time.Microsecond))
		d.Done(op, 8, 0)
	}
	s := d.Snapshot()
	f := s.Fields()
	if f[3] != 1 || f[7] != 1 || f[14] != 1 || f[10] != 4 {
		t.Errorf("read/write/discard ms %d %d %d, time_in_queue %d; want 1 1 1 4", f[3], f[7], f[14], f[10])
	}
	if s.Nsecs[GroupRead] != 1500000 {
		t.Errorf("read ns %d", s.Nsecs[GroupRead])
	}
}

// The time fields are truncated to 32 bits, the counters are not.
func TestFieldTruncation(t *testing.T) {
	s := Snapshot{}
	s.IOs[GroupRead] = 1 << 40
	s.Nsecs[GroupRead] = (1<<32 + 7) * 1e6
	s.IOTicks = 1<<32 + 3
	f := s.Fields()
	if f[0] != 1<<40 || f[3] != 7 || f[9] != 3 || f[10] != 7 {
		t.Errorf("fields %v", f)
	}
}

// Discards are their own group but writes in flight; flushes are writes of 0
// sectors; the flush fields stay 0.
func TestGroupsAndDirections(t *testing.T) {
	c, d := newFake()
	c.Set(msNs(10))
	d.Start(ioop.Read, msNs(10))
	d.Start(ioop.Discard, msNs(10))
	d.Start(ioop.Flush, msNs(10))
	d.Start(ioop.Write, msNs(10))
	s := d.Snapshot()
	if s.InFlight != [2]uint32{1, 3} || s.InFlightTotal != 4 {
		t.Errorf("in flight %v total %d, want [1 3] 4", s.InFlight, s.InFlightTotal)
	}
	if r, w := d.InFlight(); r != 1 || w != 3 {
		t.Errorf("InFlight() %d %d", r, w)
	}
	c.Set(msNs(12))
	d.Done(ioop.Read, 8, msNs(10))
	d.Done(ioop.Discard, 2048, msNs(10))
	d.Done(ioop.Flush, 0, msNs(10))
	d.Done(ioop.Write, 16, msNs(10))
	s = d.Snapshot()
	got := string(AppendDiskstats(nil, 253, 3, "dev", &s))
	want := " 253       3 dev 1 0 8 2 2 0 16 4 0 2 8 1 0 2048 2 0 0\n"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if string(AppendInflight(nil, &s)) != "       0        0\n" {
		t.Errorf("inflight %q", AppendInflight(nil, &s))
	}
}

// A negative sum (which the one-shard-per-piece rule prevents) is clamped to 0.
func TestInFlightClamp(t *testing.T) {
	_, d := newFake()
	d.shards[0].inflight[0].Add(-2)
	d.shards[len(d.shards)-1].inflight[1].Add(1)
	s := d.Snapshot()
	if s.InFlight != [2]uint32{0, 1} || s.InFlightTotal != 0 {
		t.Errorf("in flight %v total %d, want [0 1] 0", s.InFlight, s.InFlightTotal)
	}
}

// Pieces that start at different nanoseconds spread over the shards; a
// piece's Start and Done use the same shard.
func TestShardSpread(t *testing.T) {
	_, d := newFake()
	for i := range int64(64 * len(d.shards)) {
		d.Start(ioop.Read, 1e9+i)
	}
	for i := range d.shards {
		if n := d.shards[i].inflight[0].Load(); n < 16 || n > 112 {
			t.Errorf("shard %d has %d of %d pieces", i, n, 64*len(d.shards))
		}
	}
	for i := range int64(64 * len(d.shards)) {
		d.Done(ioop.Read, 1, 1e9+i)
	}
	for i := range d.shards {
		if n := d.shards[i].inflight[0].Load(); n != 0 {
			t.Errorf("shard %d in flight %d", i, n)
		}
	}
}

func TestBuckets(t *testing.T) {
	for _, tc := range []struct {
		ns   int64
		want int
	}{
		{-5, 0}, {0, 0}, {1, 0}, {5000, 0}, {5001, 1}, {10000, 1}, {10001, 2},
		{999_999, 7}, {1_000_000, 7}, {1_000_001, 8}, {10e9, NumBuckets - 2},
		{10e9 + 1, NumBuckets - 1}, {1 << 62, NumBuckets - 1},
	} {
		if got := bucketOf(tc.ns); got != tc.want {
			t.Errorf("bucketOf(%d) = %d, want %d", tc.ns, got, tc.want)
		}
	}
	// Against a plain linear search for many values.
	for ns := int64(1); ns < 1<<40; ns = ns*3/2 + 1 {
		want := 0
		for want < len(latencyBoundsNs) && ns > latencyBoundsNs[want] {
			want++
		}
		if got := bucketOf(ns); got != want {
			t.Fatalf("bucketOf(%d) = %d, want %d", ns, got, want)
		}
	}
}

func TestShardsPadded(t *testing.T) {
	var s shard
	if sz := int(unsafe.Sizeof(s)); sz%cacheLine != 0 || sz-int(unsafe.Sizeof(s.counters)) < cacheLine {
		t.Errorf("shard size %d, counters %d", sz, unsafe.Sizeof(s.counters))
	}
	_, d := newFake()
	if n := len(d.shards); n&(n-1) != 0 || n < 2 {
		t.Errorf("%d shards", n)
	}
}

// Many goroutines hammer the counters while others read; the final totals are
// exact and in-flight returns to 0. Run with -race.
func TestConcurrentExact(t *testing.T) {
	d := NewDisk(nil)
	begin := d.Now()
	const workers, per, queue = 8, 5000, 64
	var stop atomic.Bool
	var readers sync.WaitGroup
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var b []byte
			for !stop.Load() {
				s := d.Snapshot()
				b = AppendDiskstats(b[:0], 253, 0, "x", &s)
				b = AppendStat(b, &s)
				b = AppendInflight(b, &s)
				// Each piece starts and ends on one shard, so no sum
				// is ever negative (no clamping needed).
				if r, w := d.inflightRaw(); r < 0 || w < 0 {
					t.Errorf("negative in-flight sum %d %d", r, w)
					return
				}
				// At most workers+queued+completing pieces are in flight
				// at once; a scan may see each once per shard.
				if s.InFlightTotal > uint32((workers+queue+4)*len(d.shards)) {
					t.Errorf("in flight %d", s.InFlightTotal)
					return
				}
			}
		}()
	}
	// Odd workers complete their pieces on other goroutines, as when an I/O
	// ends on another thread than the one that started it.
	type piece struct {
		op      ioop.Op
		sectors uint64
		t0      int64
	}
	done := make(chan piece, queue)
	var completers sync.WaitGroup
	for range 4 {
		completers.Add(1)
		go func() {
			defer completers.Done()
			for p := range done {
				d.Done(p.op, p.sectors, p.t0)
			}
		}()
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ops := []ioop.Op{ioop.Read, ioop.Write, ioop.Discard, ioop.Flush}
			for i := range per {
				op := ops[(w+i)%4]
				t0 := d.Now()
				d.Start(op, t0)
				if w%2 == 1 {
					done <- piece{op, uint64(i%8 + 1), t0}
				} else {
					d.Done(op, uint64(i%8+1), t0)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	completers.Wait()
	stop.Store(true)
	readers.Wait()

	s := d.Snapshot()
	total := uint64(workers * per)
	if s.IOs[GroupRead]+s.IOs[GroupWrite]+s.IOs[GroupDiscard] != total {
		t.Errorf("ios %v, want total %d", s.IOs, total)
	}
	if s.IOs[GroupRead] != total/4 || s.IOs[GroupDiscard] != total/4 || s.IOs[GroupWrite] != total/2 {
		t.Errorf("ios %v", s.IOs)
	}
	// Sectors: i%8+1 over each worker's i, split by op; check the total.
	var sectors uint64 // every op was given i%8+1 sectors, flushes too
	for range workers {
		for i := range per {
			sectors += uint64(i%8 + 1)
		}
	}
	if got := s.Sectors[0] + s.Sectors[1] + s.Sectors[2]; got != sectors {
		t.Errorf("sectors %d, want %d", got, sectors)
	}
	if s.InFlight != [2]uint32{0, 0} || s.InFlightTotal != 0 {
		t.Errorf("in flight %v %d", s.InFlight, s.InFlightTotal)
	}
	if r, w := d.inflightRaw(); r != 0 || w != 0 {
		t.Errorf("raw in flight %d %d", r, w)
	}
	// Busy time never exceeds the elapsed time (no util above 100%).
	if elapsed := (d.Now()-begin)/TickNs + 1; s.IOTicks > uint64(elapsed) {
		t.Errorf("io_ticks %d > elapsed %d ms", s.IOTicks, elapsed)
	}
}
