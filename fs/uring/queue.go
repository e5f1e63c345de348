package uring

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/internal/hints"
)

// queue is one ring and its entries. One thread at a time leads it: it reaps
// completions, answers requests inline and commits the replies, so that one
// io_uring_enter both commits a reply and waits for the next request. Other
// threads of the queue wait as standby.
//
// A request that is going to wait (hints.Waiting, through entry.Waiting) or
// that has held the leader for longer than the watchdog allows gives up the
// queue: a standby thread (a new one if none waits) becomes the leader at
// once, and the old leader finishes the request, puts the entry on the
// queue's list of finished entries, wakes the new leader to commit it, and
// becomes a standby thread itself, bound to the queue's CPU again before it
// waits, so that a promotion takes no system call. A waiting request that
// says it is about to complete (hints.Continuing, through entry.Continuing)
// while it is the queue's only request away from the leader wakes the
// leader ahead of its reply, and the leader spins for it rather than sleep
// (with several away, their replies wake it as they come). One that
// says when it will complete (hints.Expecting, through entry.Expecting) while
// it is the queue's only request lets the leader sleep with a timeout that
// ends expectMargin before then, and spin from there (see expected).
type queue struct {
	s     *Server
	id    int
	r     ring
	mem   []byte
	unmap bool // mem is a mapping of New's
	ent   []entry

	// Leader-only state.
	pending  []*entry // requests reaped but not handled yet, from pendNext on
	pendNext int
	dead     int
	seq      uint64 // sequence number of the last request handled inline
	poll     pollQueue
	inflight int // requests reaped and not committed yet
	directs  int // reads and writes on files in flight (Direct)

	directTotal atomic.Uint64 // reads and writes on files issued (Stats.Direct)
	expired     int64         // the last expected completion time the leader spun past
	slept       bool          // the leader slept since it last ran dry

	cur      atomic.Uint64 // sequence number of the leader's inline request; 0: none
	tid      atomic.Int32  // the leader's thread id
	curStart atomic.Int64  // when it started (Server.clock), for the watchdog
	sleeping atomic.Int32
	expect   atomic.Int64          // Server.clock time until which a reply is expected (hints.Continuing)
	expectBy atomic.Pointer[entry] // the entry whose request last said when it completes (hints.Expecting)
	done     atomic.Pointer[entry] // entries answered off the leader
	stopping atomic.Bool

	// Hand-offs, by cause.
	hinted, takenOver   atomic.Uint64
	requests, offloaded atomic.Uint64
	returned            atomic.Uint64 // replies of hand-offs and offloads back (finished)

	mu      sync.Mutex
	idle    int
	threads int
	standby chan struct{}
	closed  bool
}

func newQueue(s *Server, id int, r ring, mem []byte) *queue {
	q := &queue{s: s, id: id, r: r, mem: mem, standby: make(chan struct{}, 1<<16)}
	q.ent = s.newEntries(q, mem)
	q.pending = make([]*entry, 0, len(q.ent))
	return q
}

func (q *queue) release() {
	if q.r != nil {
		q.r.close()
		q.r = nil
	}
	if q.mem != nil && q.unmap {
		unix.Munmap(q.mem)
	}
	q.mem = nil
}

// pin binds the calling thread to CPU cpu.
func pin(cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	unix.SchedSetaffinity(0, &set)
}

// pinLeader binds the calling thread, about to lead q, as Config.Pin says.
func (q *queue) pinLeader() {
	switch q.s.cfg.Pin {
	case PinNone:
		unix.SchedSetaffinity(0, &q.s.cpus)
	case PinOtherCPU:
		pin((q.id + 1) % len(q.s.queues))
	default:
		pin(q.id)
	}
}

