// Package hints carries the scheduling hints a request gives its transport
// through its context: that it is about to wait (Waiting), that it is about to
// go on (Continuing), and when it expects to complete (Expecting). A transport
// that serves several requests on one thread (fs/uring) attaches a Waiter to
// each request's context (WithWaiter); targets and the device gate call the
// hints, through stack's forwarders or directly. It imports nothing from
// dmfuse, so that transports need not import stack.
package hints

import (
	"context"
	"time"
)

// Waiter is told when the request it belongs to is about to wait: a
// transport that serves several requests on one thread (io_uring) hands its
// thread's other requests to another thread at once, instead of letting them
// queue behind one that waits.
type Waiter interface {
	// Waiting is called on the goroutine that runs the request, before it
	// blocks. It may be called more than once for one request, and must be
	// cheap: it runs on the I/O path.
	Waiting()
}

type waiterKey struct{}

// WithWaiter returns ctx carrying w: Waiting(ctx) and Waiting of any context
// derived from it call w.Waiting. Transports build these contexts once per
// request slot, not per request.
func WithWaiter(ctx context.Context, w Waiter) context.Context {
	return context.WithValue(ctx, waiterKey{}, w)
}

// Waiting tells the transport of the request ctx belongs to that the request
// is about to wait for longer than a round trip: the device gate holds it
// (suspended device), delay queues it, multipath queues it without a path,
// a backing block device, or a flush or durable write of a file on disk, is
// about to sleep. Call it just before
// blocking, and only on paths that block: a transport may hand over its
// thread on every call. It does nothing for a context without a Waiter.
func Waiting(ctx context.Context) {
	if w, ok := ctx.Value(waiterKey{}).(Waiter); ok {
		w.Waiting()
	}
}

// Continuer is a Waiter that is also told when its waiting request is about
// to go on: a transport that commits the replies of waiting requests on
// another thread can have that thread awake and ready for the reply.
type Continuer interface {
	// Continuing is called on the goroutine that runs the request, after
	// Waiting, at most ContinueLead before the request completes. It must
	// be cheap.
	Continuing()
}

// ContinueLead is the longest a request may take to complete after it calls
// Continuing: a transport may spin that long for its reply.
const ContinueLead = 200 * time.Microsecond

// Continuing tells the transport of the request ctx belongs to that the
// request, which called Waiting, will complete within ContinueLead (a delay
// target released it ahead of its deadline). It does nothing for a context
// without a Continuer.
func Continuing(ctx context.Context) {
	if r, ok := ctx.Value(waiterKey{}).(Continuer); ok {
		r.Continuing()
	}
}

// Expecter is a Waiter that is also told, when its request starts to wait,
// when the request expects to complete: a transport that commits the
// replies of waiting requests on a thread of its own can have that thread
// wake up by itself shortly before, on its own CPU, instead of being woken
// by another thread when the reply is near (Continuing).
type Expecter interface {
	// Expecting is called on the goroutine that runs the request, just
	// before or after Waiting, with how long from now the request expects
	// to complete. It may be called more than once for one request (the
	// last call counts) and must be cheap.
	Expecting(d time.Duration)
}

// Expecting tells the transport of the request ctx belongs to that the
// request, which waits (call Waiting too), expects to complete d from now: a
// delay target knows its deadline when it queues a request. It is a hint,
// not a promise: a request may complete earlier (presuspend, an interrupt)
// or later. It does nothing for a context without an Expecter.
func Expecting(ctx context.Context, d time.Duration) {
	if r, ok := ctx.Value(waiterKey{}).(Expecter); ok {
		r.Expecting(d)
	}
}
