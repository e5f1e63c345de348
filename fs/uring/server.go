package uring

import (
	"context"
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

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/hints"
)

// Defaults.
const (
	// DefaultDepth is the number of entries per queue. The kernel puts
	// a request on the queue of the CPU that issued it, so one queue may
	// hold all of an application's requests: with 32 entries, half of a
	// 2x32 stream on a 10 ms delay device waited in the kernel for an
	// entry (78% of 64/delay against 95% with 64), and 64 cost nothing
	// at 2x32 on a fast device (1.02x).
	DefaultDepth = 64
	// DefaultPollWindow is the longest a queue polls for its next request
	// in adaptive polling (Config.Poll 0).
	DefaultPollWindow = 50 * time.Microsecond
	// DefaultSubmitBatch is Config.SubmitBatch's default: the replies a
	// queue holds before it submits them, unless it runs dry first (2x32
	// was 5-19% faster than with 16, and a third faster than one by one).
	DefaultSubmitBatch = 32
	// DefaultOffloadBytes is the smallest READ or WRITE that runs off
	// the queue's thread (Config.OffloadBytes).
	DefaultOffloadBytes = 64 << 10
	// DefaultExpectMargin is Config.ExpectMargin's default.
	DefaultExpectMargin = 200 * time.Microsecond
	// DefaultTakeoverAfter is Config.TakeoverAfter's default.
	DefaultTakeoverAfter = time.Millisecond
)

// PollOff as Config.Poll: a queue never spins, it sleeps in io_uring_enter
// as soon as it has nothing to do.
const PollOff = time.Duration(-1)

// Config describes the rings of a Server.
type Config struct {
	// Depth is the number of entries per queue (DefaultDepth if 0). Each
	// entry has a payload buffer of PayloadSize bytes.
	Depth int
	// PayloadSize is the size of each entry's payload buffer. The kernel
	// wants at least max(8192, max_write, max_pages x page size).
	PayloadSize int
	// Poll is how a queue's thread waits for its next request. 0 polls
	// adaptively: up to DefaultPollWindow when the queue runs dry, while
	// the daemon's recent requests, on any queue, came in quick succession
	// and the CPU is not contended (see pollPolicy), so that sparse I/O
	// and an idle daemon burn no CPU. A positive value polls up to that
	// long every time the CPU is not contended, PollOff never polls.
	Poll time.Duration
	// Clock is the time source of the watchdog and of polling (nil: the
	// monotonic clock).
	Clock clock.Clock
	// IOContext and FUAContext are the contexts Server.Context derives a
	// request's context from: IOContext for every request, FUAContext for
	// WRITEs with O_DSYNC (nil: context.Background()).
	IOContext, FUAContext context.Context
	// Interruptible makes the contexts Server.Context returns end when
	// the kernel interrupts their request (Interrupt): a request that waits
	// in the stack then ends with the context's error. Without it they
	// never end, and an interrupt only closes the request's cancel channel.
	// IOContext and FUAContext must then be contexts that never end.
	Interruptible bool
	// SetupFlags are io_uring setup flags (IORING_SETUP_*) added to the
	// rings' for experiments. IORING_SETUP_SINGLE_ISSUER (and so
	// DEFER_TASKRUN, which needs it) cannot work: a queue changes threads
	// when a request waits, and every leader submits.
	SetupFlags uint32
	// Pin is where a queue's leader thread runs: PinQueueCPU (the
	// default) binds it to the CPU whose requests the queue receives,
	// PinNone leaves it to the scheduler, PinOtherCPU binds it to the
	// next CPU.
	Pin int
	// OffloadBytes: a READ or WRITE of at least this many bytes runs on
	// an offload worker instead of the leader's thread, so that the
	// leader serves the requests behind it meanwhile and another CPU
	// copies the data (DefaultOffloadBytes if 0; negative: never).
	OffloadBytes int
	// SubmitBatch is how many replies a leader queues before it submits
	// them while requests are still waiting (DefaultSubmitBatch if 0);
	// it submits what it has whenever it runs dry.
	SubmitBatch int
	// ExpectMargin: when a queue's only request says when it will
	// complete (hints.Expecting), the queue's thread sleeps until this long
	// before that time, then spins for the reply, so that it is awake to
	// commit it at once and the application's CPU is awake to take it
	// (DefaultExpectMargin if 0; negative: it sleeps until woken).
	ExpectMargin time.Duration
	// TakeoverAfter is how long a request may hold a queue's thread,
	// without saying it waits, before the watchdog hands the queue to
	// another thread (DefaultTakeoverAfter if 0 or negative).
	TakeoverAfter time.Duration
	// Logf reports problems; nil discards them.
	Logf func(format string, args ...any)
}

