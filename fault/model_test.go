package fault

import (
	"math"
	"sort"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// modelOf parses options and returns the model.
func modelOf(t *testing.T, opts ...string) *model {
	t.Helper()
	c, err := parseConfig(opts, 1<<30)
	if err != nil {
		t.Fatalf("%q: %v", opts, err)
	}
	return c.model
}

// TestBucketRate: an IOPS throttle admits its first second of tokens at
// once, then one I/O per 1/rate; a byte one the same in bytes; iops-size
// makes a large I/O cost several.
func TestBucketRate(t *testing.T) {
	m := modelOf(t, "iops=1000")
	// 5000 I/Os all at 0: the bucket holds 1000, the rest go at 1 ms.
	var last int64
	for i := 0; i < 5000; i++ {
		last = m.complete(0, uint64(i), OpRead, false, 0, 4096, 0)
	}
	if want := int64(4000 * time.Millisecond); math.Abs(float64(last-want)) > 2e6 {
		t.Errorf("the 5000th I/O at %v, want about %v", time.Duration(last), time.Duration(want))
	}
	m = modelOf(t, "bps=1M")
	for i := 0; i < 3; i++ {
		last = m.complete(0, uint64(i), OpWrite, false, 0, 1<<20, 0)
	}
	// 1 MiB held, then 1 MiB a second: the third MiB goes at 2 s... less
	// the first's: at 1 s after the bucket's burst.
	if last < int64(900*time.Millisecond) || last > int64(1100*time.Millisecond) {
		t.Errorf("third MiB at %v under bps=1M", time.Duration(last))
	}
	m = modelOf(t, "iops=100", "iops-size=4K")
	for i := 0; i < 150; i++ { // each 16K read costs 4: 600 tokens
		last = m.complete(0, uint64(i), OpRead, false, 0, 16<<10, 0)
	}
	if last < int64(4900*time.Millisecond) || last > int64(5000*time.Millisecond) {
		t.Errorf("150 16K reads at 100 IOPS of 4K: last at %v, want about 4.96s", time.Duration(last))
	}
	// A write-only throttle leaves reads alone; flushes are never metered.
	m = modelOf(t, "wiops=10")
	for i := 0; i < 100; i++ {
		if d := m.complete(0, uint64(i), OpRead, false, 0, 4096, 0); d != 0 {
			t.Fatalf("a read waited %v on a write throttle", time.Duration(d))
		}
	}
}

// TestCreditBucket: iops=BASE/BURST/SECONDS (gp2's shape) serves BURST
// until the credits are spent, which takes BURST*SECONDS/(BURST-BASE)
// at a demand above BURST, then BASE.
func TestCreditBucket(t *testing.T) {
	m := modelOf(t, "iops=100/1000/9s") // 9000 credits above base: 10 s of burst
	rate := func(from, to float64) float64 {
		// closed loop: the next I/O arrives when the last completes
		var now int64
		n := 0
		for i := 0; now < int64(to*1e9); i++ {
			now = m.complete(0, uint64(i), OpRead, false, 0, 4096, now)
			if now >= int64(from*1e9) && now < int64(to*1e9) {
				n++
			}
		}
		return float64(n) / (to - from)
	}
	if r := rate(0, 9); math.Abs(r-1000) > 30 {
		t.Errorf("burst: %.0f IOPS, want 1000", r)
	}
	if r := rate(9, 11); r > 1000*1.03 || r < 100 {
		t.Errorf("at exhaustion: %.0f IOPS", r)
	}
	if r := rate(11, 30); math.Abs(r-100) > 5 {
		t.Errorf("after the burst: %.0f IOPS, want the base 100", r)
	}
	// Resting refills: after 10 s idle, the burst comes back for about
	// 10 s x 100 / 900 s.
	m.complete(0, 0, OpRead, false, 0, 4096, int64(60e9))
}

// TestGP2Preset: gp2's numbers: 3 IOPS per GiB with a 100 floor, a burst to
// 3000 that lasts 5.4 M credits / (3000 - base) seconds, no burst at or
// above 1000 GiB, the 16000 ceiling.
func TestGP2Preset(t *testing.T) {
	for _, tc := range []struct {
		size          int
		base, burst   float64
		burstFor, tau float64
	}{
		{10, 100, 3000, 5.4e6 / 2900, 0},
		{100, 300, 3000, 5.4e6 / 2700, 0},
		{1000, 3000, 0, 0, 0},
		{6000, 16000, 0, 0, 0},
	} {
		m := modelOf(t, "preset=gp2:size="+itoa(tc.size))
		b := m.buckets[0]
		if b.rate != tc.base {
			t.Errorf("gp2 %d GiB: base %g, want %g", tc.size, b.rate, tc.base)
		}
		if tc.burst == 0 {
			if float64(b.tau) != 1e9 {
				t.Errorf("gp2 %d GiB has a burst bucket of %v", tc.size, time.Duration(b.tau))
			}
			continue
		}
		// Credits: the bucket holds tau seconds of the base rate.
		if credits := float64(b.tau) / 1e9 * b.rate; math.Abs(credits-5.4e6) > 1 {
			t.Errorf("gp2 %d GiB: %g credits", tc.size, credits)
		}
		if m.buckets[1].rate != tc.burst {
			t.Errorf("gp2 %d GiB: burst %g", tc.size, m.buckets[1].rate)
		}
	}
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// TestUnits: N parallel units queue concurrent I/O: N at once take one
// service time, 2N take two; with no units everything overlaps.
func TestUnits(t *testing.T) {
	m := modelOf(t, "units=4", "read=1ms", "write=3ms")
	var done []int64
	for i := 0; i < 8; i++ {
		done = append(done, m.complete(0, uint64(i), OpRead, false, 0, 4096, 0))
	}
	for i, d := range done {
		want := int64(1e6) * int64(i/4+1)
		if d != want {
			t.Errorf("read %d done at %v, want %v", i, time.Duration(d), time.Duration(want))
		}
	}
	// A read behind four writes waits for a unit.
	m = modelOf(t, "units=4", "read=1ms", "write=3ms")
	for i := 0; i < 4; i++ {
		m.complete(0, uint64(i), OpWrite, false, 0, 4096, 0)
	}
	if d := m.complete(0, 4, OpRead, false, 0, 4096, 0); d != 4e6 {
		t.Errorf("a read behind 4 writes done at %v, want 4ms", time.Duration(d))
	}
	m = modelOf(t, "read=1ms")
	for i := 0; i < 8; i++ {
		if d := m.complete(0, uint64(i), OpRead, false, 0, 4096, 0); d != 1e6 {
			t.Errorf("with no units, read %d done at %v", i, time.Duration(d))
		}
	}
}

// TestEpisodes: stall=EVERY/FOR holds what arrives in a window to its end;
// slow=EVERY/FOR/FACTOR stretches service times in its windows; jitter
// moves windows within the period, the same for the same seed.
func TestEpisodes(t *testing.T) {
	m := modelOf(t, "stall=1s/100ms")
	for _, tc := range []struct{ at, want int64 }{
		{50e6, 100e6}, {150e6, 150e6}, {1020e6, 1100e6}, {1999e6, 1999e6},
	} {
		if d := m.complete(0, 0, OpRead, false, 0, 512, tc.at); d != tc.want {
			t.Errorf("stall: arriving at %v done at %v, want %v", time.Duration(tc.at), time.Duration(d), time.Duration(tc.want))
		}
	}
	m = modelOf(t, "slow=1s/200ms/10", "read=1ms")
	if d := m.complete(0, 0, OpRead, false, 0, 512, 100e6); d != 110e6 {
		t.Errorf("slow: %v, want 110ms", time.Duration(d))
	}
	if d := m.complete(0, 0, OpRead, false, 0, 512, 500e6); d != 501e6 {
		t.Errorf("outside the slow window: %v", time.Duration(d))
	}
	e, err := parseEpisodes("stall", "1s/100ms/500ms", keyStall)
	if err != nil {
		t.Fatal(err)
	}
	starts := map[int64]bool{}
	for k := int64(0); k < 50; k++ {
		found := false
		for at := k * 1e9; at < (k+1)*1e9; at += 1e6 {
			if end, ok := e.in(3, at); ok {
				if end-at > 100e6 || end-at < 99e6 || at-k*1e9 > 501e6 { // found to the ms
					t.Fatalf("period %d: a window from %v to %v", k, time.Duration(at), time.Duration(end))
				}
				starts[at-k*1e9] = true
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("period %d has no stall window", k)
		}
	}
	if len(starts) < 10 {
		t.Errorf("jitter moved 50 windows to only %d places", len(starts))
	}
}

// TestHDD: a random 4K read costs seek plus rotation (about 8-16 ms on
// average), a sequential one only the transfer and rotation; flushes are
// served from the flush distribution.
func TestHDD(t *testing.T) {
	m := modelOf(t, "preset=hdd7200")
	h := m.hdd
	var seq, rnd []float64
	off := int64(0)
	for i := 0; i < 2000; i++ {
		seq = append(seq, float64(h.service(1, uint64(i), off, 4096)))
		off += 4096
	}
	for i := 0; i < 2000; i++ {
		o := int64(unit(draw(1, 99, uint64(i), 0))*float64(h.size)) &^ 4095
		rnd = append(rnd, float64(h.service(1, uint64(2000+i), o, 4096)))
	}
	mean := func(x []float64) float64 {
		s := 0.0
		for _, v := range x {
			s += v
		}
		return s / float64(len(x))
	}
	rev := 60e9 / 7200.0
	if s := mean(seq); math.Abs(s-rev/2) > rev*0.1 {
		t.Errorf("sequential 4K: mean %v, want half a revolution (%v)", time.Duration(s), time.Duration(rev/2))
	}
	if r := mean(rnd); r < 8e6 || r > 16e6 {
		t.Errorf("random 4K: mean %v, want 8-16 ms", time.Duration(r))
	}
	// Transfer: 1 MiB at the outer edge takes about 5 ms more than 4K.
	h.head = 0
	big := float64(h.service(1, 1, 0, 1<<20)) - float64(h.service(1, 1, 1<<20, 4096))
	if big < 4.5e6 || big > 5.8e6 {
		t.Errorf("1 MiB at the outer edge: %v more than 4K", time.Duration(big))
	}
}

// TestGC: gc=BYTES/FOR holds everything after every BYTES written.
func TestGC(t *testing.T) {
	m := modelOf(t, "gc=1M/50ms", "write=100us", "units=2")
	var now int64
	var gaps []int64
	for i := 0; i < 1024; i++ { // 4 MiB in 4K writes, one at a time
		d := m.complete(0, uint64(i), OpWrite, false, 0, 4096, now)
		if d-now > 1e6 {
			gaps = append(gaps, d-now)
		}
		now = d
	}
	if len(gaps) != 3 { // after the 1st, 2nd and 3rd MiB (the 4th's ends the run)
		t.Errorf("%d collections in 4 MiB under gc=1M: %v", len(gaps), gaps)
	}
	for _, g := range gaps {
		if g < 50e6 || g > 51e6 {
			t.Errorf("a collection held a write %v", time.Duration(g))
		}
	}
}

// ks is the Kolmogorov-Smirnov distance between samples and cdf.
func ks(samples []float64, cdf func(float64) float64) float64 {
	sort.Float64s(samples)
	d := 0.0
	n := float64(len(samples))
	for i, x := range samples {
		c := cdf(x)
		d = max(d, math.Abs(float64(i+1)/n-c), math.Abs(c-float64(i)/n))
	}
	return d
}

// TestDistributionsKS: 10 000 draws of each distribution lie within the
// KS critical distance at 1% (1.63/sqrt(n) = 0.0163) of the requested
// one; the lognormal's quantiles are the p50 and p99 asked for.
func TestDistributionsKS(t *testing.T) {
	const n = 10000
	sample := func(d Dist, key uint64) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = float64(d.Sample(func(sub uint64) uint64 { return draw(5, key, uint64(i), sub) }))
		}
		return out
	}
	ln := newLognormal(600e3, 3e6)
	if q := ln.quantile(0.5); math.Abs(q-600e3) > 1 {
		t.Errorf("lognormal p50 %g", q)
	}
	if q := ln.quantile(0.99); math.Abs(q-3e6) > 10 {
		t.Errorf("lognormal p99 %g", q)
	}
	normCDF := func(z float64) float64 { return 0.5 * math.Erfc(-z/math.Sqrt2) }
	for _, tc := range []struct {
		spec string
		cdf  func(float64) float64
	}{
		{"uniform(1ms,3ms)", func(x float64) float64 { return min(max((x-1e6)/2e6, 0), 1) }},
		{"exp(1ms,1s)", func(x float64) float64 { return 1 - math.Exp(-x/1e6) }},
		{"lognormal(600us,3ms)", func(x float64) float64 { return normCDF((math.Log(x) - ln.mu) / ln.sig) }},
		{"pct(90us,200us)", func(x float64) float64 {
			l := newLognormal(90e3, 200e3)
			return normCDF((math.Log(x) - l.mu) / l.sig)
		}},
		{"mix(0.99*lognormal(90us,200us),0.01*3ms)", func(x float64) float64 {
			l := newLognormal(90e3, 200e3)
			c := 0.99 * normCDF((math.Log(x)-l.mu)/l.sig)
			if x >= 3e6 {
				c += 0.01
			}
			return c
		}},
	} {
		d, err := ParseDist(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if k := ks(sample(d, keyOf(tc.spec)), tc.cdf); k > 1.63/math.Sqrt(n) {
			t.Errorf("%s: KS distance %.4f over %d draws", tc.spec, k, n)
		} else {
			t.Logf("%s: KS %.4f", tc.spec, k)
		}
	}
}

// TestDrawnDelayAccuracy: delays drawn from a distribution are served by
// the scheduler at the drawn time, as constant ones are: on a manual
// clock, each I/O completes when the clock passes its drawn delay and not
// before.
func TestDrawnDelayAccuracy(t *testing.T) {
	clk := manual{&clock.Manual{}}
	clk.Set(1e9)
	d, _ := dev(t, clk, "seed=3 rule op=read delay=lognormal(1ms,5ms)", 1<<20)
	want := newLognormal(1e6, 5e6)
	r := d.rules.Load().rules[0]
	for i := 0; i < 20; i++ {
		drawn := want.Sample(func(sub uint64) uint64 { return draw(3, r.key, uint64(i+1), 2+sub) }) // the i+1-th match
		done := make(chan error, 1)
		start := clk.Nanotime()
		go func() { _, err := read(t, d, 0, 512); done <- err }()
		// Step the clock to just before the drawn time: still waiting.
		for d.q.Waiting() == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		clk.Set(start + drawn - 1)
		select {
		case <-done:
			t.Fatalf("I/O %d done before its drawn delay %v", i, time.Duration(drawn))
		case <-time.After(2 * time.Millisecond):
		}
		clk.Set(start + drawn)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
