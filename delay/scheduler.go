package delay

import (
	"container/heap"
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/stack"
)

// Classes of I/O, as dm-delay sorts bios.
const (
	classRead  = iota // reads
	classWrite        // writes, discards, write-zeroes
	classFlush        // flushes (fsync)
	numClasses
)

// Scheduler releases delayed requests at their deadlines. One scheduler
// serves every delay target of a Manager (Type keeps it in the Manager's
// stack.SharedSet): a single goroutine, locked to its
// OS thread, keeps the earliest pending deadline of each target in a heap and
// waits on its Clock until the earliest one, less the clock's Lead. Each
// pass releases every request due within the lead, target by target, in the
// order the requests arrived; a released request waits out the rest of its
// delay on its own goroutine. With nothing queued it waits without a
// deadline and costs no CPU; a request whose deadline is earlier than the one
// being waited for wakes it at once.
//
// The goroutine starts when the first target is constructed and ends when the
// last one is closed and nothing is pending.
type Scheduler struct {
	clock   Clock
	sleeper Sleeper // clock, if it can sleep without spinning

	mu        sync.Mutex
	stopped   sync.Cond // signalled on mu when the loop goroutine ends
	heap      queueHeap // queues with pending requests, by earliest deadline
	users     int       // live targets
	running   bool      // the loop goroutine exists
	waiting   bool      // the loop is in (or about to enter) clock.Wait or Sleep
	waitUntil int64     // the deadline of that wait

	// active counts the requests longer than the lead, of every target,
	// from the moment they queue until their wait returns (released ones
	// spinning to their deadlines included).
	active atomic.Int32

	// owned by the loop goroutine
	due     []*queue
	dueNext []int64
	dueMore []bool
	batch   []*waiter
	// short: the last pass released a request whose delay is below
	// LingerBelow, so the next one of its stream may need the loop within
	// a thread wake-up of its arrival.
	short bool

	// onRelease, if set, is called by the loop for every released request in
	// release order (tests).
	onRelease func(w *waiter)
}

// NewScheduler returns a scheduler on clock c. Its goroutine starts with its
// first target.
func NewScheduler(c Clock) *Scheduler {
	s := &Scheduler{clock: c}
	s.sleeper, _ = c.(Sleeper)
	s.stopped.L = &s.mu
	return s
}

// SchedulerProcs is how many Ps a scheduler on the real clock wants on top
// of one per CPU: one for its thread, which naps in ppoll, and one for a
// request parked in futex. A thread in a system call holds its P until the
// runtime's sysmon takes it back; with no spare P a goroutine the scheduler
// readies waits for sysmon. The daemon raises GOMAXPROCS by it.
const SchedulerProcs = 2

// NewRealScheduler returns a scheduler on a real clock of its own. Close it
// once its targets are closed.
func NewRealScheduler() (*Scheduler, error) {
	c, err := NewRealClock()
	if err != nil {
		return nil, err
	}
	return NewScheduler(c), nil
}

