package fs

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/dmfuse/dmfuse/fs/uring"
	"github.com/dmfuse/dmfuse/stack"
)

// DefaultMemoryLimit is the memory limit of a daemon that is given none: it
// fits a container of 128 MiB beside its workload, and its half for
// requests still lets 117 requests of 256 KiB be in flight at once.
const DefaultMemoryLimit = 64 << 20

// Request sizes and queue depths the plan chooses from.
const (
	// maxRequest is the largest READ or WRITE the kernel sends (its
	// max_pages_limit is 256 pages).
	maxRequest = 1 << 20
	// goodRequest is the request size the plan aims for first: 1 MiB
	// I/O split into 256 KiB requests moved as fast as with 1 MiB
	// requests, into 128 KiB requests about 12% slower (docs/benchmarks.md,
	// Memory).
	goodRequest = 256 << 10
	// minRequest is the smallest request size the plan goes down to.
	minRequest = 64 << 10
	// maxBackground is the kernel's in-flight asynchronous request cap
	// when memory allows; enough to emulate deep queues on delay devices.
	maxBackground = 256
	// minBackground is the depth the plan keeps before it takes smaller
	// requests: two jobs at queue depth 32 run without waiting.
	minBackground = 64
	// requestSlack is what a request holds beyond its payload, rounded
	// up: go-fuse's input buffer is the payload plus the largest request
	// header and 4 KiB of alignment slack, allocated in whole 8 KiB pages
	// (at most MaxWrite + 8 KiB), plus its request struct and reply
	// header (under 8 KiB).
	requestSlack = 16 << 10
)

// MemoryPlan is what a memory limit turns into: the largest request the
// kernel may send, how many may be in flight, and so the most memory the
// daemon holds for request buffers.
//
// Every request in the daemon holds one buffer of at most MaxWrite +
// requestSlack bytes (a WRITE its payload, in go-fuse's input buffer; a READ
// its reply), from the moment go-fuse reads it until it has answered it, plus
// the readers that wait in read(2) on /dev/fuse with an empty one. The kernel
// lets at most MaxBackground asynchronous requests (direct I/O with
// CAP_ASYNC_DIO: libaio, io_uring, loop devices) be in flight, and holds the
// rest back (the submitter waits, nothing fails); go-fuse stops reading
// /dev/fuse while MaxInflightRequestBytes are checked out, which holds
// synchronous writers to the same budget. So on the /dev/fuse transport
//
//	request memory <= (MaxBackground + readers) x (MaxWrite + 16 KiB) = Bound
//
// whatever the load, burst after burst. (Synchronous reads are the exception:
// one per caller thread blocked in read(2), each as large as the caller's own
// buffer.) The io_uring transport answers from its registered entries,
// URingQueues x URingDepth buffers of MaxWrite bytes, mapped when first used;
// its Bound is the larger of the two, because go-fuse still serves /dev/fuse
// alongside.
//
// Bound is what requests in flight hold. go-fuse pools the buffers after use
// (input buffers in one sync.Pool, reply buffers in one per size), where they
// stay until the second collection after their last use: a burst of reads
// after a burst of writes briefly holds both, up to about twice Bound. The
// other half of the limit leaves room for that and for the collector's
// headroom; the memory limit the caller sets makes collections frequent
// under load, and the server's idle release empties the pools.
type MemoryPlan struct {
	// Limit is the memory limit the plan was made for (0: none).
	Limit int64
	// Budget is the part of Limit request buffers may use (0: no limit).
	Budget int64
	// MaxWrite is the largest READ or WRITE the kernel sends; larger I/O
	// is split into requests of this size.
	MaxWrite int
	// MaxBackground caps the kernel's in-flight asynchronous requests.
	MaxBackground int
	// Readers is the most go-fuse readers waiting in read(2) at once.
	Readers int
	// InflightBytes is go-fuse's MaxInflightRequestBytes (0: unlimited).
	InflightBytes int
	// URingQueues and URingDepth size the io_uring transport: one queue
	// per possible CPU, URingDepth entries of MaxWrite bytes each.
	URingQueues, URingDepth int
	// Bound is the most memory request buffers may hold, in bytes.
	Bound int64
}