// Where a queue's leader runs (Config.Pin).
const (
	PinQueueCPU = iota
	PinNone
	PinOtherCPU
)

// Server serves one FUSE connection's requests through io_uring queues, one
// per possible CPU. Create it before the connection's FUSE_INIT (so that a
// failure to create rings can still fall back to /dev/fuse), then Start it
// once the INIT reply has been written.
type Server struct {
	cfg    Config
	clock  clock.Clock
	queues []*queue
	fd     int // our own duplicate of the /dev/fuse descriptor
	fs     fuse.RawFileSystem
	direct Direct // fs's, if it has the capability

	expectMargin int64 // Config.ExpectMargin, ns; negative: off
	poll         pollPolicy

	// byCancel maps each entry's cancel channel to the entry, for Context;
	// replaced as a whole (under mu) when an interrupt renews a channel.
	byCancel atomic.Pointer[map[<-chan struct{}]*entry]
	mu       sync.Mutex

	cpus unix.CPUSet // the CPUs the process may run on, for threads that lead no queue

	// early holds interrupts for requests that no thread had started when
	// the interrupt came (the kernel posts a request to the ring before it
	// can send an interrupt for it, but a queue may not have reaped it
	// yet): dispatch claims them. nEarly is their number, so that dispatch
	// looks only when there are some.
	early  [earlyInterrupts]earlyInterrupt
	nEarly atomic.Int32
	// interrupts counts the interrupts that reached a request.
	interrupts atomic.Uint64

	wg       sync.WaitGroup // queue threads and offloaded requests
	offloads *offloader
	dog      *watchdog
	done     chan struct{}
}

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
		return nil, fmt.Errorf("io_uring depth %d is too large (at most 4096)", cfg.Depth)
	}
	cfg.PayloadSize = max((cfg.PayloadSize+4095)&^4095, 4096)
	n := Queues()
	rings := make([]ring, 0, n)
	mems := make([][]byte, 0, n)
	fail := func(err error) (*Server, error) {
		for i, r := range rings {
			r.close()
			unix.Munmap(mems[i])
		}
		return nil, err
	}
	for i := range n {
		r, err := newSysRing(i, uint32(2*cfg.Depth+2), cfg.SetupFlags)
		if err != nil {
			return fail(err)
		}
		mem, err := unix.Mmap(-1, 0, bufSize(cfg), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			r.close()
			return fail(fmt.Errorf("queue %d: mapping %d bytes of buffers: %w", i, bufSize(cfg), err))
		}
		rings, mems = append(rings, r), append(mems, mem)
	}
	s := newServer(cfg, rings, mems)
	for _, q := range s.queues {
		q.unmap = true
	}
	return s, nil
}

// bufSize is the size of one queue's buffers: a 512-byte slot per header
// buffer, then the payload buffers.
func bufSize(cfg Config) int {
	return (cfg.Depth*512+4095)&^4095 + cfg.Depth*cfg.PayloadSize
}

// newServer builds a Server over the given rings, one queue each, whose
// entries' buffers lie in mems (bufSize(cfg) bytes each).
func newServer(cfg Config, rings []ring, mems [][]byte) *Server {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.SubmitBatch <= 0 {
		cfg.SubmitBatch = DefaultSubmitBatch
	}
	if cfg.OffloadBytes == 0 {
		cfg.OffloadBytes = DefaultOffloadBytes
	}
	if cfg.IOContext == nil {
		cfg.IOContext = context.Background()
	}
	if cfg.FUAContext == nil {
		cfg.FUAContext = cfg.IOContext
	}
	if cfg.ExpectMargin == 0 {
		cfg.ExpectMargin = DefaultExpectMargin
	}
	if cfg.TakeoverAfter <= 0 {
		cfg.TakeoverAfter = DefaultTakeoverAfter
	}
	s := &Server{cfg: cfg, clock: cfg.Clock, fd: -1, done: make(chan struct{}), expectMargin: int64(cfg.ExpectMargin), offloads: newOffloader()}
	if unix.SchedGetaffinity(0, &s.cpus) != nil {
		for i := range runtime.NumCPU() {
			s.cpus.Set(i)
		}
	}
	if s.clock == nil {
		s.clock = clock.System
	}
	s.dog = newWatchdog(s, int64(cfg.TakeoverAfter))
	s.poll.init(cfg.Poll)
	m := make(map[<-chan struct{}]*entry, len(rings)*cfg.Depth)
	for i, r := range rings {
		q := newQueue(s, i, r, mems[i])
		for j := range q.ent {
			m[q.ent[j].cancel] = &q.ent[j]
		}
		s.queues = append(s.queues, q)
	}
	s.byCancel.Store(&m)
	return s
}