// Close waits for the scheduler's goroutine to end and closes its clock (if
// the clock has a Close). It fails while a target still uses the scheduler.
func (s *Scheduler) Close() error {
	s.mu.Lock()
	if s.users > 0 {
		n := s.users
		s.mu.Unlock()
		return fmt.Errorf("delay: scheduler still serves %d targets", n)
	}
	for s.running {
		s.stopped.Wait()
	}
	s.mu.Unlock()
	if c, ok := s.clock.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// acquire registers a target, starting the loop if it is not running.
func (s *Scheduler) acquire() {
	s.mu.Lock()
	s.users++
	if !s.running {
		s.running = true
		go s.loop()
	}
	s.mu.Unlock()
}

// release unregisters the target of q, whose requests have all been
// released; the loop ends once no target is left.
func (s *Scheduler) release(q *queue) {
	s.mu.Lock()
	q.closed = true
	if q.heapIdx >= 0 {
		heap.Remove(&s.heap, q.heapIdx)
	}
	s.users--
	wake := s.users == 0 && s.waiting
	if wake {
		s.waiting = false
	}
	s.mu.Unlock()
	if wake {
		s.clock.Wake()
	}
}

// schedule tells the scheduler that q has a request due at d. The caller holds
// q.mu. A queue's key only ever decreases between passes, so it is a lower
// bound of its earliest deadline; a stale key costs one early pass, never a
// late release.
func (s *Scheduler) schedule(q *queue, d int64) {
	s.mu.Lock()
	switch {
	case q.heapIdx < 0:
		q.key = d
		heap.Push(&s.heap, q)
	case d < q.key:
		q.key = d
		heap.Fix(&s.heap, q.heapIdx)
	default:
		s.mu.Unlock()
		return
	}
	wake := s.waiting && s.heap[0] == q && d < s.waitUntil
	if wake {
		s.waiting = false
	}
	s.mu.Unlock()
	if wake {
		s.clock.Wake()
	}
}

// loop is the scheduler goroutine.
func (s *Scheduler) loop() {
	// The thread's timer slack is changed, so the goroutine never unlocks
	// it: the runtime ends the thread when the goroutine returns.
	runtime.LockOSThread()
	setTimerSlack()
	s.mu.Lock()
	for {
		if s.users == 0 && len(s.heap) == 0 {
			s.running = false
			s.stopped.Broadcast()
			s.mu.Unlock()
			return
		}
		lead := s.lead()
		now := s.clock.Nanotime() + lead
		for len(s.heap) > 0 && s.heap[0].key <= now {
			s.due = append(s.due, heap.Pop(&s.heap).(*queue))
		}
		if len(s.due) == 0 {
			until := Forever
			if len(s.heap) > 0 {
				until = s.heap[0].key - lead
			}
			s.waiting, s.waitUntil = true, until
			s.mu.Unlock()
			if s.sleeps(lead, until) {
				s.sleeper.Sleep(until)
			} else {
				s.clock.Wait(until)
			}
			s.mu.Lock()
			s.waiting = false
			continue
		}
		s.mu.Unlock()
		s.pass(s.clock.Nanotime() + lead)
		s.mu.Lock()
		for i, q := range s.due {
			if s.dueMore[i] {
				s.requeue(q, s.dueNext[i])
			}
			s.due[i] = nil
		}
		s.due, s.dueNext, s.dueMore = s.due[:0], s.dueNext[:0], s.dueMore[:0]
	}
}

// sleeps reports whether the loop waits until until in the clock's Sleep
// rather than its Wait (which spins before a deadline and lingers before
// an endless wait): while several requests are active (lead 0) and one is
// queued, since its release is at its deadline and a spin would take a CPU
// the released requests need; and with nothing queued unless the last pass
// released a request shorter than LingerBelow, since the next request of
// a longer delay leaves the loop time to wake.
func (s *Scheduler) sleeps(lead, until int64) bool {
	if s.sleeper == nil || s.clock.Lead() == 0 {
		return false
	}
	if until == Forever {
		return !s.short
	}
	return lead == 0
}

// lead returns how early the loop releases requests now: the clock's Lead
// while at most one request is active, 0 while several are.
func (s *Scheduler) lead() int64 {
	if s.active.Load() > 1 {
		return 0
	}
	return s.clock.Lead()
}

// pass releases every expired request of the due queues.
func (s *Scheduler) pass(now int64) {
	for _, q := range s.due {
		q.mu.Lock()
		var next int64
		var more bool
		s.batch, next, more = q.collectLocked(now, s.batch)
		q.mu.Unlock()
		s.dueNext = append(s.dueNext, next)
		s.dueMore = append(s.dueMore, more)
	}
	if len(s.batch) == 0 {
		return
	}
	s.short = false
	for i, w := range s.batch {
		s.short = s.short || w.delay < int64(LingerBelow)
		if s.onRelease != nil {
			s.onRelease(w)
		}
		w.signal() // w belongs to its goroutine from here on
		s.batch[i] = nil
	}
	s.batch = s.batch[:0]
	s.clock.Yield()
}

// requeue puts q back with key d, or lowers its key if a request queued since
// the pass already put it back. The caller holds s.mu.
func (s *Scheduler) requeue(q *queue, d int64) {
	if q.closed {
		return
	}
	if q.heapIdx < 0 {
		q.key = d
		heap.Push(&s.heap, q)
	} else if d < q.key {
		q.key = d
		heap.Fix(&s.heap, q.heapIdx)
	}
}

// Waiter states, guarded by the queue's lock.
const (
	stateQueued    = iota
	stateReleased  // by the scheduler or presuspend
	stateCancelled // its context ended first
)

// waiter is one delayed request. Its goroutine parks (park) until the
// scheduler, presuspend or its context's end signals it. Waiters come from a
// pool so that a delayed request allocates nothing.
type waiter struct {
	sig        atomic.Uint32 // 1 once signalled
	prev, next *waiter
	deadline   int64
	delay      int64  // requested, ns
	seq        uint64 // arrival order within the queue
	class      uint8
	state      uint8
}

var waiterPool = sync.Pool{New: func() any { return new(waiter) }}

// list holds the waiters of one class in the order they came, which is
// the order of their deadlines, since all its requests have the same delay:
// deadlines in it never decrease.
type list struct {
	head, tail *waiter
	n          int
}

// insert adds w after every waiter whose deadline is not later than w's:
// at the tail, unless a request that came earlier took longer to reach the
// queue's lock (wait stamps a request's deadline before the hints), so that
// every request leaves at its own deadline and in the order they came.
func (l *list) insert(w *waiter) {
	p := l.tail
	for p != nil && p.deadline > w.deadline {
		p = p.prev
	}
	w.prev = p
	if p != nil {
		w.next, p.next = p.next, w
	} else {
		w.next, l.head = l.head, w
	}
	if w.next != nil {
		w.next.prev = w
	} else {
		l.tail = w
	}
	l.n++
}

func (l *list) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next = nil, nil
	l.n--
}

