package fs

import (
	"context"
	"math/bits"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/fs/uring"
)

func TestPlanMemory(t *testing.T) {
	for _, limit := range []int64{1 << 20, 8 << 20, 32 << 20, 48 << 20, 64 << 20, 96 << 20, 128 << 20, 256 << 20, 600 << 20, 1 << 30, 64 << 30} {
		p := PlanMemory(Options{MemoryLimit: limit})
		t.Logf("limit %d MiB: %d KiB x %d in flight, %d readers, uring %d x %d, bound %.1f MiB",
			limit>>20, p.MaxWrite>>10, p.MaxBackground, p.Readers, p.URingQueues, p.URingDepth, float64(p.Bound)/(1<<20))
		if p.Limit != limit || p.Budget != limit/2 {
			t.Errorf("limit %d: Limit %d, Budget %d", limit, p.Limit, p.Budget)
		}
		if p.MaxWrite < minRequest || p.MaxWrite > maxRequest || bits.OnesCount(uint(p.MaxWrite)) != 1 {
			t.Errorf("limit %d: MaxWrite %d is not a power of two in [64 KiB, 1 MiB]", limit, p.MaxWrite)
		}
		if p.MaxBackground < 16 || p.MaxBackground > maxBackground {
			t.Errorf("limit %d: MaxBackground %d outside [16, 256]", limit, p.MaxBackground)
		}
		// What go-fuse admits is what the kernel can have in flight.
		if want := (p.MaxBackground + p.Readers) * (p.MaxWrite + requestSlack); p.InflightBytes != want {
			t.Errorf("limit %d: InflightBytes %d, want %d", limit, p.InflightBytes, want)
		}
		if p.URingDepth < 2 || p.URingDepth > uring.DefaultDepth {
			t.Errorf("limit %d: URingDepth %d outside [2, %d]", limit, p.URingDepth, uring.DefaultDepth)
		}
		// Above the smallest plan (64 KiB x 16), the bound stays within
		// the budget on both transports.
		if limit >= 2*int64(16+p.Readers)*(minRequest+requestSlack) && p.Bound > p.Budget {
			t.Errorf("limit %d: bound %d above the budget %d", limit, p.Bound, p.Budget)
		}
		if p.MaxBackground < minBackground && p.MaxWrite != minRequest {
			t.Errorf("limit %d: MaxBackground %d below %d while requests (%d) could be smaller", limit, p.MaxBackground, minBackground, p.MaxWrite)
		}
		if p.MaxWrite > goodRequest && p.MaxBackground < maxBackground {
			t.Errorf("limit %d: requests of %d KiB while MaxBackground %d is below %d", limit, p.MaxWrite>>10, p.MaxBackground, maxBackground)
		}
	}
}

func TestPlanMemoryMonotonic(t *testing.T) {
	prev := PlanMemory(Options{MemoryLimit: 1 << 20})
	for limit := int64(2 << 20); limit <= 2<<30; limit += 1 << 20 {
		p := PlanMemory(Options{MemoryLimit: limit})
		if p.MaxWrite < prev.MaxWrite || p.Bound < prev.Bound && p.MaxWrite == prev.MaxWrite {
			t.Fatalf("limit %d MiB: %d KiB, bound %d; %d MiB had %d KiB, bound %d", limit>>20, p.MaxWrite>>10, p.Bound, (limit>>20)-1, prev.MaxWrite>>10, prev.Bound)
		}
		prev = p
	}
	if prev.MaxWrite != maxRequest || prev.MaxBackground != maxBackground {
		t.Errorf("2 GiB: %d KiB x %d, want 1 MiB x 256", prev.MaxWrite>>10, prev.MaxBackground)
	}
}

