package delay

import "github.com/dmfuse/dmfuse/internal/clock"

// Forever is the deadline of a wait that only a wake-up ends.
const Forever = clock.Forever

// Clock is the time source of a Scheduler: it tells the time and waits for a
// deadline. The real clock (RealClock) waits in ppoll and spins for the last
// microseconds; tests drive the same scheduler with a clock.Manual.
type Clock interface {
	// Nanotime returns monotonic nanoseconds.
	clock.Clock
	// Wait blocks until Nanotime() >= deadline or until Wake is called, whichever
	// comes first; with deadline Forever only Wake ends it. A Wake that came
	// while nobody waited ends the next Wait at once. Wait may return early
	// for no reason; the scheduler checks the time again. Only the scheduler
	// goroutine calls Wait.
	Wait(deadline int64)
	// Wake ends the current or next Wait. It may be called from any
	// goroutine.
	Wake()
	// Lead is how long before its deadline a request is released (0 on a
	// manual clock). A released request finishes the wait itself, spinning
	// on Nanotime until its deadline, so it runs on time even when waking its
	// goroutine takes longer than the scheduler's own precision.
	Lead() int64
	// Yield is called after the scheduler released requests and before it
	// waits again. The real clock blocks for a moment there, so that the
	// released goroutines can run on this CPU at once; without it a release
	// followed by a spin would leave them waiting for another CPU to wake.
	Yield()
}

// A Sleeper is a Clock that can also wait without spinning: Sleep blocks
// until Nanotime() >= deadline or until Wake is called, like Wait, but gives the
// CPU away for the whole wait, may end a little after the deadline, and
// with deadline Forever sleeps at once where Wait may poll for a while
// first. The scheduler sleeps so while several requests are active
// (Scheduler.lead), when it releases them at their deadlines and a spin
// would only take a CPU that the requests about to run need, and when
// nothing is queued after releasing only long delays (Scheduler.sleeps).
type Sleeper interface {
	Sleep(deadline int64)
}
