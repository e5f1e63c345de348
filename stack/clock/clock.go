// Package clock declares the time source that every part of dmfuse whose
// behaviour depends on time takes: the path selectors (service times, HST),
// the fault targets (flakey intervals), the statistics (io_ticks, dm-stats
// durations). It imports nothing, so that stack, selectors and stats can all
// share the one interface without importing each other.
package clock

// Clock returns monotonic nanoseconds. Implementations: selectors.SystemClock
// (the kernel's CLOCK_MONOTONIC origin), stats.SystemClock (counting from
// process start), and manual clocks that tests move by hand.
type Clock interface{ Nanotime() int64 }
