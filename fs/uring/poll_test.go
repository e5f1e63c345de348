package uring

import (
	"math/rand/v2"
	"testing"
	"time"
)

const us = int64(time.Microsecond)

// pollSim drives a pollPolicy with one stream of requests at queue depth
// one over several queues, on a manual clock: each request is issued a gap
// after the previous one completed, on the queue a pattern picks (the CPU
// the application runs on). A queue that spins finds its request when it
// comes; one that sleeps sees it wake latency later. Handling a request
// takes service.
type pollSim struct {
	p       pollPolicy
	q       []pollQueue
	st      []simQueue
	reqs    []uint64 // requests each queue received
	service int64
	wake    int64

	now                int64
	spins, probes      int   // dry moments that spun, or probed
	dries              int   // dry moments
	hits, sleeps       int   // requests found by a spin, or waking a sleeping queue
	spinTime, maxSpin  int64 // total and longest spin
	spinLens           []int64
	contendedAt        int64 // spins that start at or after this time report contention (0: never)
	contendedSpinCount int
}

// simQueue is what a simulated queue is doing.
type simQueue struct {
	spinning bool
	probe    bool
	dryAt    int64
	end      int64 // end of the spin
}

func newPollSim(queues int, cfg time.Duration) *pollSim {
	s := &pollSim{q: make([]pollQueue, queues), st: make([]simQueue, queues), reqs: make([]uint64, queues),
		service: 3 * us, wake: 30 * us, now: int64(time.Second)}
	s.p.init(cfg)
	return s
}

func (s *pollSim) others(q int) uint64 {
	var n uint64
	for i, r := range s.reqs {
		if i != q {
			n += r
		}
	}
	return n
}

// finish ends the spins that end before t, in the order they end.
func (s *pollSim) finish(t int64) {
	for {
		first := -1
		for i := range s.st {
			if s.st[i].spinning && s.st[i].end < t && (first < 0 || s.st[i].end < s.st[first].end) {
				first = i
			}
		}
		if first < 0 {
			return
		}
		st := &s.st[first]
		st.spinning = false
		s.p.spun(&s.q[first], st.end, false, s.others(first), false, st.probe)
	}
}

// request issues one request on queue qi at time t and runs it to the
// queue's next dry moment; it returns when the reply is committed.
func (s *pollSim) request(qi int, t int64) int64 {
	s.finish(t)
	st := &s.st[qi]
	seen := t
	if st.spinning {
		st.spinning = false
		s.hits++
		s.spinTime -= st.end - t // counted as if it ran to its end
		s.p.spun(&s.q[qi], t, true, s.others(qi), false, st.probe)
	} else {
		seen = t + s.wake
		s.sleeps++
		s.p.woke(&s.q[qi], seen)
	}
	s.reqs[qi]++
	s.q[qi].burst++
	done := seen + s.service
	s.dry(qi, done)
	return done
}

// dry makes queue qi run dry at t and starts what the policy says.
func (s *pollSim) dry(qi int, t int64) {
	s.finish(t)
	s.dries++
	w, probe := s.p.dry(&s.q[qi], t, s.others(qi))
	if w <= 0 {
		return
	}
	if probe {
		s.probes++
	} else {
		s.spins++
	}
	if s.contendedAt != 0 && t >= s.contendedAt {
		// The first look after a yield comes a time slice later.
		s.contendedSpinCount++
		s.p.spun(&s.q[qi], t+3*int64(time.Millisecond), false, s.others(qi), true, probe)
		s.spinTime += 3 * int64(time.Millisecond)
		return
	}
	s.st[qi] = simQueue{spinning: true, probe: probe, dryAt: t, end: t + w}
	s.spinTime += w // as if it ran to its end; request corrects a hit
	s.spinLens = append(s.spinLens, w)
	s.maxSpin = max(s.maxSpin, w)
}

// run issues n requests, request i on queue pick(i) at next(i, the
// previous one's completion).
func (s *pollSim) run(n int, pick func(int) int, next func(int, int64) int64) {
	for i := range n {
		s.now = s.request(pick(i), next(i, s.now))
	}
}

// reset clears the counts (not the policy's state).
func (s *pollSim) reset() {
	s.spins, s.probes, s.dries, s.hits, s.sleeps, s.spinTime, s.maxSpin, s.spinLens = 0, 0, 0, 0, 0, 0, 0, nil
}

// steady issues each request g after the previous one completed.
func steady(g int64) func(int, int64) int64 {
	return func(_ int, done int64) int64 { return done + g }
}

// gaps issues request i gap(i) after the previous one completed.
func gaps(gap func(int) int64) func(int, int64) int64 {
	return func(i int, done int64) int64 { return done + gap(i) }
}

