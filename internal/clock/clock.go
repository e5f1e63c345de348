// Package clock is the time source of dmfuse: monotonic nanoseconds, read
// through the Clock interface by everything whose behaviour depends on time
// (the path selectors, the fault targets, the statistics, the delay scheduler,
// the io_uring transport), so that tests can drive it by hand with a Manual
// clock. It imports nothing from dmfuse.
package clock

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Clock returns monotonic nanoseconds.
type Clock interface{ Nanotime() int64 }

// System is the monotonic clock of the process (Now).
var System Clock = system{}

type system struct{}

// Nanotime returns Now().
func (system) Nanotime() int64 { return Now() }

var (
	start = time.Now()
	base  = monotonicBase()
)

// Now returns the monotonic time in nanoseconds. It reads Go's monotonic
// clock (vDSO, no system call, no allocation), shifted on Linux to the origin
// of CLOCK_MONOTONIC, the kernel's ktime_get_ns(), so that times such as
// historical-service-time's stale_after read like the kernel's. It is always
// well above 0: HST takes a stale_after of 0 as stale, which needs now > 0.
func Now() int64 { return base + int64(time.Since(start)) }

// fallbackBase keeps Now well away from 0 where CLOCK_MONOTONIC cannot be
// read.
const fallbackBase = 1 << 32

// Forever is the deadline of a wait that only a wake-up ends.
const Forever int64 = math.MaxInt64

// Manual is a Clock that only moves when told to, for tests and simulations.
// One goroutine at a time may also wait on it for a deadline (Wait), as the
// delay scheduler waits on its clock; Wake ends the wait early. The zero
// value reads 0 and is ready to use.
type Manual struct {
	ns atomic.Int64

	mu       sync.Mutex
	cond     sync.Cond
	waiting  bool  // a goroutine is in Wait
	deadline int64 // its deadline
	woken    bool  // a Wake that no Wait has consumed yet
	waits    int   // Wait calls that returned
}

// Nanotime returns the current manual time.
func (c *Manual) Nanotime() int64 { return c.ns.Load() }

// Set sets the manual time to ns and ends a Wait whose deadline it reaches.
func (c *Manual) Set(ns int64) {
	c.ns.Store(ns)
	c.broadcast()
}

// Advance moves the manual time forward by d, ends a Wait whose deadline it
// reaches, and returns the new time.
func (c *Manual) Advance(d time.Duration) int64 {
	ns := c.ns.Add(int64(d))
	c.broadcast()
	return ns
}

// broadcast wakes the goroutines blocked in Wait or Settle.
func (c *Manual) broadcast() {
	c.mu.Lock()
	c.init()
	c.cond.Broadcast()
	c.mu.Unlock()
}

// init sets up cond; c.mu is held.
func (c *Manual) init() {
	if c.cond.L == nil {
		c.cond.L = &c.mu
	}
}

// Wait blocks until the manual time reaches deadline or until Wake is
// called, whichever comes first; with deadline Forever only Wake ends it. A
// Wake that came while nobody waited ends the next Wait at once.
func (c *Manual) Wait(deadline int64) {
	c.mu.Lock()
	c.init()
	c.waiting, c.deadline = true, deadline
	c.cond.Broadcast()
	for !c.woken && c.ns.Load() < deadline {
		c.cond.Wait()
	}
	c.woken, c.waiting = false, false
	c.waits++
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Wake ends the current or next Wait. It may be called from any goroutine.
func (c *Manual) Wake() {
	c.mu.Lock()
	c.init()
	c.woken = true
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Sleeping reports whether a goroutine waits with nothing to end its wait
// now: it is in Wait, no Wake is pending and its deadline lies ahead. It
// returns that deadline.
func (c *Manual) Sleeping() (deadline int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, c.sleeping()
}

func (c *Manual) sleeping() bool {
	return c.waiting && !c.woken && c.ns.Load() < c.deadline
}

// Settle blocks until a goroutine is Sleeping and returns its deadline: a
// test calls it to let the waiting goroutine finish what the last move of
// the clock made due.
func (c *Manual) Settle() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	for !c.sleeping() {
		c.cond.Wait()
	}
	return c.deadline
}

// Waits returns how many Wait calls have returned.
func (c *Manual) Waits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waits
}
