package uring

import (
	"sync/atomic"
	"time"
)

// Polling policy.
//
// A queue whose leader runs dry either sleeps in io_uring_enter, and the
// next request pays for waking it (tens of microseconds on a virtual CPU,
// and a second wake-up for the application that waits for the reply), or
// spins on its ring for a while. Spinning pays only when the next request
// comes soon. As the block layer's hybrid polling predicts a completion
// from the recent completion times, pollPolicy predicts the next request
// from the recent gaps between a queue running dry and the next request
// arriving, on any queue of the daemon: an application at queue depth one
// that moves between CPUs sends its requests to the queue of whichever CPU
// it runs on, so that one queue's polls miss while the daemon's requests
// keep coming (a miss while a request arrived on another queue is not a
// sign of sparse I/O). The policy is shared by the daemon's queues; each
// queue keeps its own part in a pollQueue.
//
// A queue that runs dry spins when
//   - its last run served at most maxBurst requests (a deeper queue shares
//     one wake-up between many requests, and a spinner would take CPU time
//     from the application that issues them),
//   - recent gaps were short (the density score, fed by dense and sparse
//     observations, is at least scoreOn), and
//   - no spin found the CPU contended within the quiet period (see below);
//
// it then spins for up to the window, until a request comes: not for a
// multiple of the recent gaps, since the request that follows may come
// to this queue only after a round trip through another (the application
// alternating between CPUs), and the spin is free when the application
// runs on another CPU and short when it runs on this one, which is then
// the CPU that it issues its next request from. Otherwise it sleeps,
// except that it probes (spins for the whole window) on every
// probeEvery-th dry moment, probeEvery
// doubling up to probeMax while probes find sparse I/O, so that a daemon
// whose sleeping queues only see gaps lengthened by their own wake-ups
// still finds out that requests come densely. An idle daemon probes once,
// on its first dry moment after the last request, and then sleeps.
//
// Gaps are observed when a request arrives after its queue waited: exactly
// when the queue spun (a dense observation if the gap was at most
// sparseGap and the request before was seen by a spin too, a sparse one if
// longer; a short gap after a request that a sleeping queue saw late, by
// its wake-up, is measured again at once by a probe), as an upper bound
// when it slept (its
// wake-up is in the gap: dense if at most sparseGap, sparse if longer than
// sparseGap+wakeSlack, else nothing; as only the short gaps are seen, such
// dense observations alone never turn polling on). Either way the gap runs from the
// daemon's last dry moment on any queue. A spin that ends without a request
// on its own queue is sparse unless a request arrived on another queue
// during it (that queue then observes the gap).
//
// Contention: a spin yields the CPU between looks (sched_yield), so that a
// thread that is ready to run, often the application, runs first. If one
// look comes contendedAfter or more after the previous one, another thread
// held the CPU for a whole time slice: the CPU is wanted by something that
// does not block within microseconds (a CPU-bound process), a spinner only
// delays its own next look behind it and takes turns from it. The spin
// ends, and the daemon does not poll for a quiet period that starts at
// quietMin and doubles, up to quietMax, for every contended spin that
// comes within quietMax after the quiet period before it ended (a spin that
// finds its request at its first look, and so sees no contention, does not
// reset it: under a CPU-bound process on every CPU some do).
type pollPolicy struct {
	mode int8  // pollAdaptive, pollFixed or pollOff
	win  int64 // the window, ns

	// Daemon-wide observations, by whichever leader makes them.
	lastDry    atomic.Int64 // when a queue last ran dry
	lastExact  atomic.Bool  // the last request seen came to a spinning queue
	score      atomic.Int32 // density, 0..scoreMax
	quietUntil atomic.Int64 // no polling before this time (contention)
	quiet      atomic.Int64 // the current quiet period, ns
	lastQuiet  atomic.Int64 // when the last quiet period started
}

