package clock

import "golang.org/x/sys/unix"

// monotonicBase returns CLOCK_MONOTONIC at package initialisation, read just
// after start, so that Now has the kernel's ktime_get_ns() origin.
func monotonicBase() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fallbackBase
	}
	return ts.Nano()
}