// rate issues a request every period, as fio's --rate_iops, from the
// first completion on.
func rate(period int64) func(int, int64) int64 {
	var start int64
	return func(i int, done int64) int64 {
		if i == 0 {
			start = done
		}
		return max(done, start+int64(i)*period)
	}
}

func one(int) int { return 0 }

// TestPollSteadyQD1: a QD1 stream with short gaps makes the daemon poll at
// every dry moment after a few requests, for up to the window, and the
// polls find the requests.
func TestPollSteadyQD1(t *testing.T) {
	s := newPollSim(2, 0)
	s.run(64, one, steady(5*us))
	if s.hits == 0 {
		t.Fatal("no poll found a request while warming up")
	}
	s.reset()
	s.run(1000, one, steady(5*us))
	if s.spins != s.dries || s.hits != 1000 {
		t.Errorf("%d polls and %d hits in %d dry moments, 1000 requests: want a poll that hits at every one", s.spins, s.hits, s.dries)
	}
	if s.maxSpin != int64(DefaultPollWindow) {
		t.Errorf("spins of up to %v, want the window", time.Duration(s.maxSpin))
	}
	if int(s.q[0].hits.Load()) < 1000 {
		t.Errorf("%d hits counted", s.q[0].hits.Load())
	}
}

// TestPollAlternatingQueues: the application moves between CPUs, so that
// its requests land on one queue or the other: a queue's polls miss when
// the request went to the other queue, but the daemon keeps polling, and
// polls find most requests.
func TestPollAlternatingQueues(t *testing.T) {
	for _, tc := range []struct {
		name string
		pick func(int) int
	}{
		{"strict", func(i int) int { return i % 2 }},
		{"40% moves", func() func(int) int {
			r := rand.New(rand.NewPCG(1, 2))
			cur := 0
			return func(int) int {
				if r.IntN(10) < 4 {
					cur ^= 1
				}
				return cur
			}
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPollSim(2, 0)
			s.run(64, tc.pick, steady(5*us))
			s.reset()
			s.run(1000, tc.pick, steady(5*us))
			if s.spins < s.dries*9/10 {
				t.Errorf("%d polls in %d dry moments: the daemon stopped polling", s.spins, s.dries)
			}
			if s.probes > s.dries/20 {
				t.Errorf("%d probes in %d dry moments", s.probes, s.dries)
			}
			// The other queue's poll from its last request, if still
			// running, finds the request when the application moves
			// back.
			if tc.name == "strict" && s.hits < 900 {
				t.Errorf("%d of 1000 requests found by a poll", s.hits)
			}
			if s.maxSpin > int64(DefaultPollWindow) {
				t.Errorf("a spin of %v", time.Duration(s.maxSpin))
			}
		})
	}
}

// TestPollBursts: dense bursts with long pauses between them: polls within
// the bursts, and after each burst at most one spin of at most the window
// before the queue sleeps.
func TestPollBursts(t *testing.T) {
	s := newPollSim(2, 0)
	const burst, pauses = 16, 50
	pause := int64(10 * time.Millisecond)
	gap := func(i int) int64 {
		if i%burst == 0 {
			return pause
		}
		return 5 * us
	}
	s.run(burst*4, one, gaps(gap))
	s.reset()
	s.run(burst*pauses, one, gaps(gap))
	if s.hits < pauses*(burst-4) {
		t.Errorf("%d of %d requests found by a poll", s.hits, burst*pauses)
	}
	// The spins that missed: those after a burst's last request.
	missed := s.spins + s.probes - s.hits
	if missed > pauses {
		t.Errorf("%d spins missed over %d pauses: more than one a pause", missed, pauses)
	}
	if s.maxSpin > int64(DefaultPollWindow) {
		t.Errorf("a spin of %v", time.Duration(s.maxSpin))
	}
}

// TestPollSparse: a QD1 stream limited in rate (1k, 5k, 20k requests a
// second) does not make the daemon poll; it probes, rarely, and spends
// under 1% of the time polling.
func TestPollSparse(t *testing.T) {
	for _, iops := range []int64{1000, 5000, 20000} {
		s := newPollSim(2, 0)
		period := int64(time.Second) / iops
		r := rand.New(rand.NewPCG(3, 4))
		pick := func(int) int { return r.IntN(2) }
		s.run(int(iops), pick, rate(period))
		if s.spins > 0 {
			t.Errorf("%d/s: %d polls", iops, s.spins)
		}
		elapsed := iops * period
		if s.spinTime > elapsed/100 {
			t.Errorf("%d/s: %v of %v spent polling", iops, time.Duration(s.spinTime), time.Duration(elapsed))
		}
		if s.probes > int(iops)/100+8*len(s.q) {
			t.Errorf("%d/s: %d probes for %d requests", iops, s.probes, iops)
		}
	}
	// Dense I/O that becomes sparse stops polling within a few requests.
	s := newPollSim(2, 0)
	s.run(100, one, steady(5*us))
	s.reset()
	s.run(100, one, steady(45*us))
	if s.spins > 3 {
		t.Errorf("%d polls once the gaps grew to 45us", s.spins)
	}
}

