package uring

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/hints"
)

// fakeRing plays the kernel's part of one queue in memory: the test sends
// requests into free entries (send), the queue's commits come back as
// replies in the order the queue submitted them.
type fakeRing struct {
	mu      sync.Mutex
	cond    sync.Cond
	ents    []entry
	free    []int     // entries armed for a request
	cq      []int     // entries holding a request the queue has not reaped
	sq      []int     // commits queued, not submitted
	rws     []fakeRW  // reads and writes on files queued, not submitted
	dcq     []fakeCQE // their completions, not reaped
	woken   bool
	replies chan fakeReply
	waits   int // calls of wait that slept
	asleep  int // waits that slept and have not returned yet
	wakes   int // calls of wake
	looks   int // calls of ready (a spin looking)
	closed  atomic.Bool

	// timeouts holds the timeout of every wait that slept (0: none);
	// fire ends a timed wait as its timer would.
	timeouts []int64
	fired    bool
}

// fakeRW is a read or write on a file queued on a fakeRing (Direct).
type fakeRW struct {
	ud    uint64
	write bool
	fd    int32
	buf   []byte
	off   int64
}

// fakeCQE is the completion of a fakeRW.
type fakeCQE struct {
	ud  uint64
	res int32
}

func (r *fakeRing) rw(e *entry, write bool, fd int32, buf []byte, off int64) bool {
	r.rws = append(r.rws, fakeRW{udDirect | uint64(e.idx), write, fd, buf, off})
	return true
}

type fakeReply struct {
	unique uint64
	status int32
	size   int
}

func newFakeRing() *fakeRing {
	r := &fakeRing{replies: make(chan fakeReply, 1024)}
	r.cond.L = &r.mu
	return r
}

func (r *fakeRing) register(ents []entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ents = ents
	for i := range ents {
		r.free = append(r.free, i)
	}
	r.cond.Broadcast()
	return nil
}

func (r *fakeRing) commit(e *entry) bool {
	r.sq = append(r.sq, e.idx)
	return true
}

func (r *fakeRing) queued() int { return len(r.sq) + len(r.rws) }

func (r *fakeRing) submit() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.rws {
		var n int
		var err error
		if w.write {
			n, err = unix.Pwrite(int(w.fd), w.buf, w.off)
		} else {
			n, err = unix.Pread(int(w.fd), w.buf, w.off)
		}
		if err != nil {
			n = -int(err.(unix.Errno))
		}
		r.dcq = append(r.dcq, fakeCQE{w.ud, int32(n)})
	}
	r.rws = r.rws[:0]
	for _, i := range r.sq {
		e := &r.ents[i]
		o := (*fuse.OutHeader)(unsafe.Pointer(&e.hdr[hdrInOut]))
		r.replies <- fakeReply{o.Unique, o.Status, int(*(*uint32)(unsafe.Pointer(&e.hdr[hdrPayloadSz])))}
		r.free = append(r.free, i)
	}
	r.sq = r.sq[:0]
	r.cond.Broadcast()
	return nil
}

func (r *fakeRing) wait(timeout int64) error {
	r.submit()
	r.mu.Lock()
	defer r.mu.Unlock()
	slept := len(r.cq) == 0 && len(r.dcq) == 0 && !r.woken
	if slept {
		r.waits++
		r.timeouts = append(r.timeouts, timeout)
		r.fired = false
		r.asleep++
	}
	for len(r.cq) == 0 && len(r.dcq) == 0 && !r.woken && !(timeout > 0 && r.fired) {
		r.cond.Wait()
	}
	if slept {
		r.asleep--
	}
	r.woken, r.fired = false, false
	return nil
}

// fire ends a timed wait in progress, as its timer does.
func (r *fakeRing) fire() {
	r.mu.Lock()
	r.fired = true
	r.cond.Broadcast()
	r.mu.Unlock()
}

// sleeps returns the timeouts of the waits that slept so far.
func (r *fakeRing) sleeps() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.timeouts...)
}

