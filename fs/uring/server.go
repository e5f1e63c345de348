package uring

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FUSE io_uring commands (enum fuse_uring_cmd).
const (
	cmdRegister       = 1
	cmdCommitAndFetch = 2
)

// Special user_data values; entries use their index.
const (
	udWake = 1 << 62
)

// Defaults.
const (
	// DefaultDepth is the number of entries per queue.
	DefaultDepth = 32
	// slowAfter is a strike against a node when one of its requests took
	// longer than this inline; slowStrikes strikes in a row (a noisy CPU
	// stalls single requests) mark the node's requests for handling off
	// the queue's thread.
	slowAfter   = 200 * time.Microsecond
	slowStrikes = 3
	// slowFor is how long a node stays marked slow.
	slowFor = time.Second
	// takeoverAfter is how long a request may hold a queue's thread before
	// another thread takes over the queue.
	takeoverAfter = time.Millisecond
)

// Config describes the rings of a Server.
type Config struct {
	// Depth is the number of entries per queue (DefaultDepth if 0). Each
	// entry has a payload buffer of PayloadSize bytes.
	Depth int
	// PayloadSize is the size of each entry's payload buffer. The kernel
	// wants at least max(8192, max_write, max_pages x page size).
	PayloadSize int
	// Poll makes a queue's thread spin on its completion queue for up to
	// this long before it sleeps. Zero never spins.
	Poll time.Duration
	// Logf reports problems; nil discards them.
	Logf func(format string, args ...any)
}

// Server serves one FUSE connection's requests through io_uring queues, one
// per possible CPU. Create it before the connection's FUSE_INIT (so that a
// failure to create rings can still fall back to /dev/fuse), then Start it
// once the INIT reply has been written.
type Server struct {
	cfg    Config
	queues []*queue
	fd     int // our own duplicate of the /dev/fuse descriptor
	fs     fuse.RawFileSystem
	cancel chan struct{}

	slow    [1024]atomic.Int64 // per node (hashed): monotonic ns until which it is slow
	strikes [1024]atomic.Int32 // per node (hashed): slow inline requests in a row

	wg      sync.WaitGroup // queue threads
	stopDog chan struct{}
	// The watchdog parks after watchdogIdleTicks ticks with no inline
	// request, so an idle daemon burns no CPU; a leader that starts an
	// inline request while it is parked wakes it.
	dogParked atomic.Bool
	dogWake   chan struct{}
	done      chan struct{}
}

// epoch is the base of the monotonic clock used on the I/O path.
var epoch = time.Now()

func now() int64 { return int64(time.Since(epoch)) + 1 }

// Queues returns the number of queues the kernel wants: one per possible CPU.
func Queues() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err == nil {
		n := 0
		for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
			lo, hi, found := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			z := a
			var err2 error
			if found {
				z, err2 = strconv.Atoi(hi)
			}
			if err1 != nil || err2 != nil {
				n = 0
				break
			}
			n = max(n, z+1)
		}
		if n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
}

// New creates the rings and buffers, but registers nothing yet.
func New(cfg Config) (*Server, error) {
	if cfg.Depth <= 0 {
		cfg.Depth = DefaultDepth
	}
	if cfg.Depth > 4096 {
		return nil, fmt.Errorf("io_uring depth %d is too large", cfg.Depth)
	}
	cfg.PayloadSize = max((cfg.PayloadSize+4095)&^4095, 4096)
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	s := &Server{cfg: cfg, fd: -1, cancel: make(chan struct{}), stopDog: make(chan struct{}), dogWake: make(chan struct{}, 1), done: make(chan struct{})}
	for i := range Queues() {
		q, err := newQueue(s, i)
		if err != nil {
			s.release()
			return nil, err
		}
		s.queues = append(s.queues, q)
	}
	return s, nil
}