// pollQueue is one queue's part of the policy: the leader's state, and
// counters for Stats.
type pollQueue struct {
	burst      int   // requests handled since the queue last ran dry
	skip       int   // dry moments since the last probe or spin
	probeEvery int   // dry moments between probes while the I/O is sparse
	dryAt      int64 // when the queue last ran dry
	probeNow   bool  // probe at the next dry moment
	others     uint64

	polls, hits, probes, contended atomic.Uint64
	spun                           atomic.Int64 // ns spent spinning (polls, probes and spins for replies)
}

// spunFor counts d ns of spinning.
func (q *pollQueue) spunFor(d int64) { q.spun.Add(d) }

// Policy constants.
const (
	// maxBurst is the most requests between two dry moments of a queue
	// that adaptive polling takes for a shallow queue.
	maxBurst = 2
	// sparseGap is the longest gap taken for dense I/O, and the shortest
	// adaptive spin. Below it, a spin costs less CPU than the wake-ups it
	// saves; at 20k requests a second of a QD1 application limited in its
	// rate (a gap of some 40 us), it costs more.
	sparseGap = int64(25 * time.Microsecond)
	// wakeSlack bounds what a queue's own wake-up adds to the gaps it sees
	// after it slept.
	wakeSlack = int64(200 * time.Microsecond)
	// scoreMax, scoreOn: the density score's bound, and the least at
	// which queues poll. A dense observation raises it by scoreUp, a
	// sparse one lowers it by scoreDown: queues keep polling only while
	// more than scoreDown/(scoreUp+scoreDown) of the gaps are dense, not
	// when gaps straddle sparseGap (a rate-limited application whose
	// gaps are about sparseGap long).
	scoreMax  = 16
	scoreOn   = 8
	scoreUp   = 1
	scoreDown = 4
	// probeMin and probeMax bound probeEvery.
	probeMin = 8
	probeMax = 256
	// contendedAfter: a look this long after the previous one means that
	// another thread held the CPU for a time slice.
	contendedAfter = int64(200 * time.Microsecond)
	// quietMin and quietMax bound the quiet period after a contended spin.
	quietMin = int64(10 * time.Millisecond)
	quietMax = int64(time.Second)
)

const (
	pollAdaptive = iota
	pollFixed
	pollOff
)

func (p *pollPolicy) init(cfg time.Duration) {
	switch {
	case cfg < 0:
		p.mode = pollOff
	case cfg == 0:
		p.mode, p.win = pollAdaptive, int64(DefaultPollWindow)
	default:
		p.mode, p.win = pollFixed, int64(cfg)
	}
	p.quiet.Store(quietMin)
}

// dry is called when queue q ran dry at now: nothing reaped is left to
// handle. others is the number of requests the daemon's other queues have
// received so far. It returns how long to spin, 0 to sleep, and whether
// the spin is a probe.
func (p *pollPolicy) dry(q *pollQueue, now int64, others uint64) (spin int64, probe bool) {
	burst := q.burst
	q.burst = 0
	q.dryAt, q.others = now, others
	if p.mode == pollOff {
		return 0, false
	}
	p.lastDry.Store(now)
	if now < p.quietUntil.Load() {
		return 0, false
	}
	if p.mode == pollFixed {
		return p.win, false
	}
	if burst > maxBurst {
		return 0, false
	}
	if p.score.Load() >= scoreOn {
		q.skip, q.probeEvery = 0, probeMin
		return p.win, false
	}
	if q.probeEvery == 0 {
		q.probeEvery = probeMin
	}
	if q.probeNow {
		q.probeNow, q.skip = false, 0
	}
	if q.skip > 0 && q.skip < q.probeEvery {
		q.skip++
		return 0, false
	}
	q.skip = 1
	return p.win, true
}