func (r *fakeRing) next() (uint64, int32, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.dcq) > 0 {
		c := r.dcq[0]
		r.dcq = r.dcq[1:]
		return c.ud, c.res, true
	}
	if len(r.cq) == 0 {
		return 0, 0, false
	}
	i := r.cq[0]
	r.cq = r.cq[1:]
	return uint64(i), 0, true
}

func (r *fakeRing) ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.looks++
	return len(r.cq) > 0 || len(r.dcq) > 0
}

// lookCount returns how many times a spin has looked at the ring.
func (r *fakeRing) lookCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.looks
}

func (r *fakeRing) wake() {
	r.mu.Lock()
	r.wakes++
	r.woken = true
	r.cond.Broadcast()
	r.mu.Unlock()
}

func (r *fakeRing) close() { r.closed.Store(true) }

// unreaped returns the number of requests the queue has not taken yet.
func (r *fakeRing) unreaped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cq)
}

// send puts a request into a free entry, as the kernel does, waiting for
// one if none is free.
func (r *fakeRing) send(op uint32, unique, node uint64, opIn []byte) {
	r.sendData(op, unique, node, opIn, nil)
}

// sendData is send with the request's payload (a WRITE's data).
func (r *fakeRing) sendData(op uint32, unique, node uint64, opIn, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.free) == 0 {
		r.cond.Wait()
	}
	i := r.free[0]
	r.free = r.free[1:]
	r.ents[i].request(op, unique, node, opIn, payload)
	r.cq = append(r.cq, i)
	r.cond.Broadcast()
}

// read sends a 4 KiB READ of node.
func (r *fakeRing) read(unique, node uint64) { r.readAt(unique, node, 0) }

// readAt sends a 4 KiB READ of node at offset off.
func (r *fakeRing) readAt(unique, node, off uint64) { r.readSize(unique, node, off, 4096) }

// readSize sends a READ of size bytes of node at offset off.
func (r *fakeRing) readSize(unique, node, off uint64, size uint32) {
	in := fuse.ReadIn{Size: size, Offset: off}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))[unsafe.Sizeof(fuse.InHeader{}):]
	r.send(opRead, unique, node, b)
}

// reply returns the next reply, failing the test if none comes (the queue
// is stuck).
func (r *fakeRing) reply(t *testing.T) fakeReply {
	t.Helper()
	select {
	case p := <-r.replies:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no reply: the queue is stuck")
		return fakeReply{}
	}
}

// Nodes of waitFS.
const (
	nodeFast   = 2 // answers at once
	nodeHint   = 3 // says it waits (hints.Waiting), then waits for release
	nodeSilent = 4 // waits for release without saying so
	nodeCancel = 5 // waits for its cancel channel, answers EINTR
	nodeMixed  = 6 // as nodeHint at a non-zero offset, as nodeFast at 0
	nodeCont   = 7 // as nodeHint, then says it goes on (hints.Continuing) and waits for a second release
	nodeExpect = 8 // says it completes in expectIn (hints.Expecting) and waits, then waits for release or its cancel channel (EINTR)
	nodeHold   = 9 // as nodeHint, but waits for hold to close
)

// expectIn is how long nodeExpect's reads say they take.
const expectIn = time.Millisecond

// waitFS answers READs by node, telling started when a waiting read has
// begun.
type waitFS struct {
	fuse.RawFileSystem
	srv     *Server
	started chan uint64
	release chan struct{}
	hold    chan struct{}

	mu       sync.Mutex
	fastTids []int // the threads that answered nodeMixed's fast reads
}

