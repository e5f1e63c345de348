package selectors

import (
	"sync/atomic"
	"time"

	"github.com/dmfuse/dmfuse/stack/clock"
)

// Clock returns monotonic nanoseconds (clock.Clock). Selectors never read the
// wall clock; the multipath target takes each I/O's start stamp from the same
// Clock at map time and hands it back to EndIO.
type Clock = clock.Clock

// SystemClock is the monotonic clock used outside tests. It has nanosecond
// resolution and, on Linux, the same origin as the kernel's ktime_get_ns()
// (CLOCK_MONOTONIC), so HST's stale_after values read like the kernel's.
var SystemClock Clock = systemClock{}

type systemClock struct{}

var (
	monoStart = time.Now()
	monoBase  = monotonicBase()
)

// Nanotime reads Go's monotonic clock (vDSO, no allocation) and shifts it to the
// CLOCK_MONOTONIC origin.
func (systemClock) Nanotime() int64 { return monoBase + int64(time.Since(monoStart)) }

// ManualClock is a Clock that only moves when told to; for tests and simulations
// of the selectors and of the targets that use them. The zero value reads 0.
type ManualClock struct{ ns atomic.Int64 }

// Nanotime returns the current manual time.
func (c *ManualClock) Nanotime() int64 { return c.ns.Load() }

// Set sets the manual time to ns.
func (c *ManualClock) Set(ns int64) { c.ns.Store(ns) }

// Advance moves the manual time forward by d and returns the new time.
func (c *ManualClock) Advance(d time.Duration) int64 { return c.ns.Add(int64(d)) }

// fallbackBase keeps SystemClock well away from 0 when CLOCK_MONOTONIC cannot be
// read: HST treats a stale_after of 0 as "stale", which needs now > 0.
const fallbackBase = 1 << 32