// thread is one OS thread of the queue. The goroutine stays locked to its
// thread until it returns, so that the thread, pinned to the queue's CPU,
// ends with it: io_uring cancels a thread's commands when the thread exits,
// and nothing exits while the ring lives.
func (q *queue) thread(leader bool, started chan<- error) {
	runtime.LockOSThread()
	pin(q.id) // registration runs here: bound before lead binds it
	defer q.s.wg.Done()
	if started != nil {
		err := q.r.register(q.ent)
		started <- err
		if err != nil {
			q.exit()
			return
		}
	}
	// bound: the thread is bound as the queue's leader (pinLeader). A
	// standby thread is bound before it waits, so that its promotion
	// neither makes a system call nor moves it between CPUs on the way
	// to the ring.
	bound := false
	for {
		if !leader {
			if !bound {
				q.pinLeader()
				bound = true
			}
			q.mu.Lock()
			if q.closed {
				q.mu.Unlock()
				return
			}
			q.idle++
			q.mu.Unlock()
			if _, ok := <-q.standby; !ok {
				return
			}
		}
		if q.lead(bound) {
			// giveUp unbound the thread.
			leader, bound = false, false
			continue
		}
		q.exit()
		return
	}
}

// exit ends the queue: standby threads return and the ring is released
// once every thread has.
func (q *queue) exit() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.standby)
	}
	q.mu.Unlock()
}

// promote hands the queue to a standby thread, starting one if none waits.
func (q *queue) promote() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	if q.idle > 0 {
		q.idle--
		q.mu.Unlock()
		q.standby <- struct{}{}
		return
	}
	q.threads++
	q.s.wg.Add(1)
	q.mu.Unlock()
	go q.thread(true, nil)
}

// commit queues the reply held by e and re-arms e for the next request.
func (q *queue) commit(e *entry) {
	q.inflight--
	if !q.r.commit(e) {
		q.dead++
	}
}

// wake makes the leader look at its list of finished entries.
func (q *queue) wake() {
	if q.sleeping.CompareAndSwap(1, 0) {
		q.r.wake()
	}
}

// finished queues e, answered off the leader's thread, for commit.
func (q *queue) finished(e *entry) {
	for {
		old := q.done.Load()
		e.next = old
		if q.done.CompareAndSwap(old, e) {
			break
		}
	}
	q.returned.Add(1)
	q.wake()
}

// away returns how many requests of the queue run off the leader's thread
// now: handed off (they waited, or the watchdog took the queue over) or
// offloaded, and not finished. A count read while one changes hands may be
// off by one.
func (q *queue) away() int64 {
	return int64(q.hinted.Load()+q.takenOver.Load()+q.offloaded.Load()) - int64(q.returned.Load())
}

// reap moves completions into pending and returns how many requests arrived.
func (q *queue) reap() int {
	n := 0
	for {
		idx, res, ok := q.r.next()
		if !ok {
			return n
		}
		if idx&udDirect != 0 {
			// A READ or WRITE on a file completed: reply.
			if i := idx &^ udDirect; i < uint64(len(q.ent)) {
				q.directs--
				q.endDirect(&q.ent[i], res)
			}
			continue
		}
		if idx >= uint64(len(q.ent)) {
			continue
		}
		e := &q.ent[idx]
		if res < 0 {
			// ENOTCONN after an unmount, or a cancelled entry.
			if res != -int32(unix.ENOTCONN) && res != -int32(unix.ENODEV) && res != -int32(unix.ECANCELED) {
				q.s.cfg.Logf("io_uring queue %d: entry %d: %v", q.id, e.idx, unix.Errno(-res))
			}
			q.dead++
			continue
		}
		q.pending = append(q.pending, e)
		q.inflight++
		n++
	}
}

