package stack

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/dmfuse/dmfuse/internal/hints"
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
	ctx := hints.WithWaiter(context.Background(), w)
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