func (f *waitFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	node := in.NodeId
	if node == nodeMixed {
		node = nodeFast
		if in.Offset != 0 {
			node = nodeHint
		} else {
			f.mu.Lock()
			f.fastTids = append(f.fastTids, unix.Gettid())
			f.mu.Unlock()
		}
	}
	switch node {
	case nodeHint:
		ctx := f.srv.Context(cancel)
		if ctx == nil {
			return nil, fuse.EIO
		}
		hints.Waiting(ctx)
		f.started <- in.Unique
		<-f.release
	case nodeCont:
		ctx := f.srv.Context(cancel)
		hints.Waiting(ctx)
		f.started <- in.Unique
		<-f.release
		hints.Continuing(ctx)
		f.started <- in.Unique
		<-f.release
	case nodeExpect:
		ctx := f.srv.Context(cancel)
		hints.Expecting(ctx, expectIn)
		hints.Waiting(ctx)
		f.started <- in.Unique
		select {
		case <-f.release:
		case <-cancel:
			return nil, fuse.EINTR
		}
	case nodeHold:
		hints.Waiting(f.srv.Context(cancel))
		f.started <- in.Unique
		<-f.hold
	case nodeSilent:
		f.started <- in.Unique
		<-f.release
	case nodeCancel:
		f.started <- in.Unique
		<-cancel
		return nil, fuse.EINTR
	}
	return fuse.ReadResultData(buf[:in.Size]), fuse.OK
}

// newFakeServer starts a one-queue server of depth entries on a fake ring.
func newFakeServer(t *testing.T, depth int) (*Server, *fakeRing, *waitFS, *clock.Manual) {
	t.Helper()
	cfg := Config{Depth: depth, PayloadSize: 8192, Poll: PollOff}
	clk := &clock.Manual{}
	clk.Set(1)
	cfg.Clock = clk
	r := newFakeRing()
	s := newServer(cfg, []ring{r}, [][]byte{make([]byte, bufSize(cfg))})
	fs := &waitFS{srv: s, started: make(chan uint64, 16), release: make(chan struct{}), hold: make(chan struct{})}
	if err := s.start(fs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-fs.release:
		default:
			close(fs.release)
		}
		select {
		case <-fs.hold:
		default:
			close(fs.hold)
		}
		s.Close()
		s.Wait()
	})
	return s, r, fs, clk
}

// TestHandOffOnHint: a request that says it waits gives up the queue at
// once; the requests that arrive behind it complete first, and its reply
// is committed later by the thread that leads the queue then.
func TestHandOffOnHint(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 8)
	q := s.queues[0]
	r.read(100, nodeHint)
	if u := <-fs.started; u != 100 {
		t.Fatalf("started %d", u)
	}
	for i := range uint64(5) {
		r.read(200+2*i, nodeFast)
	}
	for i := range 5 {
		p := r.reply(t)
		if p.unique == 100 {
			t.Fatalf("reply %d is the waiting request's", i)
		}
		if p.status != 0 || p.size != 4096 {
			t.Errorf("reply %+v", p)
		}
	}
	close(fs.release)
	if p := r.reply(t); p.unique != 100 || p.status != 0 || p.size != 4096 {
		t.Errorf("the waiting request's reply: %+v", p)
	}
	// The clock never moved: the hint alone handed the queue over.
	if h, w := q.hinted.Load(), q.takenOver.Load(); h != 1 || w != 0 {
		t.Errorf("%d hand-offs on a hint, %d by the watchdog; want 1 and 0", h, w)
	}
	// Later requests still flow, now on the thread that was promoted.
	r.read(300, nodeFast)
	if p := r.reply(t); p.unique != 300 {
		t.Errorf("reply %+v after the hand-off", p)
	}
}

// TestHandOffManyWaiting: every entry but one holds a waiting request; the
// last one still serves a stream of quick requests. The first waiting
// request hands the queue over, and so does each one after it.
func TestHandOffManyWaiting(t *testing.T) {
	const depth = 6
	s, r, fs, _ := newFakeServer(t, depth)
	for i := range uint64(depth - 1) {
		r.read(100+2*i, nodeHint)
		<-fs.started
	}
	for i := range uint64(20) {
		r.read(1000+2*i, nodeFast)
		if p := r.reply(t); p.unique != 1000+2*i {
			t.Fatalf("reply %+v, want %d", p, 1000+2*i)
		}
	}
	close(fs.release)
	seen := map[uint64]bool{}
	for range depth - 1 {
		seen[r.reply(t).unique] = true
	}
	for i := range uint64(depth - 1) {
		if !seen[100+2*i] {
			t.Errorf("no reply to waiting request %d", 100+2*i)
		}
	}
	// Each waiting request handed the queue over and held a thread of
	// its own: the leader is one more.
	if h := s.queues[0].hinted.Load(); h != depth-1 {
		t.Errorf("%d hand-offs on a hint, want %d", h, depth-1)
	}
	if th := s.Stats().Threads; th < depth {
		t.Errorf("%d threads for %d waiting requests and a leader", th, depth-1)
	}
}