// queue holds the delayed requests of one target: a FIFO per class, the
// "may delay" flag, and the target's place in the scheduler's heap.
type queue struct {
	s  *Scheduler
	mu struct {
		sync.Mutex
		noDelay bool // between presuspend and resume
		seq     uint64
		lists   [numClasses]list
	}
	// guarded by s.mu
	heapIdx int // -1 when not in the heap
	key     int64
	closed  bool
}

func newQueue(s *Scheduler) *queue {
	q := &queue{s: s, heapIdx: -1}
	s.acquire()
	return q
}

// wait delays the calling request of class c by d nanoseconds (d > 0),
// counted from the call, as dm-delay stamps a bio's expiry when it maps it.
// It returns at once while the queue does not delay (suspended). Released
// up to the clock's Lead early, it spins for the rest; a delay no longer
// than the lead spins throughout instead of parking. If ctx ends first the
// request leaves the queue and wait returns an error wrapping EINTR and the
// context's error.
func (q *queue) wait(ctx context.Context, c int, d int64) error {
	// The delay runs from here: what the hints below cost is part of
	// it, not added to it. On io_uring, Waiting hands the queue to
	// another thread (a system call and a thread wake-up, which may
	// preempt this one), and the wake-up of the scheduler below may
	// preempt it too, which a deadline taken after them added to every
	// request (docs/benchmarks.md, Delay).
	due := q.s.clock.Nanotime() + d
	long := d > q.s.clock.Lead()
	// The request waits from here on, however short the delay: a
	// transport that serves other requests on this thread moves them
	// (before the lock: the hint wakes another thread). A request that
	// parks says first when it will complete, its deadline: the
	// transport may be awake for the reply by then.
	if long {
		stack.Expecting(ctx, time.Duration(d))
	}
	stack.Waiting(ctx)
	q.mu.Lock()
	if q.mu.noDelay {
		q.mu.Unlock()
		return nil
	}
	l := &q.mu.lists[c]
	w := waiterPool.Get().(*waiter)
	w.sig.Store(0)
	w.deadline, w.delay = due, d // presuspend rewrites w.deadline once queued
	w.class, w.state = uint8(c), stateQueued
	q.mu.seq++
	w.seq = q.mu.seq
	if long {
		// Counted before the scheduler can see it, until wait returns.
		q.s.active.Add(1)
	}
	l.insert(w)
	if l.head == w && long {
		// A short request needs no scheduler: it spins, and leaves the
		// queue at its deadline unless released first (and hands the
		// scheduler a parked request queued behind it).
		q.s.schedule(q, w.deadline)
	}
	q.mu.Unlock()

	if !long {
		stack.Continuing(ctx)
		// Too short to park: waking a parked request would take longer
		// than the delay. Spin until released or due; a request that is
		// due before the scheduler took it leaves the queue itself.
		for w.sig.Load() == 0 {
			if q.s.clock.Nanotime() < due {
				runtime.Gosched() // up to the whole delay: let others run
				continue
			}
			q.mu.Lock()
			if w.state == stateQueued {
				l.remove(w)
				q.scheduleLongLocked(l)
				q.mu.Unlock()
				waiterPool.Put(w)
				return nil
			}
			q.mu.Unlock()
			w.park() // released at the same moment; the signal is on its way
		}
		q.finish(w, true)
		return nil
	}

	defer q.s.active.Add(-1)
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { q.cancel(w) })
	}
	w.park()
	// Released at most the clock's Lead early: the transport may get
	// ready for the reply now.
	stack.Continuing(ctx)
	reuse := true
	if stop != nil {
		stopped := stop()
		q.mu.Lock()
		cancelled := w.state == stateCancelled
		q.mu.Unlock()
		if cancelled {
			waiterPool.Put(w)
			return fmt.Errorf("delay: %w: %w", syscall.EINTR, ctx.Err())
		}
		// If the cancel function is running, it still holds w: leave w
		// to the garbage collector rather than to another request.
		reuse = stopped
	}
	q.finish(w, reuse)
	return nil
}

