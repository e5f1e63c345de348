package delay

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/hints"
)

// slowHint is a hints.Waiter whose Waiting takes time, as a transport's
// hand-off does: it moves the manual clock on by cost, or, with a gate,
// blocks until the gate closes.
type slowHint struct {
	clock   *clock.Manual
	cost    time.Duration
	entered chan struct{} // closed when Waiting is first called
	gate    chan struct{} // nil: no blocking
	once    sync.Once
}

func (h *slowHint) Waiting() {
	if h.entered != nil {
		h.once.Do(func() { close(h.entered) })
	}
	if h.cost > 0 {
		h.clock.Advance(h.cost)
	}
	if h.gate != nil {
		<-h.gate
	}
}

// TestDelayFromArrival: a request's delay runs from its arrival at the
// target, so that what its hints cost the transport (a hand-off of the
// queue's thread) is part of the delay rather than added to it, with or
// without an early release.
func TestDelayFromArrival(t *testing.T) {
	for _, lead := range []int64{0, 2 * ms} {
		r := newRig(t)
		r.clock.lead.Store(lead)
		tg := r.target("8:16 0 10")
		h := &slowHint{clock: r.clock.Manual, cost: 300 * time.Microsecond}
		rd := r.read(tg, hints.WithWaiter(context.Background(), h))
		waitStatus(t, tg, "1 0 0")
		if d := r.clock.Settle(); d != rd.issued+10*ms-lead {
			t.Fatalf("lead %d: the scheduler waits until %d, want %d (arrival + delay - lead)", lead, d, rd.issued+10*ms-lead)
		}
		r.clock.Set(rd.issued + 10*ms - 1)
		if lead > 0 {
			waitStatus(t, tg, "0 0 0") // released early, spinning
		}
		stillRunning(t, rd, "a read 1 ns before arrival + delay")
		r.clock.Advance(1)
		if err := rd.result(t); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLateArrivalKeepsOrder: a request whose hints take long reaches the
// queue after one that came later; it still leaves at its own deadline,
// before the later one, and that one not before its own.
func TestLateArrivalKeepsOrder(t *testing.T) {
	r := newRig(t)
	tg := r.target("8:16 0 10")
	slow := &slowHint{entered: make(chan struct{}), gate: make(chan struct{})}
	a := r.read(tg, hints.WithWaiter(context.Background(), slow))
	<-slow.entered // a's deadline is stamped
	r.clock.Advance(time.Duration(ms))
	b := r.read(tg, context.Background())
	waitStatus(t, tg, "1 0 0")
	if d := r.clock.Settle(); d != b.issued+10*ms {
		t.Fatalf("the scheduler waits until %d, want b's deadline %d", d, b.issued+10*ms)
	}
	close(slow.gate)
	waitStatus(t, tg, "2 0 0")
	if d := r.clock.Settle(); d != a.issued+10*ms {
		t.Fatalf("with a queued behind b, the scheduler waits until %d, want a's deadline %d", d, a.issued+10*ms)
	}
	r.clock.Set(a.issued + 10*ms)
	if err := a.result(t); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, tg, "1 0 0")
	stillRunning(t, b, "the later read, at the earlier one's deadline")
	r.clock.Set(b.issued + 10*ms)
	if err := b.result(t); err != nil {
		t.Fatal(err)
	}
	// b took the lock first (sequence 1), a second.
	if got := r.releasedSeqs(); !slices.Equal(got, []uint64{2, 1}) {
		t.Errorf("release order %v, want a (2) before b (1)", got)
	}
}

// TestListInsert: insert keeps a class's list in deadline order, equal
// deadlines in the order they were inserted, with head, tail, links and
// count consistent.
func TestListInsert(t *testing.T) {
	var l list
	for i, d := range []int64{10, 20, 15, 5, 20, 30, 25} {
		l.insert(&waiter{deadline: d, seq: uint64(i + 1)})
	}
	var fwd, back []uint64
	for w := l.head; w != nil; w = w.next {
		fwd = append(fwd, w.seq)
	}
	for w := l.tail; w != nil; w = w.prev {
		back = append(back, w.seq)
	}
	want := []uint64{4, 1, 3, 2, 5, 7, 6} // deadlines 5 10 15 20 20 25 30
	if !slices.Equal(fwd, want) || l.n != len(want) {
		t.Fatalf("list %v (n %d), want %v", fwd, l.n, want)
	}
	slices.Reverse(back)
	if !slices.Equal(back, want) {
		t.Fatalf("backwards %v, want %v reversed", back, want)
	}
}