// lead runs the queue until it ends (false) or until it hands the queue to
// another thread because a request waits (true).
func (q *queue) lead(bound bool) bool {
	// Only the leader and standby threads are bound to the queue's CPU: a
	// thread that gave up the queue was unbound (giveUp), so that the
	// requests waiting on such threads (a delay target's spin to its
	// deadline) do not queue up for one CPU.
	if !bound {
		q.pinLeader()
	}
	q.tid.Store(int32(unix.Gettid()))
	for {
		if d := q.done.Swap(nil); d != nil {
			for e := d; e != nil; {
				nx := e.next
				e.next = nil
				q.commit(e)
				e = nx
			}
		}
		if q.pendNext < len(q.pending) {
			// Pop before handling: if the queue changes hands while
			// e runs, the new leader owns exactly what is left.
			e := q.pending[q.pendNext]
			q.pendNext++
			if q.pendNext == len(q.pending) {
				q.pending, q.pendNext = q.pending[:0], 0
			}
			q.poll.burst++
			if q.handle(e) {
				return true
			}
			if q.r.queued() >= q.s.cfg.SubmitBatch {
				q.r.submit()
			}
			continue
		}
		if q.reap() > 0 {
			if q.slept {
				// Requests woke the leader, which slept since
				// it ran dry: a gap its wake-up is part of.
				q.slept = false
				q.s.poll.woke(&q.poll, q.s.clock.Nanotime())
			}
			continue
		}
		if q.dead >= len(q.ent) || q.stopping.Load() {
			q.drainDirect()
			return false
		}
		if q.r.queued() > 0 && q.directs > 0 {
			// Reads and writes on files wait in the submission
			// queue: issue them (and the replies queued with them)
			// before the queue counts as dry.
			if q.r.submit() == nil {
				continue
			}
		}
		if q.pollDry() {
			continue
		}
		if until := q.expect.Load(); until != 0 {
			// A waiting request said it completes soon: spin for
			// its reply instead of sleeping through it.
			if w := until - q.s.clock.Nanotime(); w > 0 {
				if q.r.queued() > 0 {
					q.r.submit()
				}
				if hit, _ := q.spin(w, false); hit {
					continue
				}
			}
			q.expect.CompareAndSwap(until, 0)
		}
		var timeout int64
		if at := q.expected(); at != 0 {
			// The queue's only request says when it completes:
			// sleep until shortly before, then spin for it.
			now := q.s.clock.Nanotime()
			if wake := at - q.s.expectMargin; wake > now {
				timeout = wake - now
			} else {
				if q.r.queued() > 0 {
					q.r.submit()
				}
				if hit, _ := q.spin(at+int64(hints.ContinueLead)-now, false); hit {
					continue
				}
				q.expired = at
			}
		}
		q.sleeping.Store(1)
		if q.done.Load() != nil || q.stopping.Load() {
			q.sleeping.Store(0)
			continue
		}
		if err := q.r.wait(timeout); err != nil {
			q.s.cfg.Logf("io_uring queue %d: io_uring_enter: %v", q.id, err)
			q.sleeping.Store(0)
			return false
		}
		q.sleeping.Store(0)
		q.slept = true
	}
}

// pollDry runs when the leader ran dry: it asks the daemon's polling
// policy whether to spin, spins, and tells the policy what came of it. It
// reports whether the spin found something to do.
func (q *queue) pollDry() bool {
	p := &q.s.poll
	now := q.s.clock.Nanotime()
	q.slept = false
	w, probe := p.dry(&q.poll, now, q.s.others(q))
	if w <= 0 {
		return false
	}
	if q.r.queued() > 0 {
		q.r.submit()
	}
	hit, contended := q.spin(w, true)
	p.spun(&q.poll, q.s.clock.Nanotime(), hit, q.s.others(q), contended, probe)
	return hit
}