// finish ends the wait of a released request: released up to the clock's
// Lead early (or flushed, deadline 0), it spins on the monotonic clock, on the
// goroutine that runs the request, until its deadline.
//
// The spin keeps its P and never yields (runtime.Gosched): a yield puts the
// goroutine on the global run queue and may hand the P to a goroutine locked
// to another thread, such as the scheduler's; a scheduler trace of a 10 ms
// device showed a released request then waiting 4.8 ms for the runtime's
// sysmon to free a P. The spin is at most the clock's Lead.
func (q *queue) finish(w *waiter, reuse bool) {
	deadline := w.deadline
	if reuse {
		waiterPool.Put(w)
	}
	for q.s.clock.Nanotime() < deadline {
	}
}

// cancel takes w out of its list if it is still queued, and signals it.
func (q *queue) cancel(w *waiter) {
	q.mu.Lock()
	if w.state != stateQueued {
		q.mu.Unlock()
		return
	}
	l := &q.mu.lists[w.class]
	l.remove(w)
	q.scheduleLongLocked(l)
	w.state = stateCancelled
	q.mu.Unlock()
	w.signal()
}

// scheduleLongLocked hands the scheduler the first request of l that
// parks, after a request left l by itself (a spinner at its deadline, a
// cancelled one): with delays that differ (a Queue's), a parked request
// may be queued behind one that spins, and only a head is scheduled when
// it is queued. The caller holds q.mu.
func (q *queue) scheduleLongLocked(l *list) {
	lead := q.s.clock.Lead()
	for w := l.head; w != nil; w = w.next {
		if w.delay > lead {
			q.s.schedule(q, w.deadline)
			return
		}
	}
}

// collectLocked detaches every request with deadline <= now, appends them to
// batch in arrival order and marks them released. It returns the earliest
// deadline still queued and whether any request is left. The caller holds
// q.mu.
func (q *queue) collectLocked(now int64, batch []*waiter) ([]*waiter, int64, bool) {
	var heads [numClasses]*waiter
	for c := range q.mu.lists {
		l := &q.mu.lists[c]
		var last *waiter
		for w := l.head; w != nil && w.deadline <= now; w = w.next {
			w.state = stateReleased
			last = w
			l.n--
		}
		if last == nil {
			continue
		}
		heads[c] = l.head
		l.head = last.next
		if l.head != nil {
			l.head.prev = nil
		} else {
			l.tail = nil
		}
		last.next = nil
	}
	for {
		m := -1
		for c, h := range heads {
			if h != nil && (m < 0 || h.seq < heads[m].seq) {
				m = c
			}
		}
		if m < 0 {
			break
		}
		w := heads[m]
		heads[m] = w.next
		w.prev, w.next = nil, nil
		batch = append(batch, w)
	}
	next, more := Forever, false
	for c := range q.mu.lists {
		if h := q.mu.lists[c].head; h != nil {
			more = true
			next = min(next, h.deadline)
		}
	}
	return batch, next, more
}

// flush stops delaying and releases every queued request at once, in arrival
// order (dm-delay's presuspend). The flag is set under the same lock as
// enqueueing, so a request that races with it either is released here or
// passes straight through.
func (q *queue) flush() {
	q.mu.Lock()
	q.mu.noDelay = true
	batch, _, _ := q.collectLocked(Forever, nil)
	q.mu.Unlock()
	for _, w := range batch {
		w.deadline = 0 // no waiting left after the release
		w.signal()
	}
}

// resume delays again.
func (q *queue) resume() {
	q.mu.Lock()
	q.mu.noDelay = false
	q.mu.Unlock()
}

// counts returns the number of queued requests per class.
func (q *queue) counts() (n [numClasses]int) {
	q.mu.Lock()
	for c := range q.mu.lists {
		n[c] = q.mu.lists[c].n
	}
	q.mu.Unlock()
	return n
}

// close releases everything and unregisters the queue from the scheduler.
func (q *queue) close() {
	q.flush()
	q.s.release(q)
}

// queueHeap orders queues by key (container/heap).
type queueHeap []*queue

func (h queueHeap) Len() int           { return len(h) }
func (h queueHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h queueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}

func (h *queueHeap) Push(x any) {
	q := x.(*queue)
	q.heapIdx = len(*h)
	*h = append(*h, q)
}

func (h *queueHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.heapIdx = -1
	return q
}