// spun is called when a spin of queue q that dry asked for ended at now:
// hit if requests arrived on q, others the requests the other queues have
// received so far, and contended if the spin found the CPU held by another
// thread (see pollPolicy).
func (p *pollPolicy) spun(q *pollQueue, now int64, hit bool, others uint64, contended, probe bool) {
	if probe {
		q.probes.Add(1)
	} else {
		q.polls.Add(1)
	}
	if hit {
		q.hits.Add(1)
	}
	if contended {
		q.contended.Add(1)
		p.contention(now)
		return
	}
	if p.mode != pollAdaptive {
		return
	}
	switch {
	case hit:
		// The gap since the daemon last ran dry, on any queue: with
		// the application moving between CPUs, another queue may have
		// served requests during the spin.
		g := now - max(q.dryAt, p.lastDry.Load())
		exact := p.lastExact.Swap(true)
		switch {
		case g > sparseGap:
			p.observe(false)
			q.nextProbe(false)
		case exact:
			p.observe(true)
			q.nextProbe(true)
			q.probeNow = true
		default:
			// The request before came to a sleeping queue, seen
			// late by its wake-up, which shortens this gap by as
			// much: measure the next one.
			q.probeNow = true
		}
	case others != q.others:
		// The request went to another queue (the application moved
		// to another CPU) within the spin: that queue sees the gap.
	default:
		// Nothing came within the spin, at least sparseGap.
		p.observe(false)
		q.nextProbe(false)
	}
}

// woke is called when queue q, which slept since it ran dry, found
// requests at now. Its own wake-up is part of the gap it sees.
func (p *pollPolicy) woke(q *pollQueue, now int64) {
	if p.mode != pollAdaptive {
		return
	}
	// The gap since the daemon last ran dry on any queue: the request
	// may follow one on another queue.
	g := now - max(p.lastDry.Load(), q.dryAt)
	p.lastExact.Store(false)
	switch {
	case g <= sparseGap:
		// Only gaps short enough are seen as dense here, the
		// others are not seen at all: this evidence is one-sided,
		// so it alone does not turn polling on (a spin must see a
		// dense gap too), nor does it shorten the probing interval.
		p.observeWoken()
	case g > sparseGap+wakeSlack:
		p.observe(false)
		q.nextProbe(false)
	}
}

// observe records one gap, dense or not.
func (p *pollPolicy) observe(dense bool) {
	for {
		s := p.score.Load()
		n := s - scoreDown
		if dense {
			n = s + scoreUp
		}
		n = min(max(n, 0), scoreMax)
		if p.score.CompareAndSwap(s, n) {
			break
		}
	}
}

// observeWoken records a dense gap seen by a queue that slept: it raises
// the score by scoreUp up to scoreOn-1.
func (p *pollPolicy) observeWoken() {
	for {
		s := p.score.Load()
		if s >= scoreOn-1 || p.score.CompareAndSwap(s, min(s+scoreUp, scoreOn-1)) {
			return
		}
	}
}

// nextProbe doubles the probing interval of q after a sparse gap, and
// halves it after a dense one.
func (q *pollQueue) nextProbe(dense bool) {
	switch {
	case q.probeEvery == 0:
		q.probeEvery = probeMin
	case dense:
		q.probeEvery = max(q.probeEvery/2, probeMin)
	case q.probeEvery < probeMax:
		q.probeEvery *= 2
	}
}

// contention starts a quiet period at now.
func (p *pollPolicy) contention(now int64) {
	d := p.quiet.Load()
	if last := p.lastQuiet.Load(); last != 0 && now-last < quietMax+d {
		d = min(2*d, quietMax)
	} else {
		d = quietMin
	}
	p.quiet.Store(d)
	p.lastQuiet.Store(now)
	p.quietUntil.Store(now + d)
}

// predicts reports whether the policy expects requests soon: whether a
// queue that runs dry now would poll (rather than sleep or probe).
func (p *pollPolicy) predicts(now int64) bool {
	switch p.mode {
	case pollOff:
		return false
	case pollFixed:
		return now >= p.quietUntil.Load()
	}
	return now >= p.quietUntil.Load() && p.score.Load() >= scoreOn
}