// spin polls the completion queue and the finished list for up to w
// nanoseconds, and reports whether it found something to do. Between looks
// it yields the CPU (sched_yield), so that a thread that is ready to run on
// this CPU, often the application that issues the requests, runs first:
// polling uses only a CPU nobody else wants. If yield watches for that, a
// look that comes contendedAfter or more after the one before ends the spin
// and reports contention: another thread held the CPU for a time slice.
// Spins for an expected reply (yield false) go on regardless.
func (q *queue) spin(w int64, yield bool) (hit, contended bool) {
	start := q.s.clock.Nanotime()
	end, last := start+w, start
	defer func() { q.poll.spunFor(q.s.clock.Nanotime() - start) }()
	for {
		found := q.r.ready() || q.done.Load() != nil || q.stopping.Load()
		now := q.s.clock.Nanotime()
		if yield && now-last >= contendedAfter {
			// Also when the look finds a request: one that
			// came while another thread held the CPU waited for
			// it, as the next will.
			return found, true
		}
		if found {
			return true, false
		}
		if now > end {
			return false, false
		}
		last = now
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// handle answers one request inline. It reports whether the queue changed
// hands while the request ran (the request waited, or the watchdog took
// the queue over); the reply then goes to the new leader.
func (q *queue) handle(e *entry) bool {
	if e.prepare() {
		q.s.renew(e)
	}
	q.requests.Add(1)
	offload := q.s.cfg.OffloadBytes > 0 && e.size() >= q.s.cfg.OffloadBytes
	if q.s.direct != nil && !offload && q.direct(e) {
		return false
	}
	if offload {
		// A large READ or WRITE is mostly a copy: run it on an
		// offload worker (another thread, another CPU), so that the
		// queue goes on meanwhile. It counts as one of the queues'
		// threads, so that the rings and their buffers outlive it even
		// after Close.
		e.seq = 0
		q.offloaded.Add(1)
		q.s.wg.Add(1)
		q.s.offloads.run(e)
		return false
	}
	q.seq++
	e.seq = q.seq
	q.curStart.Store(q.s.clock.Nanotime())
	q.cur.Store(e.seq)
	q.s.dog.busy()
	e.dispatch(q.s.fs)
	e.ended()
	if !q.cur.CompareAndSwap(e.seq, 0) {
		// Another thread now owns the ring: hand the reply to it.
		q.finished(e)
		return true
	}
	q.commit(e)
	return false
}

// runOffloaded runs e's request off the leader's thread (a large READ or
// WRITE, see Config.OffloadBytes) and hands its reply to the leader.
func (e *entry) runOffloaded() {
	defer e.q.s.wg.Done()
	e.dispatch(e.q.s.fs)
	e.ended()
	e.q.finished(e)
}

// giveUp hands the queue to another thread if the request with sequence
// number seq is the leader's inline request, and reports whether it was.
func (q *queue) giveUp(seq uint64) bool {
	if seq == 0 || !q.cur.CompareAndSwap(seq, 0) {
		return false
	}
	unix.SchedSetaffinity(int(q.tid.Load()), &q.s.cpus)
	q.promote()
	return true
}

// inline reports whether e's request runs on the leader's thread.
func (e *entry) inline() bool {
	return e.seq != 0 && e.q.cur.Load() == e.seq
}

// Waiting implements hints.Waiter: the request held by e is about to wait,
// so the queue goes to another thread now.
func (e *entry) Waiting() {
	if e.q.giveUp(e.seq) {
		e.q.hinted.Add(1)
	}
}

// Continuing implements hints.Continuer: the request held by e, which
// waits off the leader's thread, completes within hints.ContinueLead. The
// leader, woken now if it sleeps, spins until then, so that it is awake to
// commit the reply at once: waking a sleeping thread takes tens of
// microseconds, more on an idle virtual CPU.
//
// Only a request that is the queue's one request off the leader does so.
// With several away (a deep queue of waiting requests), their replies come
// one after another and the leader would spin all the time, on a CPU that
// the requests about to reply, and the application, need; the first reply
// wakes a sleeping leader (finished), and it commits whatever else is
// finished by then.
func (e *entry) Continuing() {
	q := e.q
	if e.inline() {
		return // the leader runs it
	}
	if q.away() > 1 {
		return
	}
	until := q.s.clock.Nanotime() + int64(hints.ContinueLead)
	for {
		old := q.expect.Load()
		if old >= until || q.expect.CompareAndSwap(old, until) {
			break
		}
	}
	q.wake()
}

// expected returns the time (Server.clock) at which the queue's only
// request in flight said it would complete (entry.Expecting), or 0: there
// is no such request, it has other requests in flight (a deep queue: its
// leader wakes often enough, and a spin per request would take a CPU from
// the application), expectations are off, or the leader already spun past
// this time without the reply (a request that completes late, or never:
// the leader then sleeps until woken, and an idle daemon burns no CPU). A
// request's expectation ends with it (entry.ended).
func (q *queue) expected() int64 {
	if q.inflight != 1 || q.s.expectMargin < 0 {
		return 0
	}
	e := q.expectBy.Load()
	if e == nil {
		return 0
	}
	at := e.expectAt.Load()
	if at == q.expired {
		return 0
	}
	return at
}

// Expecting implements hints.Expecter: the request held by e, which waits,
// expects to complete d from now. A leader that sleeps without a timeout
// is woken to set one.
func (e *entry) Expecting(d time.Duration) {
	q := e.q
	e.expectAt.Store(q.s.clock.Nanotime() + int64(d))
	q.expectBy.Store(e)
	if !e.inline() {
		q.wake() // the leader may be asleep already
	}
}
