package selectors

import (
	"fmt"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
)

func TestHSTWeights(t *testing.T) {
	w := hstWeights(972)
	for i, want := range []uint32{972, 923, 876, 832, 790} {
		if w[i] != want {
			t.Errorf("w[%d] = %d, want %d", i, w[i], want)
		}
	}
	if w[10] != 578 || w[62] != 39 || w[63] != 0 {
		t.Errorf("w[10], w[62], w[63] = %d, %d, %d; want 578, 39, 0", w[10], w[62], w[63])
	}
	w = hstWeights(512)
	for i, want := range []uint32{512, 256, 128, 64, 32, 16, 8, 4, 2, 1} {
		if w[i] != want {
			t.Errorf("base 512: w[%d] = %d, want %d", i, w[i], want)
		}
	}
	// Square-and-multiply with rounding at every step: 512^11 comes out as
	// 128*4 rounded = 1 (exactly 0.5 in the last place rounds up), 512^12 as 0.
	if w[10] != 1 || w[11] != 0 || w[62] != 0 {
		t.Errorf("base 512: w[10..11] = %d %d, w[62] = %d; want 1 0, 0", w[10], w[11], w[62])
	}
	w = hstWeights(0)
	for i, v := range w {
		if v != 0 {
			t.Errorf("base 0: w[%d] = %d", i, v)
		}
	}
	// Weights never increase with the bucket and w[63] is always 0.
	for _, base := range []uint32{1, 500, 972, 1000, 1023} {
		w := hstWeights(base)
		for i := 1; i < 64; i++ {
			if w[i] > w[i-1] {
				t.Errorf("base %d: w[%d]=%d > w[%d]=%d", base, i, w[i], i-1, w[i-1])
			}
		}
		if w[0] != base || w[63] != 0 {
			t.Errorf("base %d: w[0]=%d w[63]=%d", base, w[0], w[63])
		}
	}
	// The bucket of a sample is st >> 24, capped at 63.
	s, _ := newHST(nil, nil)
	h := s.(*hstSelector)
	for _, tc := range []struct {
		st   uint64
		want uint64
	}{{0, 972}, {1<<24 - 1, 972}, {1 << 24, 923}, {50_000_000, 876}, {63 << 24, 0}, {1 << 40, 0}} {
		if got := h.weight(tc.st); got != tc.want {
			t.Errorf("weight(%d) = %d, want %d", tc.st, got, tc.want)
		}
	}
}

// hstStatus splits a per-path INFO string.
func hstInfo(t *testing.T, s Selector, p *Path) (hst, out, stale uint64) {
	t.Helper()
	if _, err := fmt.Sscanf(s.Status(p, StatusInfo), "%d %d %d ", &hst, &out, &stale); err != nil {
		t.Fatalf("status %q: %v", s.Status(p, StatusInfo), err)
	}
	return
}

func TestHSTWorkedExample(t *testing.T) {
	clk := &clock.Manual{}
	_, s := newSel(t, "historical-service-time", nil, clk)
	tr := s.(IOTracker)
	ps := addPaths(t, s, []string{"A", "B"}, []string{"1"}, []string{"1"})
	a := ps[0]

	start := int64(5 * time.Second)
	clk.Set(start)
	tr.StartIO(a, 4096)
	if _, out, _ := hstInfo(t, s, a); out != 1 {
		t.Fatalf("outstanding %d after StartIO", out)
	}
	finish := start + 100_000
	clk.Set(finish)
	tr.EndIO(a, 4096, start)
	hst, out, stale := hstInfo(t, s, a)
	if hst != 5_200_972 || out != 0 || stale != uint64(finish)+2*5079 {
		t.Fatalf("after 100 us: %d %d %d, want 5200972 0 %d", hst, out, stale, uint64(finish)+2*5079)
	}

	start = finish + 1000
	clk.Set(start)
	tr.StartIO(a, 4096)
	finish = start + 50_000_000
	clk.Set(finish)
	tr.EndIO(a, 4096, start)
	hst, _, stale = hstInfo(t, s, a)
	if hst != 7_404_449_269 || stale != uint64(finish)+2*(7_404_449_269>>10) {
		t.Fatalf("after 50 ms: %d stale %d, want 7404449269 stale %d", hst, stale, uint64(finish)+2*(7_404_449_269>>10))
	}
	if got := s.Status(a, StatusInfo); got != fmt.Sprintf("7404449269 0 %d ", stale) {
		t.Errorf("INFO %q", got)
	}
}

