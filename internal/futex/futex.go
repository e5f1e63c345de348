// Package futex parks an OS thread on a word until another thread sets it,
// with one futex(2) wake-up and no Go scheduler in between: a goroutine
// parked on a channel and readied by another thread lands in the run queue
// of that thread's P, and when that thread then blocks in a system call the
// goroutine waits for another M, or for the runtime's sysmon, to pick it up
// (a chain of thread wake-ups). A thread parked here holds its P while it
// sleeps, until sysmon takes the P back, so a process that parks threads
// wants spare Ps (GOMAXPROCS).
package futex

import "sync/atomic"

// Event is a word that one thread waits on (Wait) until another sets it to
// a non-zero value (Set). The zero value is unset and ready to use.
type Event struct {
	v atomic.Uint32
}

// Reset unsets e, for its next Wait. Call it before the thread that sets
// e can see e.
func (e *Event) Reset() { e.v.Store(0) }

// Load returns e's value: 0 while unset.
func (e *Event) Load() uint32 { return e.v.Load() }

// Wait blocks the calling goroutine, and its OS thread, until e is set,
// and returns its value; it returns at once if e is set already.
func (e *Event) Wait() uint32 {
	for {
		if v := e.v.Load(); v != 0 {
			return v
		}
		wait(&e.v, 0)
	}
}

// Set sets e to v (non-zero) and wakes the thread waiting on it. The word is
// set before the wake-up, so a Wait that has not reached futex(2) yet
// returns without sleeping; a wake-up that lands on an Event reused
// meanwhile only makes its waiter check the word again.
func (e *Event) Set(v uint32) {
	e.v.Store(v)
	wake(&e.v)
}