func TestPlanMemoryDefaults(t *testing.T) {
	def := PlanMemory(Options{})
	if def.Limit != DefaultMemoryLimit {
		t.Errorf("default limit %d, want %d", def.Limit, DefaultMemoryLimit)
	}
	if def != PlanMemory(Options{MemoryLimit: DefaultMemoryLimit}) {
		t.Errorf("zero MemoryLimit does not plan as DefaultMemoryLimit")
	}
	off := PlanMemory(Options{MemoryLimit: -1})
	if off.Limit != 0 || off.Budget != 0 || off.InflightBytes != 0 || off.MaxWrite != maxRequest || off.MaxBackground != maxBackground {
		t.Errorf("no limit: %+v, want 1 MiB requests, 256 in flight, go-fuse unlimited", off)
	}
	// Explicit settings are kept.
	p := PlanMemory(Options{MaxBackground: 32, URingDepth: 7})
	if p.MaxBackground != 32 || p.URingDepth != 7 {
		t.Errorf("explicit MaxBackground 32, URingDepth 7: got %d, %d", p.MaxBackground, p.URingDepth)
	}
	if p.MaxWrite <= def.MaxWrite || p.Bound > p.Budget {
		t.Errorf("MaxBackground 32 leaves room for larger requests than %d KiB: got %d KiB, bound %d of %d", def.MaxWrite>>10, p.MaxWrite>>10, p.Bound, p.Budget)
	}
	mo := MountOptions(Options{})
	if mo.MaxWrite != def.MaxWrite || mo.MaxBackground != def.MaxBackground || mo.MaxInflightRequestBytes != def.InflightBytes {
		t.Errorf("MountOptions: MaxWrite %d, MaxBackground %d, MaxInflightRequestBytes %d; plan %+v",
			mo.MaxWrite, mo.MaxBackground, mo.MaxInflightRequestBytes, def)
	}
}

func TestReleaser(t *testing.T) {
	r := &releaser{after: 4 * time.Second, done: true} // a tick is 1 s
	var count uint64
	releases := 0
	// idle runs n ticks with the given activity and counts the releases.
	tick := func(n int, inFlight bool) {
		for range n {
			if r.observe(count, inFlight) {
				releases++
			}
		}
	}
	want := func(n int, when string) {
		t.Helper()
		if releases != n {
			t.Fatalf("%s: %d releases, want %d", when, releases, n)
		}
	}
	tick(10, false)
	want(0, "idle before any I/O")
	count++
	tick(1, false) // the tick that sees the I/O
	tick(3, false)
	want(0, "3 s after the I/O")
	tick(1, false)
	want(1, "4 s after the I/O")
	tick(20, false)
	want(1, "still idle")
	tick(10, true)
	want(1, "I/O in flight, none completing")
	tick(4, false)
	want(2, "4 s after the I/O in flight ended")
	for range 10 {
		count++
		tick(1, false)
	}
	want(2, "busy")
	tick(4, false)
	want(3, "4 s after the busy spell")

	// A tick is at most a second, and at least four fit in the wait.
	for _, c := range []struct{ after, tick time.Duration }{
		{time.Minute, time.Second}, {5 * time.Second, time.Second}, {2 * time.Second, 500 * time.Millisecond},
	} {
		if got := (&releaser{after: c.after}).tick(); got != c.tick {
			t.Errorf("after %v: tick %v, want %v", c.after, got, c.tick)
		}
	}
}

// TestReleaserParks: the releaser looks at the devices only between a
// request and the release that follows it; before the first request and
// after a release it waits for the next request without a timer.
func TestReleaserParks(t *testing.T) {
	var calls, count atomic.Uint64
	released := make(chan struct{}, 4)
	r := &releaser{after: 40 * time.Millisecond, done: true, kick: make(chan struct{}, 1),
		activity: func() (uint64, bool) { calls.Add(1); return count.Load(), false },
		release:  func() { released <- struct{}{} }}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() { r.run(ctx); close(ended) }()
	defer func() { cancel(); <-ended }()

	quiet := func(when string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !r.parked.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not parked after 5 s", when)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(3 * r.tick()) // a park that a stale request undid
		n := calls.Load()
		time.Sleep(5 * r.tick())
		if got := calls.Load(); got != n || !r.parked.Load() {
			t.Errorf("%s: %d looks at the devices in 5 ticks, parked %v", when, got-n, r.parked.Load())
		}
	}
	burst := func(when string) {
		t.Helper()
		for range 3 {
			r.request()
			count.Add(1)
		}
		select {
		case <-released:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no release 5 s after a request", when)
		}
	}
	quiet("before any request")
	if calls.Load() != 0 {
		t.Errorf("%d looks at the devices before any request", calls.Load())
	}
	burst("first burst")
	quiet("after the first release")
	burst("second burst")
	quiet("after the second release")
	if n := len(released); n != 0 {
		t.Errorf("%d releases more than bursts", n)
	}
}
