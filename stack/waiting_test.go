package stack

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// countWaiter counts Waiting calls and signals the first.
type countWaiter struct {
	n     atomic.Int32
	first chan struct{}
}

func (w *countWaiter) Waiting() {
	if w.n.Add(1) == 1 {
		close(w.first)
	}
}

// TestWaitingAtTheGate: a request held by a suspended device tells its
// Waiter before it blocks; one that passes an open gate does not.
func TestWaitingAtTheGate(t *testing.T) {
	d := testDevice(t, "0 8 zero", testDevs(), nil)
	w := &countWaiter{first: make(chan struct{})}
	ctx := WithWaiter(context.Background(), w)
	if _, err := d.ReadAt(ctx, make([]byte, 512), 0); err != nil {
		t.Fatal(err)
	}
	if n := w.n.Load(); n != 0 {
		t.Fatalf("%d Waiting calls through an open gate", n)
	}
	d.Suspend(false)
	done := make(chan error, 1)
	go func() {
		_, err := d.ReadAt(WithFUA(ctx), make([]byte, 512), 0)
		done <- err
	}()
	<-w.first // before the read can complete: the device is suspended
	select {
	case err := <-done:
		t.Fatalf("read completed while suspended: %v", err)
	default:
	}
	if err := d.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	Waiting(context.Background()) // no Waiter: nothing happens
}

// expectWaiter records the Expecting calls of a request.
type expectWaiter struct {
	countWaiter
	got []time.Duration
}

func (w *expectWaiter) Expecting(d time.Duration) { w.got = append(w.got, d) }

// TestExpecting: the hint reaches a Waiter that is an Expecter, and is
// dropped without one.
func TestExpecting(t *testing.T) {
	w := &expectWaiter{}
	ctx := WithWaiter(context.Background(), w)
	Expecting(WithFUA(ctx), 3*time.Millisecond)
	if len(w.got) != 1 || w.got[0] != 3*time.Millisecond {
		t.Errorf("Expecting calls %v, want [3ms]", w.got)
	}
	plain := &countWaiter{first: make(chan struct{})}
	Expecting(WithWaiter(context.Background(), plain), time.Millisecond)
	Expecting(context.Background(), time.Millisecond)
	if plain.n.Load() != 0 {
		t.Error("Expecting called Waiting")
	}
}