// goFuseReaders is how many goroutines go-fuse v2.12.1 lets wait in
// read(2) on /dev/fuse at once: GOMAXPROCS clamped to [2, 16], plus the one
// that may be starting while the last is busy.
func goFuseReaders() int {
	return min(max(runtime.GOMAXPROCS(0), 2), 16) + 1
}

// PlanMemory works out the request sizes and depths of a mount from o's
// MemoryLimit (0: DefaultMemoryLimit, negative: none): half of the limit is
// the budget for request buffers; the other half is left to the daemon's
// own data and to the garbage collector's headroom. The plan takes 256 KiB
// requests with as many in flight as fit, up to 256; with less room than
// 64 of them, smaller requests (down to 64 KiB); with room to spare at 256
// in flight, larger ones (up to 1 MiB). An explicit Options.MaxBackground
// is kept, with the largest requests that fit it; an explicit URingDepth
// is kept.
func PlanMemory(o Options) MemoryPlan {
	p := MemoryPlan{Limit: o.MemoryLimit, Readers: goFuseReaders(), URingQueues: uring.Queues()}
	if p.Limit == 0 {
		p.Limit = DefaultMemoryLimit
	}
	p.URingDepth = o.URingDepth
	if p.Limit < 0 {
		// No limit: the largest requests and the full depth.
		p.Limit = 0
		p.MaxWrite, p.MaxBackground = maxRequest, maxBackground
		if o.MaxBackground > 0 {
			p.MaxBackground = o.MaxBackground
		}
		if p.URingDepth <= 0 {
			p.URingDepth = uring.DefaultDepth
		}
		p.Bound = p.bound()
		return p
	}
	p.Budget = p.Limit / 2
	// slots is how many requests of size fit the budget beside the readers.
	slots := func(size int) int { return int(p.Budget/int64(size+requestSlack)) - p.Readers }
	if o.MaxBackground > 0 {
		p.MaxWrite, p.MaxBackground = minRequest, o.MaxBackground
		for size := maxRequest; size > minRequest; size /= 2 {
			if slots(size) >= o.MaxBackground {
				p.MaxWrite = size
				break
			}
		}
	} else {
		p.MaxWrite = minRequest
		for size := goodRequest; size >= minRequest; size /= 2 {
			if slots(size) >= minBackground {
				p.MaxWrite = size
				break
			}
		}
		for p.MaxWrite < maxRequest && slots(2*p.MaxWrite) >= maxBackground {
			p.MaxWrite *= 2
		}
		p.MaxBackground = min(max(slots(p.MaxWrite), 16), maxBackground)
	}
	p.InflightBytes = (p.MaxBackground + p.Readers) * (p.MaxWrite + requestSlack)
	if p.URingDepth <= 0 {
		ring := p.Budget - int64(p.Readers*(p.MaxWrite+requestSlack))
		per := ring / int64(p.URingQueues*p.MaxWrite)
		p.URingDepth = int(min(max(per, 2), uring.DefaultDepth))
	}
	p.Bound = p.bound()
	return p
}

// bound is the larger of the two transports' request memory (see
// MemoryPlan).
func (p MemoryPlan) bound() int64 {
	dev := int64(p.MaxBackground+p.Readers) * int64(p.MaxWrite+requestSlack)
	ring := int64(p.URingQueues*p.URingDepth)*int64(p.MaxWrite) + int64(p.Readers)*int64(p.MaxWrite+requestSlack)
	return max(dev, ring)
}

// Memory returns the plan the server was mounted with.
func (s *Server) Memory() MemoryPlan { return s.plan }

// Releases counts the times the server gave memory back to the operating
// system after a burst of I/O (see Options.ReleaseAfter).
func (s *Server) Releases() uint64 { return s.releases.Load() }

// URingStats returns the io_uring transport's hand-off counts (zero on
// /dev/fuse).
func (s *Server) URingStats() uring.Stats {
	if s.ring == nil {
		return uring.Stats{}
	}
	return s.ring.Stats()
}

