package delay

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// manualClock is a clock.Manual with the Lead and Yield of a Clock: time
// moves only by Advance, and Wait blocks until then or a Wake.
type manualClock struct {
	*clock.Manual
	lead atomic.Int64 // what Lead returns
}

func newManualClock() *manualClock {
	c := &manualClock{Manual: &clock.Manual{}}
	c.Set(1_000_000_000)
	return c
}

// Lead implements Clock.
func (c *manualClock) Lead() int64 { return c.lead.Load() }

// Yield implements Clock.
func (c *manualClock) Yield() {}

const ms = int64(1_000_000)

// rig is a scheduler on a fake clock and some memory devices.
type rig struct {
	t     testing.TB
	clock *manualClock
	s     *Scheduler
	devs  map[string]*stacktest.MemDevice

	relMu    sync.Mutex
	released []uint64 // seq of released waiters, in release order
}

func newRig(t testing.TB) *rig {
	r := &rig{t: t, clock: newManualClock(), devs: map[string]*stacktest.MemDevice{}}
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
	o := &op{issued: r.clock.Nanotime(), done: make(chan error, 1)}
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
