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
// Go timers cannot wait less than about 1.1 ms, so one Scheduler per process
// (Default) serves every delay target: a goroutine locked to its OS thread,
// with timer slack 1 ns, keeps each target's earliest deadline in a heap and
// waits in ppoll(2) on an eventfd, in one sleep until NapWindow before the
// spin and in naps of at most MaxSleep after it, until SpinWindow before the
// earliest release time, then spins on the monotonic clock.
// Every pass releases all requests due within the clock's Lead (EarlyWake, 100
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
// a manual clock.
//
// # Measurements
//
// go test -run XXX -bench 'Accuracy/scheduler|Wakeup|QD1CPU|QueueDepth'
// -benchtime 2000x -count 3 ./delay/ on an otherwise idle 2-vCPU VM (kernel
// 6.18.44); lateness = actual minus requested delay of a 4 KiB ReadAt,
// median / p99, range of the 3 runs (in brackets, two runs of the same
// command when the scheduler lingered after every release, not only after
// delays below LingerBelow):
//
//	0.05 ms  0.2 us / 18-21 us        [0.2-0.3 us / 19-41 us]
//	0.1 ms   0.2 us / 17-21 us        [0.2-0.4 us / 14-71 us]
//	1 ms     0.6 us / 17-19 us        [0.6-1.5 us / 170-1163 us]
//	10 ms    1.4-2.9 us / 299-603 us  [2.5-21 us / 332-2645 us]
//
// The release itself (BenchmarkWakeup, futex wake to the parked thread
// running) takes 2.7-3.0 us at the median when the scheduler naps right after
// it. CPU: 0.5-0.7 ms per second idle with a target constructed
// (BenchmarkIdleCPU, -benchtime 5x); 322-343 ms per second serving QD1 at
// 1 ms (BenchmarkQD1CPU, 995-998 IOPS; 402-416 ms/s at 965-973 IOPS with a
// linger after every release); 64 concurrent requests on 10 ms reach
// 5926-6168 IOPS of 6400 (BenchmarkQueueDepth).
package delay