// others returns how many requests the queues other than q have received.
func (s *Server) others(q *queue) uint64 {
	var n uint64
	for _, o := range s.queues {
		if o != q {
			n += o.requests.Load()
		}
	}
	return n
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

// procsPerQueue is how many Ps the transport wants per queue on top of one
// per CPU (Procs).
const procsPerQueue = 3

// Procs returns how many Ps the server wants on top of one per CPU, for the
// daemon to raise GOMAXPROCS by. Threads that wait in a system call hold their
// P until the runtime's sysmon takes it back: each queue's leader in
// io_uring_enter, and the requests that wait on threads of their own (a
// delayed one parked in futex), as many as a queue hands over. Three per
// queue, by measurement: the multipath suite of test/bench with one fast and
// three delayed paths (docs/benchmarks.md).
func (s *Server) Procs() int { return procsPerQueue * len(s.queues) }

// Start registers every entry of every queue on the connection of the
// /dev/fuse descriptor fd (which must have answered FUSE_INIT with
// FUSE_OVER_IO_URING) and starts serving requests with fs. On error nothing
// is left running; the kernel then serves the connection through /dev/fuse.
func (s *Server) Start(fd int, fs fuse.RawFileSystem) error {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		s.release()
		close(s.done)
		return err
	}
	s.fd = nfd
	for _, q := range s.queues {
		if r, ok := q.r.(*sysRing); ok {
			r.dev = nfd
		}
	}
	return s.start(fs)
}

