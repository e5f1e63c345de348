package delay

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// fakeClock is a manual Clock: time moves only by Advance, and Wait blocks
// until then or a Wake.
type fakeClock struct {
	mu       sync.Mutex
	cond     sync.Cond
	now      int64
	inWait   bool
	deadline int64
	woken    bool
	returns  int   // Wait calls that returned
	lead     int64 // what Lead returns
}

func newFakeClock() *fakeClock {
	c := &fakeClock{now: 1_000_000_000}
	c.cond.L = &c.mu
	return c
}

func (c *fakeClock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Wait(deadline int64) {
	c.mu.Lock()
	c.inWait, c.deadline = true, deadline
	c.cond.Broadcast()
	for !c.woken && c.now < deadline {
		c.cond.Wait()
	}
	c.woken, c.inWait = false, false
	c.returns++
	c.cond.Broadcast()
	c.mu.Unlock()
}

func (c *fakeClock) Wake() {
	c.mu.Lock()
	c.woken = true
	c.cond.Broadcast()
	c.mu.Unlock()
}

func (c *fakeClock) Yield() {}

func (c *fakeClock) Lead() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lead
}

// Advance moves time forward by d nanoseconds.
func (c *fakeClock) Advance(d int64) {
	c.mu.Lock()
	c.now += d
	c.cond.Broadcast()
	c.mu.Unlock()
}

// settle blocks until the scheduler waits with nothing to do now: it is in
// Wait, no wake-up is pending and its deadline is in the future. It returns
// that deadline.
func (c *fakeClock) settle() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.inWait || c.woken || c.now >= c.deadline {
		c.cond.Wait()
	}
	return c.deadline
}

const ms = int64(1_000_000)

// rig is a scheduler on a fake clock and some memory devices.
type rig struct {
	t     testing.TB
	clock *fakeClock
	s     *Scheduler
	devs  map[string]*stacktest.MemDevice

	relMu    sync.Mutex
	released []uint64 // seq of released waiters, in release order
}

func newRig(t testing.TB) *rig {
	r := &rig{t: t, clock: newFakeClock(), devs: map[string]*stacktest.MemDevice{}}
	r.s = NewScheduler(r.clock)
	r.s.onRelease = func(w *waiter) {
		r.relMu.Lock()
		r.released = append(r.released, w.seq)
		r.relMu.Unlock()
	}
	for _, n := range []string{"8:16", "8:32", "8:48"} {
		r.devs[n] = stacktest.NewMemDevice(n, 4096*stack.SectorSize)
	}
	return r
}

func (r *rig) ctor(length int64) *stack.Ctor {
	open := stacktest.Opener{}
	for n, d := range r.devs {
		open[n] = d
	}
	return &stack.Ctor{Begin: 0, Len: length, Open: open.Open}
}

// target builds a delay target of 2048 sectors from a parameter string.
func (r *rig) target(params string) *Target {
	r.t.Helper()
	tg, err := New(r.s, r.ctor(2048), stack.SplitArgs(params))
	if err != nil {
		r.t.Fatalf("New(%q): %v", params, err)
	}
	r.t.Cleanup(func() { tg.Close() })
	return tg
}

func (r *rig) releasedSeqs() []uint64 {
	r.relMu.Lock()
	defer r.relMu.Unlock()
	return append([]uint64(nil), r.released...)
}

// waitStatus spins until the target's INFO status is want (requests are
// queued by other goroutines).
func waitStatus(t *testing.T, tg *Target, want string) {
	t.Helper()
	for i := 0; tg.Status(stack.StatusInfo) != want; i++ {
		if i > 10_000_000 {
			t.Fatalf("status %q, want %q", tg.Status(stack.StatusInfo), want)
		}
		runtime.Gosched()
	}
}

// op is an I/O started on its own goroutine.
type op struct {
	issued int64 // fake time at issue
	done   chan error
}

func (r *rig) start(f func(ctx context.Context) error, ctx context.Context) *op {
	o := &op{issued: r.clock.Now(), done: make(chan error, 1)}
	go func() { o.done <- f(ctx) }()
	return o
}

func (r *rig) read(tg *Target, ctx context.Context) *op {
	return r.start(func(ctx context.Context) error {
		_, err := tg.ReadAt(ctx, make([]byte, 512), 0)
		return err
	}, ctx)
}

func (r *rig) write(tg *Target, ctx context.Context) *op {
	return r.start(func(ctx context.Context) error {
		_, err := tg.WriteAt(ctx, make([]byte, 512), 0)
		return err
	}, ctx)
}

// finished reports whether o has completed, without blocking.
func (o *op) finished() bool {
	select {
	case err := <-o.done:
		o.done <- err
		return true
	default:
		return false
	}
}

func (o *op) result(t *testing.T) error {
	t.Helper()
	err := <-o.done
	o.done <- err
	return err
}