// TestPollDeepQueue: a queue that serves more than maxBurst requests
// between dry moments sleeps, however dense the requests.
func TestPollDeepQueue(t *testing.T) {
	s := newPollSim(2, 0)
	s.run(100, one, steady(5*us))
	if !s.p.predicts(s.now) {
		t.Fatal("no polling after a dense QD1 stream")
	}
	for i := range 100 {
		s.q[0].burst = 32
		if w, _ := s.p.dry(&s.q[0], s.now+int64(i)*100*us, 0); w != 0 {
			t.Fatalf("a queue that served 32 requests spins %v", time.Duration(w))
		}
	}
	s.q[0].burst = maxBurst
	if w, _ := s.p.dry(&s.q[0], s.now+time.Second.Nanoseconds(), 0); w == 0 {
		t.Error("no poll once the queue is shallow again")
	}
}

// TestPollIdle: after its last request, a daemon spins at most once, for at
// most the window, then sleeps; the next request, long after, tells the
// policy that I/O is sparse.
func TestPollIdle(t *testing.T) {
	s := newPollSim(2, 0)
	s.run(100, one, steady(5*us))
	s.reset()
	s.finish(s.now + int64(time.Hour))
	if s.spins+s.probes != 0 || s.st[0].spinning {
		t.Fatal("still spinning")
	}
	s.now = s.request(0, s.now+int64(time.Hour))
	if s.p.predicts(s.now) && s.p.score.Load() > scoreMax-scoreDown {
		t.Errorf("score %d after an hour without requests", s.p.score.Load())
	}
	// A daemon that never saw dense I/O probes on its first dry moment
	// only.
	s = newPollSim(2, 0)
	s.run(3, one, steady(int64(time.Second)))
	if s.spins != 0 || s.probes != 1 {
		t.Errorf("%d polls, %d probes for 3 requests a second apart", s.spins, s.probes)
	}
}

// TestPollContended: a spin that finds the CPU held by another thread
// stops polling for a quiet period, which doubles while contention lasts,
// up to quietMax, and starts at quietMin again after a contention-free
// quietMax.
func TestPollContended(t *testing.T) {
	s := newPollSim(2, 0)
	s.run(100, one, steady(5*us))
	s.contendedAt = s.now
	s.reset()
	s.run(1, one, steady(5*us))
	if s.contendedSpinCount != 1 || !s.p.quietUntilAfter(s.now) {
		t.Fatalf("%d contended spins, quiet until %d (now %d)", s.contendedSpinCount, s.p.quietUntil.Load(), s.now)
	}
	// Ten seconds of dense requests under contention: quiet periods of
	// 10, 20, 40 ms ... 1 s, so few contended spins.
	end := s.now + 10*int64(time.Second)
	for s.now < end {
		s.run(1000, one, steady(5*us))
	}
	if s.contendedSpinCount > 20 {
		t.Errorf("%d contended spins in 10 s", s.contendedSpinCount)
	}
	if s.p.quiet.Load() != quietMax {
		t.Errorf("quiet period %v, want %v", time.Duration(s.p.quiet.Load()), time.Duration(quietMax))
	}
	if got := s.q[0].contended.Load(); got != uint64(s.contendedSpinCount) {
		t.Errorf("%d contended spins counted, %d made", got, s.contendedSpinCount)
	}
	// Contention ends: after the quiet period the daemon polls again.
	s.contendedAt = 0
	s.now = s.p.quietUntil.Load()
	s.reset()
	s.run(100, one, steady(5*us))
	if s.spins < 90 {
		t.Errorf("%d polls in 100 requests after contention ended", s.spins)
	}
	s.now += 3 * quietMax
	s.contendedAt = s.now
	s.run(1, one, steady(5*us))
	if d := s.p.quietUntil.Load() - s.now; s.p.quiet.Load() != quietMin || d > quietMin+5*int64(time.Millisecond) {
		t.Errorf("quiet period %v (%v left) for contention after a calm %v", time.Duration(s.p.quiet.Load()), time.Duration(d), time.Duration(3*quietMax))
	}
}

func (p *pollPolicy) quietUntilAfter(t int64) bool { return p.quietUntil.Load() > t }