// TestFastAfterWaiting: a request starts inline whatever its node's last
// request did. Node nodeMixed waits on reads at a non-zero offset (a
// multipath device's slow path); while one waits, the node's fast reads
// are answered inline, on the leader's thread, with no hand-off of their
// own.
func TestFastAfterWaiting(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 8)
	q := s.queues[0]
	r.readAt(100, nodeMixed, 4096)
	if u := <-fs.started; u != 100 {
		t.Fatalf("started %d", u)
	}
	for i := range uint64(5) {
		r.readAt(200+2*i, nodeMixed, 0)
		if p := r.reply(t); p.unique != 200+2*i || p.status != 0 {
			t.Fatalf("reply %+v, want %d", p, 200+2*i)
		}
	}
	if h := q.hinted.Load(); h != 1 {
		t.Errorf("%d hand-offs, want the waiting request's alone", h)
	}
	// Inline: on the thread that leads the queue.
	fs.mu.Lock()
	for i, tid := range fs.fastTids {
		if tid != int(q.tid.Load()) {
			t.Errorf("fast read %d ran on thread %d, not on the leader %d", i, tid, q.tid.Load())
		}
	}
	fs.mu.Unlock()
	close(fs.release)
	if p := r.reply(t); p.unique != 100 {
		t.Errorf("reply %+v, want the waiting request's", p)
	}
	r.readAt(300, nodeMixed, 0)
	if p := r.reply(t); p.unique != 300 {
		t.Errorf("reply %+v after the wait", p)
	}
	if h := q.hinted.Load(); h != 1 {
		t.Errorf("%d hand-offs after the wait, want 1", h)
	}
}

// counts returns how many times the queue slept in wait and was woken.
func (r *fakeRing) counts() (waits, wakes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits, r.wakes
}

// TestContinuingWakesLeader: a waiting request that says it goes on wakes
// the sleeping leader, which then stays awake (spins, by the server's clock,
// which does not move here) until the reply is there to commit.
func TestContinuingWakesLeader(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 4)
	q := s.queues[0]
	r.read(100, nodeCont)
	<-fs.started
	r.read(200, nodeFast) // the new leader serves it, then sleeps
	if p := r.reply(t); p.unique != 200 {
		t.Fatalf("reply %+v", p)
	}
	for q.sleeping.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	waits, wakes := r.counts()
	fs.release <- struct{}{} // the request says it goes on
	<-fs.started
	for q.sleeping.Load() != 0 || q.expect.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if w, k := r.counts(); k != wakes+1 {
		t.Fatalf("%d wakes after Continuing, want %d (waits %d -> %d)", k, wakes+1, waits, w)
	}
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 100 || p.status != 0 {
		t.Fatalf("reply %+v", p)
	}
	// One more sleep at most: the wake's own. The reply came without the
	// leader sleeping again or being woken for it.
	if w, k := r.counts(); w > waits+1 || k != wakes+1 {
		t.Errorf("waits %d -> %d, wakes %d -> %d: the leader slept through the expected reply", waits, w, wakes, k)
	}
}

// TestContinuingDeepQueue: with another request of the queue waiting off
// the leader, the one that says it goes on neither wakes the leader nor has
// it spin; the reply wakes it (as TestContinuingWakesLeader shows, a lone
// request does).
func TestContinuingDeepQueue(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 4)
	q := s.queues[0]
	r.read(100, nodeCont)
	<-fs.started
	r.read(101, nodeHold)
	<-fs.started
	for q.sleeping.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if a := q.away(); a != 2 {
		t.Fatalf("%d requests away, want 2", a)
	}
	_, wakes := r.counts()
	fs.release <- struct{}{} // 100 says it goes on
	<-fs.started
	if _, k := r.counts(); k != wakes || q.expect.Load() != 0 {
		t.Fatalf("wakes %d -> %d, expect %d: Continuing with two requests away woke the leader", wakes, k, q.expect.Load())
	}
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 100 || p.status != 0 {
		t.Fatalf("reply %+v", p)
	}
	close(fs.hold)
	if p := r.reply(t); p.unique != 101 || p.status != 0 {
		t.Fatalf("reply %+v", p)
	}
	for q.away() != 0 {
		time.Sleep(time.Millisecond)
	}
}

