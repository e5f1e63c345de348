package delay

import (
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func BenchmarkExpPpoll(b *testing.B) {
	for _, d := range []int64{100_000, 1_000_000, 10_000_000} {
		for _, slack := range []bool{false, true} {
			b.Run("", func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				if slack {
					unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
					defer unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0)
				}
				fds := []unix.PollFd{{Fd: -1}}
				var over []int64
				for range b.N {
					t0 := nanotime()
					ts := unix.NsecToTimespec(d)
					unix.Ppoll(fds, &ts, nil)
					over = append(over, nanotime()-t0-d)
				}
				slices.Sort(over)
				b.ReportMetric(float64(d)/1e3, "req-us")
				b.ReportMetric(float64(over[len(over)/2])/1e3, "over-p50")
				b.ReportMetric(float64(over[len(over)*9/10])/1e3, "over-p90")
				b.ReportMetric(float64(over[len(over)*99/100])/1e3, "over-p99")
			})
		}
	}
}