// release frees rings and buffers of queues that have no threads.
func (s *Server) release() {
	for _, q := range s.queues {
		q.release()
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// Start registers every entry of every queue on the connection of the
// /dev/fuse descriptor fd (which must have answered FUSE_INIT with
// FUSE_OVER_IO_URING) and starts serving requests with fs. On error nothing
// is left running; the kernel then serves the connection through /dev/fuse.
func (s *Server) Start(fd int, fs fuse.RawFileSystem) error {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		s.release()
		return err
	}
	s.fd = nfd
	s.fs = fs
	errs := make([]chan error, len(s.queues))
	for i, q := range s.queues {
		errs[i] = make(chan error, 1)
		s.wg.Add(1)
		q.threads = 1
		go q.thread(true, errs[i])
	}
	var first error
	for i := range s.queues {
		if err := <-errs[i]; err != nil && first == nil {
			first = fmt.Errorf("queue %d: %w", i, err)
		}
	}
	if first != nil {
		s.Close()
		s.wg.Wait()
		s.release()
		close(s.done)
		return first
	}
	go s.watchdog()
	go func() {
		s.wg.Wait()
		close(s.stopDog)
		s.release()
		close(s.done)
	}()
	return nil
}

// Close stops serving at once: the threads exit and the rings close, which
// cancels every registered entry. It is for failures; after an unmount the
// queues end by themselves.
func (s *Server) Close() {
	if s.fs == nil {
		// Never started: nothing runs.
		s.release()
		close(s.done)
		return
	}
	for _, q := range s.queues {
		q.stopping.Store(true)
		q.wake()
	}
}

// Wait returns when every queue has ended (the connection was aborted by an
// unmount, or Close was called) and the rings are closed.
func (s *Server) Wait() {
	s.wg.Wait()
	<-s.done
}

// isSlow reports whether requests for node should leave the queue's thread.
func (s *Server) isSlow(node uint64, t int64) bool {
	return s.slow[node%uint64(len(s.slow))].Load() > t
}

// strike records a slow inline request of node, and marks the node slow
// after slowStrikes in a row.
func (s *Server) strike(node uint64, t int64) {
	i := node % uint64(len(s.slow))
	if s.strikes[i].Add(1) >= slowStrikes {
		s.strikes[i].Store(0)
		s.slow[i].Store(t + int64(slowFor))
	}
}

// fast records a quick inline request of node.
func (s *Server) fast(node uint64) {
	i := node % uint64(len(s.slow))
	if s.strikes[i].Load() != 0 {
		s.strikes[i].Store(0)
	}
}

// watchdog hands a queue to another thread when a request has held the
// queue's thread for longer than takeoverAfter (a suspended device, a delay
// target), so that the queue's other requests keep flowing.
func (s *Server) watchdog() {
	t := time.NewTicker(takeoverAfter)
	defer t.Stop()
	idle := 0
	for {
		select {
		case <-s.stopDog:
			return
		case <-t.C:
		}
		n := now()
		busy := false
		for _, q := range s.queues {
			b := q.inline.Load()
			busy = busy || b > 0
			if b > 0 && n-b > int64(takeoverAfter) && q.inline.CompareAndSwap(b, -1) {
				s.strike(q.inlineNode.Load(), n)
				q.promote()
			}
		}
		if busy {
			idle = 0
			continue
		}
		if idle++; idle < watchdogIdleTicks {
			continue
		}
		// Park. A leader stores its inline start before it checks
		// dogParked, and this stores dogParked before it checks the
		// queues again, so one of the two sees the other.
		s.dogParked.Store(true)
		for _, q := range s.queues {
			busy = busy || q.inline.Load() > 0
		}
		if !busy {
			select {
			case <-s.stopDog:
				return
			case <-s.dogWake:
			}
		}
		s.dogParked.Store(false)
		idle = 0
	}
}

// watchdogIdleTicks is how many idle ticks the watchdog waits before parking.
const watchdogIdleTicks = 100

// wakeDog wakes a parked watchdog; the leader calls it after storing the start
// of an inline request.
func (s *Server) wakeDog() {
	if s.dogParked.Load() {
		select {
		case s.dogWake <- struct{}{}:
		default:
		}
	}
}

// queue is one ring and its entries. One thread at a time leads it (reaps
// completions, submits, handles requests inline); others wait as standby.
type queue struct {
	s   *Server
	id  int
	r   *ring
	mem []byte
	ent []entry

	efd      int
	efdBuf   [8]byte
	efdArmed bool
	one      [8]byte

	// Leader-only state.
	pending  []*entry // requests reaped but not handled yet, from pendNext on
	pendNext int
	dead     int

	inline     atomic.Int64  // start of the inline request of the leader; -1: taken over
	inlineNode atomic.Uint64 // its node
	sleeping   atomic.Int32
	done       atomic.Pointer[entry] // entries answered off the leader
	stopping   atomic.Bool

	mu      sync.Mutex
	idle    int
	threads int
	standby chan struct{}
	closed  bool
}

func newQueue(s *Server, id int) (*queue, error) {
	q := &queue{s: s, id: id, efd: -1, standby: make(chan struct{}, 1<<16)}
	q.one[0] = 1
	d := s.cfg.Depth
	r, err := newRing(uint32(2*d + 2))
	if err != nil {
		return nil, fmt.Errorf("io_uring_setup: %w", err)
	}
	q.r = r
	hdrs := (d*512 + 4095) &^ 4095
	q.mem, err = unix.Mmap(-1, 0, hdrs+d*s.cfg.PayloadSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		q.release()
		return nil, err
	}
	q.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		q.release()
		return nil, err
	}
	q.ent = make([]entry, d)
	q.pending = make([]*entry, 0, d)
	for i := range q.ent {
		e := &q.ent[i]
		e.q, e.idx = q, i
		e.hdr = q.mem[i*512 : i*512+headerBufSize]
		p := hdrs + i*s.cfg.PayloadSize
		e.payload = q.mem[p : p+s.cfg.PayloadSize]
		e.iov[0] = iovec{uintptr(unsafe.Pointer(&e.hdr[0])), headerBufSize}
		e.iov[1] = iovec{uintptr(unsafe.Pointer(&e.payload[0])), uint64(len(e.payload))}
	}
	return q, nil
}