func TestHSTServiceTime(t *testing.T) {
	clk := &clock.Manual{}
	_, s := newSel(t, "historical-service-time", []string{"0"}, clk) // base 0: hst = the last sample
	tr := s.(IOTracker)
	ps := addPaths(t, s, []string{"A", "B", "C"})
	a := ps[0]

	// Two I/Os issued together at t=1000; the second finishing after the
	// first counts from the first's finish (back to back).
	clk.Set(1000)
	tr.StartIO(a, 1)
	tr.StartIO(a, 1)
	clk.Set(1000 + 300)
	tr.EndIO(a, 1, 1000)
	if hst, _, stale := hstInfo(t, s, a); hst != 300*1024 || stale != 1300+3*300 {
		t.Fatalf("first: hst %d stale %d", hst, stale)
	}
	clk.Set(1000 + 500)
	tr.EndIO(a, 1, 1000)
	if hst, out, _ := hstInfo(t, s, a); hst != 200*1024 || out != 0 {
		t.Fatalf("second: hst %d (want %d) out %d", hst, 200*1024, out)
	}
	// A start stamp after now (clock skew) gives a 0 sample.
	tr.StartIO(a, 1)
	tr.EndIO(a, 1, 1_000_000)
	if hst, _, stale := hstInfo(t, s, a); hst != 0 || stale != 1500 {
		t.Fatalf("future start: hst %d stale %d", hst, stale)
	}
	// valid_count follows fail/reinstate (idempotently) and scales stale_after.
	s.FailPath(ps[1])
	s.FailPath(ps[1])
	clk.Set(10_000)
	tr.StartIO(a, 1)
	clk.Set(10_100)
	tr.EndIO(a, 1, 10_000)
	if _, _, stale := hstInfo(t, s, a); stale != 10_100+2*100 {
		t.Fatalf("2 valid paths: stale %d, want %d", stale, 10_100+2*100)
	}
	s.ReinstatePath(ps[1])
	s.ReinstatePath(ps[1])
	tr.StartIO(a, 1)
	clk.Set(10_200)
	tr.EndIO(a, 1, 10_100)
	if _, _, stale := hstInfo(t, s, a); stale != 10_200+3*100 {
		t.Fatalf("3 valid paths: stale %d, want %d", stale, 10_200+3*100)
	}
	// A huge sample saturates at 2^64-1 >> 10 before the EMA.
	tr.StartIO(a, 1)
	clk.Set(int64(1) << 62)
	tr.EndIO(a, 1, 10_200)
	if hst, _, _ := hstInfo(t, s, a); hst != (hstFixedMax*1024+512)>>10 {
		// base 0, bucket 63 (w=0): hst = (sample*1024 + 512) >> 10 in u64
		t.Fatalf("huge sample: hst %d", hst)
	}
}