// TestPollModes: PollOff never spins; a fixed window spins that long at
// every dry moment, deep queue or not, except when contended.
func TestPollModes(t *testing.T) {
	off := newPollSim(1, PollOff)
	off.run(100, one, steady(5*us))
	if off.spins+off.probes != 0 || off.p.predicts(off.now) {
		t.Errorf("PollOff: %d spins", off.spins+off.probes)
	}
	fixed := newPollSim(1, time.Millisecond)
	fixed.run(100, one, steady(int64(time.Second)))
	if fixed.spins != 100 || fixed.maxSpin != int64(time.Millisecond) || !fixed.p.predicts(fixed.now) {
		t.Errorf("fixed 1ms: %d spins of up to %v in 100 dry moments", fixed.spins, time.Duration(fixed.maxSpin))
	}
	fixed.q[0].burst = 32
	if w, _ := fixed.p.dry(&fixed.q[0], fixed.now, 0); w != int64(time.Millisecond) {
		t.Errorf("fixed 1ms spins %v after a deep run", time.Duration(w))
	}
	fixed.contendedAt = fixed.now
	fixed.run(1, one, steady(us))
	if w, _ := fixed.p.dry(&fixed.q[0], fixed.now+us, 0); w != 0 || fixed.p.predicts(fixed.now+us) {
		t.Errorf("fixed 1ms spins %v right after a contended spin", time.Duration(w))
	}
}

// TestPollCounts: the queue's counters follow the spins.
func TestPollCounts(t *testing.T) {
	s := newPollSim(1, 0)
	s.run(200, one, steady(5*us))
	q := &s.q[0]
	s.finish(s.now + int64(time.Second))
	if q.polls.Load() != uint64(s.spins) || q.probes.Load() != uint64(s.probes) || q.hits.Load() != uint64(s.hits) {
		t.Errorf("counted %d polls, %d probes, %d hits; made %d, %d, %d", q.polls.Load(), q.probes.Load(), q.hits.Load(), s.spins, s.probes, s.hits)
	}
}

// steppingClock advances by step at every reading.
type steppingClock struct{ now, step int64 }

func (c *steppingClock) Nanotime() int64 { c.now += c.step; return c.now }

// TestSpinContended: a spin whose looks come contendedAfter apart (another
// thread held the CPU in between) reports contention, also when the look
// finds a request; one whose looks come close together does not, and a
// spin for a reply ignores the gaps.
func TestSpinContended(t *testing.T) {
	for _, tc := range []struct {
		name           string
		step           int64
		request, watch bool
		hit, contended bool
	}{
		{"contended, request", contendedAfter, true, true, true, true},
		{"contended, nothing", contendedAfter, false, true, false, true},
		{"free, request", us, true, true, true, false},
		{"free, nothing", us, false, true, false, false},
		{"reply spin, slow looks", contendedAfter, false, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &steppingClock{now: 1, step: tc.step}
			cfg := Config{Depth: 1, PayloadSize: 8192, Clock: clk}
			r := newFakeRing()
			s := newServer(cfg, []ring{r}, [][]byte{make([]byte, bufSize(cfg))})
			if tc.request {
				r.cq = append(r.cq, 0)
			}
			q := s.queues[0]
			hit, contended := q.spin(int64(DefaultPollWindow), tc.watch)
			if hit != tc.hit || contended != tc.contended {
				t.Errorf("hit %v, contended %v; want %v, %v", hit, contended, tc.hit, tc.contended)
			}
			if q.poll.spun.Load() <= 0 {
				t.Error("no spinning time counted")
			}
		})
	}
}

// TestPollBorderline: a QD1 stream limited in rate whose gaps straddle
// sparseGap (here uniform over 15-40 us, two in five dense) is sparse I/O:
// it does not keep the daemon polling, and the probes that find the odd
// short gap do not add up to more than a few percent of the time.
func TestPollBorderline(t *testing.T) {
	for _, pick := range []struct {
		name string
		f    func(int) int
	}{{"one queue", one}, {"random queue", func() func(int) int {
		r := rand.New(rand.NewPCG(7, 8))
		return func(int) int { return r.IntN(2) }
	}()}} {
		t.Run(pick.name, func(t *testing.T) {
			s := newPollSim(2, 0)
			s.wake = 8 * us
			r := rand.New(rand.NewPCG(5, 6))
			gap := func(int) int64 { return 15*us + r.Int64N(25*us) }
			s.run(1000, pick.f, gaps(gap))
			s.reset()
			start := s.now
			s.run(20000, pick.f, gaps(gap))
			elapsed := s.now - start
			t.Logf("%d polls, %d probes, %d hits, %d dries, spin %v of %v", s.spins, s.probes, s.hits, s.dries, time.Duration(s.spinTime), time.Duration(elapsed))
			if s.spins > s.dries/100 {
				t.Errorf("%d polls in %d dry moments", s.spins, s.dries)
			}
			if s.spinTime > elapsed/50 {
				t.Errorf("%v of %v spent polling (%d polls, %d probes)", time.Duration(s.spinTime), time.Duration(elapsed), s.spins, s.probes)
			}
		})
	}
}