func (q *queue) release() {
	if q.r != nil {
		q.r.close()
		q.r = nil
	}
	if q.mem != nil {
		unix.Munmap(q.mem)
		q.mem = nil
	}
	if q.efd >= 0 {
		unix.Close(q.efd)
		q.efd = -1
	}
}

// pin binds the calling thread to CPU cpu.
func pin(cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	unix.SchedSetaffinity(0, &set)
}

// thread is one OS thread of the queue. The goroutine stays locked to its
// thread until it returns, so that the thread, pinned to the queue's CPU,
// ends with it: io_uring cancels a thread's commands when the thread exits,
// and nothing exits while the ring lives.
func (q *queue) thread(leader bool, started chan<- error) {
	runtime.LockOSThread()
	pin(q.id)
	defer q.s.wg.Done()
	if started != nil {
		err := q.register()
		started <- err
		if err != nil {
			q.exit()
			return
		}
	}
	for {
		if !leader {
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
		if q.lead() {
			leader = false
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

// register hands every entry to the kernel and reports whether it took
// them. A refused registration completes at once with an error.
func (q *queue) register() error {
	for i := range q.ent {
		e := &q.ent[i]
		sqe := q.r.getSQE()
		if sqe == nil {
			return errors.New("submission queue refused")
		}
		put8(sqe, sqeOpcode, iouOpURingCmd)
		put32(sqe, sqeFD, uint32(q.s.fd))
		put32(sqe, sqeOff, cmdRegister)
		put64(sqe, sqeAddr, uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
		put32(sqe, sqeLen, 2)
		put64(sqe, sqeUserData, uint64(i))
		put16(sqe, sqeCmd+16, uint16(q.id))
	}
	if _, err := q.r.enter(0, 0); err != nil {
		return fmt.Errorf("io_uring_enter: %w", err)
	}
	if c, ok := q.r.peek(); ok && c.res < 0 {
		return fmt.Errorf("FUSE_IO_URING_CMD_REGISTER: %w", unix.Errno(-c.res))
	}
	return nil
}

// commit queues the reply held by e and re-arms e for the next request.
func (q *queue) commit(e *entry) {
	sqe := q.r.getSQE()
	if sqe == nil {
		q.dead++
		return
	}
	put8(sqe, sqeOpcode, iouOpURingCmd)
	put32(sqe, sqeFD, uint32(q.s.fd))
	put32(sqe, sqeOff, cmdCommitAndFetch)
	put64(sqe, sqeUserData, uint64(e.idx))
	put64(sqe, sqeCmd+8, e.commitID)
	put16(sqe, sqeCmd+16, uint16(q.id))
}

// armWake keeps a read of the queue's eventfd pending, so that a write to
// it wakes the leader from io_uring_enter.
func (q *queue) armWake() {
	if q.efdArmed {
		return
	}
	sqe := q.r.getSQE()
	if sqe == nil {
		return
	}
	put8(sqe, sqeOpcode, iouOpRead)
	put32(sqe, sqeFD, uint32(q.efd))
	put64(sqe, sqeAddr, uint64(uintptr(unsafe.Pointer(&q.efdBuf[0]))))
	put32(sqe, sqeLen, 8)
	put64(sqe, sqeUserData, udWake)
	q.efdArmed = true
}

// wake makes the leader look at its list of finished entries.
func (q *queue) wake() {
	if q.sleeping.CompareAndSwap(1, 0) {
		unix.Write(q.efd, q.one[:])
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
	q.wake()
}

// reap moves completions into pending and returns how many requests arrived.
func (q *queue) reap() int {
	n := 0
	for {
		c, ok := q.r.peek()
		if !ok {
			return n
		}
		q.r.advance()
		switch {
		case c.userData == udWake:
			q.efdArmed = false
		case c.userData < uint64(len(q.ent)):
			e := &q.ent[c.userData]
			if c.res < 0 {
				// ENOTCONN after an unmount, or a cancelled entry.
				if c.res != -int32(unix.ENOTCONN) && c.res != -int32(unix.ENODEV) && c.res != -int32(unix.ECANCELED) {
					q.s.cfg.Logf("io_uring queue %d: entry %d: %v", q.id, e.idx, unix.Errno(-c.res))
				}
				q.dead++
				continue
			}
			q.pending = append(q.pending, e)
			n++
		}
	}
}

// lead runs the queue until it ends (false) or until another thread takes it
// over because a request held this one too long (true).
func (q *queue) lead() bool {
	q.inline.Store(0)
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
			// Pop before handling: if the queue is taken over while
			// e runs, the new leader owns exactly what is left.
			e := q.pending[q.pendNext]
			q.pendNext++
			if q.pendNext == len(q.pending) {
				q.pending, q.pendNext = q.pending[:0], 0
			}
			if q.handle(e) {
				return true
			}
			if q.r.toSubmit >= 16 {
				q.r.enter(0, 0)
			}
			continue
		}
		if q.reap() > 0 {
			continue
		}
		if q.dead >= len(q.ent) || q.stopping.Load() {
			return false
		}
		q.armWake()
		if p := q.s.cfg.Poll; p > 0 {
			if q.r.toSubmit > 0 {
				q.r.enter(0, 0)
			}
			if q.spin(p) {
				continue
			}
		}
		q.sleeping.Store(1)
		if q.done.Load() != nil || q.stopping.Load() {
			q.sleeping.Store(0)
			continue
		}
		if _, err := q.r.enter(1, 0); err != nil {
			q.s.cfg.Logf("io_uring queue %d: io_uring_enter: %v", q.id, err)
			q.sleeping.Store(0)
			return false
		}
		q.sleeping.Store(0)
	}
}

// spin busy-polls the completion queue and the finished list for up to d.
func (q *queue) spin(d time.Duration) bool {
	end := now() + int64(d)
	for i := 0; ; i++ {
		if q.r.ready() > 0 || q.done.Load() != nil || q.stopping.Load() {
			return true
		}
		if i&63 == 63 && now() > end {
			return false
		}
	}
}

// handle answers one request: inline on this thread, or on a goroutine if
// its node was slow lately. It reports whether the queue was taken over
// while the request ran inline.
func (q *queue) handle(e *entry) bool {
	e.prepare()
	t := now()
	if q.s.isSlow(e.nodeID, t) {
		go q.async(e)
		return false
	}
	q.inlineNode.Store(e.nodeID)
	q.inline.Store(t)
	q.s.wakeDog()
	e.dispatch(q.s.fs, q.s.cancel)
	if !q.inline.CompareAndSwap(t, 0) {
		// The watchdog gave the queue to another thread, which now
		// owns the ring: hand the reply to it.
		q.finished(e)
		return true
	}
	if el := now() - t; el > int64(slowAfter) {
		q.s.strike(e.nodeID, t+el)
	} else {
		q.s.fast(e.nodeID)
	}
	q.commit(e)
	return false
}

// async answers a request of a slow node on its own goroutine.
func (q *queue) async(e *entry) {
	e.dispatch(q.s.fs, q.s.cancel)
	q.finished(e)
}