// releaser gives request buffers back once the devices have been idle for
// after: the buffers go-fuse keeps in its sync.Pools survive until the
// second collection after their last use, and the Go runtime returns freed
// pages only gradually, so a daemon that was busy would otherwise keep its
// peak for minutes. Two collections empty the pools (FreeOSMemory's is the
// second) and return the pages. It runs once per idle period, not again
// until I/O resumes.
//
// It looks at the devices every tick while there is something to give back
// and parks otherwise (before the first request, and after a release), so
// that an idle daemon has no timer to wake for: the next request wakes it
// (seen).
type releaser struct {
	after time.Duration
	// activity returns a count that changes whenever a request is served,
	// and whether any is in flight.
	activity func() (count uint64, inFlight bool)
	// release gives the memory back.
	release func()

	last  uint64        // activity count at the previous tick
	quiet time.Duration // how long it has not changed
	done  bool          // released since the last I/O (or no I/O yet)

	// seen, parked and kick wake a parked releaser: seen is set by the
	// first request after the releaser last cleared it, parked while the
	// releaser waits for kick (a request that finds it parked sends one).
	seen   atomic.Bool
	parked atomic.Bool
	kick   chan struct{}
}

// newReleaser watches the devices of m.
func newReleaser(m *stack.Manager, after time.Duration, released *atomic.Uint64) *releaser {
	r := &releaser{
		after:    after,
		activity: func() (uint64, bool) { return deviceActivity(m) },
		release: func() {
			runtime.GC()
			debug.FreeOSMemory() // collects again, then returns the pages
			released.Add(1)
		},
		done: true, // nothing to give back before the first I/O
		kick: make(chan struct{}, 1),
	}
	r.last, _ = r.activity()
	return r
}

// deviceActivity sums the completed I/Os of every device of m, and tells
// whether any device has I/O in flight.
func deviceActivity(m *stack.Manager) (total uint64, inFlight bool) {
	for _, d := range m.Devices() {
		s := d.Disk().Snapshot()
		for _, n := range s.IOs {
			total += n
		}
		inFlight = inFlight || s.InFlightTotal > 0
	}
	return total, inFlight
}

// tick is how often run looks at the devices.
func (r *releaser) tick() time.Duration { return min(r.after/4, time.Second) }

// observe takes one tick's activity and reports whether to release now.
func (r *releaser) observe(count uint64, inFlight bool) bool {
	if count != r.last || inFlight {
		r.last, r.quiet, r.done = count, 0, false
		return false
	}
	if r.quiet += r.tick(); r.quiet < r.after || r.done {
		return false
	}
	r.done = true
	return true
}

// request is called for every request the devices get: it wakes a parked
// releaser. Once a request has been seen, the next ones only load a flag.
func (r *releaser) request() {
	if r.seen.Load() {
		return
	}
	r.seen.Store(true)
	if r.parked.CompareAndSwap(true, false) {
		r.kick <- struct{}{}
	}
}

// park waits, once there is nothing to give back, until a request comes
// (true) or ctx ends (false). A request seen since the last park makes it
// return at once: the devices' counts show it at the next tick.
func (r *releaser) park(ctx context.Context) bool {
	r.parked.Store(true)
	// A request stores seen before it loads parked, and this stores
	// parked before it loads seen: one of the two sees the other.
	if r.seen.Swap(false) {
		if !r.parked.CompareAndSwap(true, false) {
			<-r.kick // a request unparked it and sends a kick
		}
		return true
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.kick:
		return true
	}
}

// run looks at the devices at every tick until ctx ends, parked while
// there is nothing to give back.
func (r *releaser) run(ctx context.Context) {
	t := time.NewTimer(r.tick())
	defer t.Stop()
	for {
		if r.done {
			t.Stop()
			if !r.park(ctx) {
				return
			}
			t.Reset(r.tick())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(r.tick())
		if r.observe(r.activity()) {
			r.release()
		}
	}
}
