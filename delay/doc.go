// Package delay is dmfuse's delay target (drivers/md/dm-delay.c, v1.5.0) and
// the deadline scheduler that serves it.
//
// # Target
//
//	<dev> <offset> <delay>
//	<rdev> <roff> <rdelay> <wdev> <woff> <wdelay>
//	<rdev> <roff> <rdelay> <wdev> <woff> <wdelay> <fdev> <foff> <fdelay>
//
// Reads, writes (with discards and write-zeroes) and flushes each wait for
// their class's delay, in milliseconds (fractions such as 0.25 are accepted and
// printed back in their shortest form), then go to their class's device. A
// delay of 0 passes straight through. INFO is the number of requests queued
// now per class; presuspend releases everything and stops delaying until
// resume. The target starts the device's accounting when a request leaves the
// queue, so in-flight excludes waiting I/O while the time fields include it.
//
// # Scheduler
//
// Go timers cannot wait less than about 1.1 ms, so one Scheduler per Manager
// (kept in its stack.SharedSet, closed by Manager.Close) serves every delay
// target: a goroutine locked to its OS thread,
// with timer slack 1 ns, keeps each target's earliest deadline in a heap and
// waits in ppoll(2) on an eventfd, in one sleep until NapWindow before the
// spin and in naps of at most MaxSleep after it, until SpinWindow before the
// earliest release time, then spins on the monotonic clock.
// A request's delay runs from its arrival at the target: what its hints
// cost its transport (below) is part of the delay, not added to it. Every
// pass releases all requests due within the clock's Lead (EarlyWake, 100
// us on the real clock) in arrival order. A released request finishes the wait
// on its own goroutine, spinning on the monotonic clock until its deadline:
// waking a parked request on another CPU takes tens of microseconds, so
// releasing at the deadline itself would always be that late. That holds
// while one request is active (queued or finishing, any target of the
// process): with several (a deep queue, multipath's slow paths), each is
// released at its deadline and spins no more, so that a CPU the
// application and the transport need is not spent on spins (64 requests of
// 10 ms spinning up to 100 us each take a sixth of one of two CPUs); a
// request is then late by its wake-up, and the scheduler itself sleeps to
// each release in one ppoll, without naps or a spin (RealClock.Sleep, the
// Sleeper capability). A request that
// parks tells its transport when it will complete (stack.Expecting), so that
// a transport that commits replies on a thread of its own can have that
// thread awake by then. A request whose
// delay is no longer than the lead never parks and never involves the
// scheduler: it spins, and leaves its queue at its deadline unless presuspend
// releases it first. A request with an earlier deadline wakes the scheduler
// through the eventfd; with nothing queued it sleeps without a timeout, after
// lingering briefly (Linger) only if it just released a request shorter than
// LingerBelow, whose successor may need it sooner than a wake-up. A waiting
// request parks its thread in futex(2) on a pooled waiter and allocates
// nothing; the release is one futex wake-up
// (park_linux.go says why not a channel). So each waiting request holds an OS
// thread, which the Go runtime creates as needed and keeps for reuse: 64
// requests in flight on a delay device mean about 64 threads. The queued counts
// of INFO drop when a request is released, up to the lead before it proceeds;
// presuspend releases what is queued, and a request already released finishes
// its last microseconds.
//
// Clock abstracts "now" and "wait until", so unit tests drive the same code on
// a clock.Manual. A scheduler on the real clock wants SchedulerProcs Ps on
// top of one per CPU; the daemon raises GOMAXPROCS by them.
//
// # Benchmarks
//
// BenchmarkAccuracy, BenchmarkWakeup, BenchmarkIdleCPU, BenchmarkQD1CPU and
// BenchmarkQueueDepth measure the lateness of releases, the release itself,
// and the CPU the scheduler costs; docs/benchmarks.md ("In-process
// benchmarks") has the current figures.
package delay