func TestHSTCompare(t *testing.T) {
	const now = 1_000_000
	fresh := uint64(now + 1_000) // stale_after in the future
	old := uint64(now - 1_000)   // stale
	type snap = hstSnap
	for _, tc := range []struct {
		name string
		a, b snap
		t    uint32
		want int64 // sign only
	}{
		{"fresh paths: over threshold (T=0), both idle, neither stale-ahead", snap{1024, 0, 0}, snap{1024, 0, 0}, 0, 0},
		{"T=1, equal hst: not over, fewer outstanding", snap{5000, 1, fresh}, snap{5000, 3, fresh}, 1, -1},
		{"T=0, both hst 0: not over", snap{0, 4, fresh}, snap{0, 2, fresh}, 0, 1},
		{"T=2 similar (1500 <= 2*1000): outstanding", snap{1000, 5, fresh}, snap{1500, 1, fresh}, 2, 1},
		{"T=2 different (3000 > 2*1000): estimate", snap{1000, 5, fresh}, snap{3000, 1, fresh}, 2, -1},
		{"idle stale p1 beats busy p2", snap{9000, 0, old}, snap{1000, 3, fresh}, 0, -1},
		{"idle stale p2 beats busy p1", snap{1000, 3, fresh}, snap{9000, 0, old}, 0, 1},
		{"both idle: more stale wins (p1)", snap{9000, 0, old - 500}, snap{1000, 0, old}, 0, -1},
		{"both idle, fresh: more stale wins (p2)", snap{1000, 0, fresh + 10}, snap{9000, 0, fresh}, 0, 1},
		{"idle fresh p1 vs busy fresh p2: estimate", snap{9000, 0, fresh}, snap{1000, 2, fresh}, 0, 1},
		{"equal outstanding: lower hst", snap{2000, 2, fresh}, snap{1000, 2, fresh}, 0, 1},
		{"(1+out)*hst: p1", snap{2000, 1, fresh}, snap{1000, 4, fresh}, 0, -1},
		{"(1+out)*hst: p2", snap{2000, 2, fresh}, snap{1000, 4, fresh}, 0, 1},
		{"stale winner p2 limited to equal use", snap{2000, 1, fresh}, snap{1000, 4, old}, 0, -1},
		{"stale winner p1 limited to equal use", snap{1000, 4, old}, snap{2000, 1, fresh}, 0, 1},
		// >= 1024 outstanding: hst >> 10 first. 1023 -> 0, 1024 -> 1.
		{"shift at 1024 outstanding", snap{1023, 2000, fresh}, snap{1024, 1024, fresh}, 0, -1},
		{"no shift below 1024", snap{1023, 1023, fresh}, snap{1024, 500, fresh}, 0, 1},
	} {
		got := hstCompare(tc.a, tc.b, now, tc.t)
		if sign(got) != tc.want {
			t.Errorf("%s: hstCompare = %d, want sign %d", tc.name, got, tc.want)
		}
	}
}

func sign(v int64) int64 {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

func TestHSTSelect(t *testing.T) {
	clk := &clock.Manual{}
	clk.Set(int64(time.Second))
	_, s := newSel(t, "historical-service-time", nil, clk)
	tr := s.(IOTracker)
	ps := addPaths(t, s, []string{"A", "B", "C"})
	// Fresh paths compare equal: ties rotate.
	if got := pick(s, 4); got != "A B C A" {
		t.Fatalf("fresh order %q", got)
	}
	// Teach the selector that A is fast (10 us) and B, C slow (1 ms).
	io := func(p *Path, d time.Duration) {
		st := clk.Nanotime()
		tr.StartIO(p, 4096)
		clk.Advance(d)
		tr.EndIO(p, 4096, st)
	}
	for range 200 {
		io(ps[1], time.Millisecond)
		io(ps[2], time.Millisecond)
		io(ps[0], 10*time.Microsecond)
	}
	// No path is stale (stale_after = finish + 3*hst, and A finished last).
	// Idle paths: the smallest stale_after (A) wins; then a busy A still
	// predicts (1+out)*10 us << 1 ms and keeps winning.
	var got []string
	for range 10 {
		p := s.SelectPath(4096)
		tr.StartIO(p, 4096)
		got = append(got, p.Dev.(string))
	}
	for i, g := range got {
		if g != "A" {
			t.Fatalf("I/O %d went to %s, want all on the fast path: %v", i, g, got)
		}
	}
	// A stale winner is limited to equal use: once A has not completed
	// anything for a while, the idle slow paths get I/O.
	clk.Advance(time.Second)
	if p := s.SelectPath(4096); p == ps[0] {
		t.Fatalf("stale idle slow path not probed")
	}
	// No valid path: nil.
	for _, p := range ps {
		s.FailPath(p)
	}
	if p := s.SelectPath(1); p != nil {
		t.Fatalf("all failed: got %v", p.Dev)
	}
}