// TestWatchdogTakeover: a request that waits without saying so holds the
// queue until the watchdog sees it ran longer than DefaultTakeoverAfter, by the
// server's clock; then the requests behind it go on.
func TestWatchdogTakeover(t *testing.T) {
	s, r, fs, clk := newFakeServer(t, 4)
	q := s.queues[0]
	r.read(100, nodeSilent)
	<-fs.started
	r.read(200, nodeFast)
	start := clk.Nanotime()
	clk.Set(start + int64(DefaultTakeoverAfter)/2)
	if !s.dog.check() {
		t.Error("watchdog: no queue busy")
	}
	// Held: the quick request is still where the kernel put it.
	if n := r.unreaped(); n != 1 || q.takenOver.Load() != 0 {
		t.Fatalf("before the deadline: %d unreaped, %d takeovers", n, q.takenOver.Load())
	}
	clk.Set(start + 2*int64(DefaultTakeoverAfter))
	s.dog.check()
	if q.takenOver.Load() != 1 {
		t.Fatalf("%d takeovers after the deadline", q.takenOver.Load())
	}
	if p := r.reply(t); p.unique != 200 {
		t.Errorf("first reply %+v, want the quick request's", p)
	}
	close(fs.release)
	if p := r.reply(t); p.unique != 100 {
		t.Errorf("second reply %+v", p)
	}
	if q.hinted.Load() != 0 {
		t.Errorf("%d hand-offs on a hint", q.hinted.Load())
	}
}

// TestInterrupt: Interrupt closes the cancel channel of the request with
// that unique id only; the entry's next request gets an open channel.
func TestInterrupt(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 1)
	r.read(100, nodeCancel)
	<-fs.started
	if s.Interrupt(102) {
		t.Error("interrupted a request that does not exist")
	}
	if !s.Interrupt(100) {
		t.Fatal("Interrupt(100) found no request")
	}
	if p := r.reply(t); p.unique != 100 || p.status != -int32(unix.EINTR) {
		t.Errorf("interrupted reply %+v", p)
	}
	// Same entry (depth 1): a fresh channel, known to Context.
	r.read(104, nodeHint)
	<-fs.started
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 104 || p.status != 0 {
		t.Errorf("reply after the interrupt %+v", p)
	}
	e := &s.queues[0].ent[0]
	select {
	case <-e.cancel:
		t.Error("the entry's channel is still closed")
	default:
	}
	if s.Context(e.cancel) == nil || len(*s.byCancel.Load()) != 1 {
		t.Error("the renewed channel is not mapped alone")
	}
}

// TestContextFUA: Context carries the request's Waiter and, for a WRITE with
// O_DSYNC, the FUA context.
func TestContextFUA(t *testing.T) {
	cfg := Config{Depth: 1, PayloadSize: 8192}
	s := newServer(cfg, []ring{newFakeRing()}, [][]byte{make([]byte, bufSize(cfg))})
	e := &s.queues[0].ent[0]
	in := fuse.WriteIn{Size: 0, Flags: unix.O_DSYNC}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))[unsafe.Sizeof(fuse.InHeader{}):]
	e.request(opWrite, 10, 7, b, nil)
	e.prepare()
	if !e.fua || s.Context(e.cancel) != e.fuaCtx {
		t.Error("O_DSYNC write: not the FUA context")
	}
	e.request(opRead, 12, 7, nil, nil)
	e.prepare()
	if e.fua || s.Context(e.cancel) != e.ioCtx {
		t.Error("read: not the I/O context")
	}
	if s.Context(make(chan struct{})) != nil {
		t.Error("a foreign channel has a context")
	}
}

