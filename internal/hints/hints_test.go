package hints

import (
	"context"
	"testing"
	"time"
)

// recorder records the hints of a request.
type recorder struct {
	waiting, continuing int
	expecting           []time.Duration
}

func (r *recorder) Waiting()                  { r.waiting++ }
func (r *recorder) Continuing()               { r.continuing++ }
func (r *recorder) Expecting(d time.Duration) { r.expecting = append(r.expecting, d) }

// waitOnly is a Waiter and nothing more.
type waitOnly struct{ n int }

func (w *waitOnly) Waiting() { w.n++ }

type otherKey struct{}

// TestHints: each hint reaches the Waiter of the context, also through a
// derived context, and is dropped without one.
func TestHints(t *testing.T) {
	r := &recorder{}
	ctx := context.WithValue(WithWaiter(context.Background(), r), otherKey{}, 1)
	Waiting(ctx)
	Expecting(ctx, 3*time.Millisecond)
	Continuing(ctx)
	if r.waiting != 1 || r.continuing != 1 || len(r.expecting) != 1 || r.expecting[0] != 3*time.Millisecond {
		t.Errorf("got %d Waiting, %d Continuing, Expecting %v; want 1, 1, [3ms]", r.waiting, r.continuing, r.expecting)
	}
	plain := &waitOnly{}
	pctx := WithWaiter(context.Background(), plain)
	Expecting(pctx, time.Millisecond)
	Continuing(pctx)
	if plain.n != 0 {
		t.Errorf("Expecting or Continuing called Waiting %d times", plain.n)
	}
	Waiting(pctx)
	if plain.n != 1 {
		t.Errorf("%d Waiting calls, want 1", plain.n)
	}
	bg := context.Background() // no Waiter: nothing happens
	Waiting(bg)
	Continuing(bg)
	Expecting(bg, time.Millisecond)
}