// start starts one leader thread per queue, which registers the queue's
// entries, and the watchdog.
func (s *Server) start(fs fuse.RawFileSystem) error {
	s.fs = fs
	s.direct, _ = fs.(Direct)
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
		s.offloads.close()
		s.release()
		close(s.done)
		return first
	}
	go s.dog.run()
	go func() {
		s.wg.Wait()
		s.offloads.close()
		s.dog.close()
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

// Stats counts a Server's hand-offs (a queue going to another thread) and
// describes its polling.
type Stats struct {
	// Waiting counts hand-offs because a request said it waits
	// (hints.Waiting); Watchdog those because a request held a queue's
	// thread for longer than the watchdog allows.
	Waiting, Watchdog uint64
	// Threads is the number of threads the queues have (leaders and
	// standby); each waiting request holds one.
	Threads int
	// Requests counts the requests each queue received; Offloaded those
	// run off the leader because of their size (Config.OffloadBytes).
	Requests  []uint64
	Offloaded uint64
	// Direct counts the READs and WRITEs done on a backing file through
	// the rings (Direct).
	Direct uint64
	// Interrupts counts FUSE_INTERRUPTs that reached a ring request
	// (Interrupt closed its cancel channel).
	Interrupts uint64
	// Polls counts the spins of queues that ran dry because the polling
	// policy expected a request soon (or the window is fixed), Probes
	// those that tested whether requests come densely again; PollHits
	// those of either kind that found a request on their queue, and
	// PollContended those cut short because another thread wanted the
	// CPU (see pollPolicy). PollTime is the time the queues spent
	// spinning, for requests and for replies of waiting requests.
	Polls, Probes, PollHits, PollContended uint64
	PollTime                               time.Duration
	// Polling says whether a queue that runs dry now would poll.
	Polling bool
}

// Stats returns the hand-off counts so far.
func (s *Server) Stats() Stats {
	st := Stats{Interrupts: s.interrupts.Load(), Polling: s.poll.predicts(s.clock.Nanotime())}
	for _, q := range s.queues {
		st.Waiting += q.hinted.Load()
		st.Watchdog += q.takenOver.Load()
		st.Offloaded += q.offloaded.Load()
		st.Direct += q.directTotal.Load()
		st.Requests = append(st.Requests, q.requests.Load())
		st.Polls += q.poll.polls.Load()
		st.Probes += q.poll.probes.Load()
		st.PollHits += q.poll.hits.Load()
		st.PollContended += q.poll.contended.Load()
		st.PollTime += time.Duration(q.poll.spun.Load())
		q.mu.Lock()
		st.Threads += q.threads
		q.mu.Unlock()
	}
	return st
}

// Context returns the context for the device I/O of the ring request whose
// cancel channel (the one the transport handed to the RawFileSystem) is
// cancel: Config.IOContext, or FUAContext for a WRITE with O_DSYNC, carrying
// the request's hints.Waiter. It returns nil for a channel of no ring
// request (one from go-fuse's /dev/fuse loop).
func (s *Server) Context(cancel <-chan struct{}) context.Context {
	e := (*s.byCancel.Load())[cancel]
	if e == nil {
		return nil
	}
	if e.fua {
		return e.fuaCtx
	}
	return e.ioCtx
}

// Interrupt closes the cancel channel of the ring request with the given
// unique id, as go-fuse does for a FUSE_INTERRUPT on /dev/fuse, and reports
// whether such a request was running.
func (s *Server) Interrupt(unique uint64) bool {
	for _, q := range s.queues {
		for i := range q.ent {
			if q.ent[i].interrupt(unique) {
				s.interrupts.Add(1)
				return true
			}
		}
	}
	return false
}

// earlyInterrupts bounds the interrupts kept for requests not started yet;
// earlyTTL is how long one is kept (one whose request had already ended is
// never claimed).
const (
	earlyInterrupts = 16
	earlyTTL        = int64(time.Second)
)

// earlyInterrupt is an interrupt that found no running request.
type earlyInterrupt struct {
	unique uint64
	at     int64 // clock time it came, 0 for a free slot
}

// interruptSoon is Interrupt for an interrupt that may come before a queue
// has started its request: the kernel cannot send it again (it looks for
// the request on /dev/fuse, where ring requests are not), so an interrupt
// that finds no request is kept for a while and dispatch claims it.
func (s *Server) interruptSoon(unique uint64) {
	if unique == 0 || s.Interrupt(unique) {
		return
	}
	s.mu.Lock()
	now := s.clock.Nanotime()
	slot := 0
	for i := range s.early {
		if s.early[i].at < s.early[slot].at {
			slot = i
		}
	}
	if s.early[slot].at == 0 {
		s.nEarly.Add(1)
	}
	s.early[slot] = earlyInterrupt{unique, now}
	s.expireEarly(now)
	s.mu.Unlock()
	// A request dispatched between the search above and nEarly's increase
	// did not look at early: search once more.
	if s.Interrupt(unique) {
		s.mu.Lock()
		s.dropEarly(unique)
		s.mu.Unlock()
	}
}

// claimEarly interrupts e's request, which has just started with the given
// unique id, if an interrupt for it came before.
func (s *Server) claimEarly(e *entry, unique uint64) {
	s.mu.Lock()
	found := s.dropEarly(unique)
	s.expireEarly(s.clock.Nanotime())
	s.mu.Unlock()
	if found && e.interrupt(unique) {
		s.interrupts.Add(1)
	}
}

// dropEarly forgets the early interrupt for unique, under s.mu, and reports
// whether there was one.
func (s *Server) dropEarly(unique uint64) bool {
	for i := range s.early {
		if s.early[i].at != 0 && s.early[i].unique == unique {
			s.early[i] = earlyInterrupt{}
			s.nEarly.Add(-1)
			return true
		}
	}
	return false
}

// expireEarly forgets early interrupts older than earlyTTL, under s.mu.
func (s *Server) expireEarly(now int64) {
	for i := range s.early {
		if at := s.early[i].at; at != 0 && now-at > earlyTTL {
			s.early[i] = earlyInterrupt{}
			s.nEarly.Add(-1)
		}
	}
}

// renew gives e a new cancel channel after an interrupt closed the old one.
func (s *Server) renew(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.byCancel.Load()
	m := make(map[<-chan struct{}]*entry, len(old))
	for k, v := range old {
		if v != e {
			m[k] = v
		}
	}
	e.cancel = make(chan struct{})
	m[e.cancel] = e
	s.byCancel.Store(&m)
}

// interruptible is a request's context under Config.Interruptible: its
// parent's values, done when the request's cancel channel closes. The
// parent (Config.IOContext or FUAContext) is one that never ends.
type interruptible struct {
	context.Context
	e *entry
}

func (c *interruptible) Done() <-chan struct{} { return c.e.cancel }

func (c *interruptible) Err() error {
	select {
	case <-c.e.cancel:
		return context.Canceled
	default:
		return nil
	}
}

// newEntries lays out depth entries over mem (bufSize bytes) and gives each
// its cancel channel and contexts.
func (s *Server) newEntries(q *queue, mem []byte) []entry {
	d := s.cfg.Depth
	hdrs := (d*512 + 4095) &^ 4095
	ents := make([]entry, d)
	for i := range ents {
		e := &ents[i]
		e.q, e.idx = q, i
		e.hdr = mem[i*512 : i*512+headerBufSize]
		p := hdrs + i*s.cfg.PayloadSize
		e.payload = mem[p : p+s.cfg.PayloadSize]
		e.iov[0] = iovec{uintptr(unsafe.Pointer(&e.hdr[0])), headerBufSize}
		e.iov[1] = iovec{uintptr(unsafe.Pointer(&e.payload[0])), uint64(len(e.payload))}
		e.cancel = make(chan struct{})
		io, fua := s.cfg.IOContext, s.cfg.FUAContext
		if s.cfg.Interruptible {
			io, fua = &interruptible{io, e}, &interruptible{fua, e}
		}
		e.ioCtx = hints.WithWaiter(io, e)
		e.fuaCtx = hints.WithWaiter(fua, e)
	}
	return ents
}