// sleepsAfter waits until the queue's leader has slept more than n times
// and is asleep, and returns the timeouts of all its sleeps.
func (r *fakeRing) sleepsAfter(t *testing.T, n int) []int64 {
	t.Helper()
	for range 10000 {
		r.mu.Lock()
		sl, asleep := append([]int64(nil), r.timeouts...), r.asleep > 0
		r.mu.Unlock()
		if len(sl) > n && asleep {
			return sl
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the leader did not sleep again after %d sleeps", n)
	return nil
}

// TestExpectingArmsLeader: a request that says when it completes, alone on
// its queue, lets the leader sleep with a timeout that ends expectMargin
// before then; once the timer has fired the leader stays awake (spins, by
// the server's clock, which does not move here) and commits the reply
// without being woken for it. With nothing in flight it sleeps without a
// timeout again.
func TestExpectingArmsLeader(t *testing.T) {
	s, r, fs, clk := newFakeServer(t, 4)
	q := s.queues[0]
	start := clk.Nanotime()
	at := start + int64(expectIn)
	n0 := len(r.sleeps())
	r.read(100, nodeExpect)
	<-fs.started
	sl := r.sleepsAfter(t, n0)
	if got, want := sl[len(sl)-1], at-s.expectMargin-start; got != want {
		t.Fatalf("the leader sleeps with timeout %d, want %d (%v)", got, want, sl)
	}
	n := len(sl)
	_, wakes := r.counts()
	looks := r.lookCount()
	clk.Set(at - s.expectMargin)
	r.fire()
	// Release the request once the leader spins for it: released while
	// the leader is still on its way there, the request ends its
	// expectation first, and the leader rightly sleeps until woken.
	for q.sleeping.Load() != 0 || r.lookCount() == looks {
		time.Sleep(time.Millisecond)
	}
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 100 || p.status != 0 {
		t.Fatalf("reply %+v", p)
	}
	if _, k := r.counts(); k != wakes {
		t.Errorf("%d wakes for the expected reply, want none", k-wakes)
	}
	sl = r.sleepsAfter(t, n)
	if len(sl) != n+1 || sl[n] != 0 {
		t.Errorf("sleeps after the timer %v, want one without a timeout", sl[n:])
	}
}

// startArmed starts request unique on nodeExpect, the queue's only request,
// and returns the leader's sleeps once it sleeps armed (with a timeout) for
// it.
func (r *fakeRing) startArmed(t *testing.T, fs *waitFS, unique uint64) []int64 {
	t.Helper()
	r.read(unique, nodeExpect)
	<-fs.started
	sl := r.sleepsAfter(t, 0)
	if sl[len(sl)-1] <= 0 {
		t.Fatalf("sleeps %v: not armed for the only request", sl)
	}
	return sl
}

// TestExpectingExpires: an expected reply that does not come by the time
// the leader's spin ends (expected time plus hints.ContinueLead) leaves the
// leader asleep without a timeout, not spinning and not re-armed; the
// request still completes (here: interrupted), and the next one arms the
// leader again.
func TestExpectingExpires(t *testing.T) {
	s, r, fs, clk := newFakeServer(t, 4)
	q := s.queues[0]
	n := len(r.startArmed(t, fs, 100))
	at := clk.Nanotime() + int64(expectIn)
	clk.Set(at - s.expectMargin)
	r.fire()
	for q.sleeping.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	clk.Set(at + int64(hints.ContinueLead) + 1)
	sl := r.sleepsAfter(t, n)
	if len(sl) != n+1 || sl[n] != 0 {
		t.Fatalf("sleeps after the expected time %v, want one without a timeout", sl[n:])
	}
	if !s.Interrupt(100) {
		t.Fatal("no request 100")
	}
	if p := r.reply(t); p.unique != 100 || p.status != -int32(unix.EINTR) {
		t.Fatalf("reply %+v", p)
	}
	n = len(r.sleeps())
	r.read(102, nodeExpect)
	<-fs.started
	sl = r.sleepsAfter(t, n)
	if got := sl[len(sl)-1]; got != int64(expectIn)-s.expectMargin {
		t.Errorf("the next request's sleep: timeout %d, want %d (%v)", got, int64(expectIn)-s.expectMargin, sl[n:])
	}
}

// TestExpectingDeepQueue: with two requests in flight the leader does not
// arm itself for either (a deep queue's leader wakes often enough); the
// second request, arriving while the leader sleeps armed for the first,
// wakes it as any request does.
func TestExpectingDeepQueue(t *testing.T) {
	_, r, fs, _ := newFakeServer(t, 4)
	n := len(r.startArmed(t, fs, 100))
	r.read(102, nodeExpect)
	<-fs.started
	sl := r.sleepsAfter(t, n)
	for _, to := range sl[n:] {
		if to != 0 {
			t.Errorf("sleeps with two requests in flight %v, want no timeout", sl[n:])
			break
		}
	}
	close(fs.release)
	seen := map[uint64]bool{}
	for range 2 {
		seen[r.reply(t).unique] = true
	}
	if !seen[100] || !seen[102] {
		t.Errorf("replies %v", seen)
	}
}

// TestExpectingOff: a negative Config.ExpectMargin turns the timed sleep
// off.
func TestExpectingOff(t *testing.T) {
	cfg := Config{Depth: 2, PayloadSize: 8192, Poll: PollOff, ExpectMargin: -1}
	s := newServer(cfg, []ring{newFakeRing()}, [][]byte{make([]byte, bufSize(cfg))})
	q := s.queues[0]
	e := &q.ent[0]
	e.seq = 1
	q.cur.Store(1)
	q.inflight = 1
	e.Expecting(expectIn)
	if at := q.expected(); at != 0 {
		t.Errorf("expected() = %d with expectations off", at)
	}
	s.expectMargin = int64(DefaultExpectMargin)
	if at := q.expected(); at != e.expectAt.Load() || at == 0 {
		t.Errorf("expected() = %d, want %d", at, e.expectAt.Load())
	}
	e.ended()
	if at := q.expected(); at != 0 {
		t.Errorf("expected() = %d after the request ended", at)
	}
}

// standbys returns how many threads of q wait to lead.
func (q *queue) standbys() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.idle
}

// TestStandbyReused: a thread that gave up the queue for a waiting request
// waits as standby once that request is answered; the next waiting request
// hands the queue to that thread, starts no other, and requests go on
// flowing on it. Closing the server ends a standby thread too.
func TestStandbyReused(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 8)
	q := s.queues[0]
	r.read(1, nodeFast) // the first leader has registered and runs
	r.reply(t)
	first := q.tid.Load()

	r.read(100, nodeHint)
	<-fs.started
	second := q.tid.Load()
	for second == first {
		runtime.Gosched()
		second = q.tid.Load()
	}
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 100 {
		t.Fatalf("reply %+v, want the waiting request's", p)
	}
	for i := 0; q.standbys() != 1; i++ {
		if i > 10_000_000 {
			t.Fatalf("%d standby threads after the waiting request, want 1", q.standbys())
		}
		runtime.Gosched()
	}

	r.read(102, nodeHint)
	<-fs.started
	for i := 0; q.tid.Load() != first; i++ {
		if i > 10_000_000 {
			t.Fatalf("thread %d leads, want the standby thread %d (the second leader was %d)", q.tid.Load(), first, second)
		}
		runtime.Gosched()
	}
	if q.standbys() != 0 {
		t.Errorf("%d standby threads while two hold the waiting request and the queue", q.standbys())
	}
	r.read(104, nodeFast)
	if p := r.reply(t); p.unique != 104 {
		t.Errorf("reply %+v, want 104", p)
	}
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 102 {
		t.Errorf("reply %+v, want 102", p)
	}
	if th, h := s.Stats().Threads, q.hinted.Load(); th != 2 || h != 2 {
		t.Errorf("%d threads and %d hand-offs; want 2 and 2", th, h)
	}

	for i := 0; q.standbys() != 1; i++ {
		if i > 10_000_000 {
			t.Fatalf("%d standby threads before Close, want 1", q.standbys())
		}
		runtime.Gosched()
	}
	s.Close()
	done := make(chan struct{})
	go func() { s.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close left a standby thread waiting")
	}
}
