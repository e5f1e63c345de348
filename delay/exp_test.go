package delay

import (
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func BenchmarkExpWake(b *testing.B) {
	for _, mode := range []string{"spin", "ppoll", "yield", "ppoll0"} {
		b.Run(mode, func(b *testing.B) {
			ch := make(chan struct{}, 1)
			var sent atomic.Int64
			var got atomic.Bool
			late := make([]time.Duration, 0, b.N)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range b.N {
					<-ch
					late = append(late, time.Duration(nanotime()-sent.Load()))
					got.Store(true)
				}
			}()
			go func() {
				if mode != "unlocked-spin" {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
				}
				fds := []unix.PollFd{{Fd: -1}}
				for range b.N {
					ts := unix.NsecToTimespec(200_000)
					unix.Ppoll(fds, &ts, nil)
					got.Store(false)
					sent.Store(nanotime())
					ch <- struct{}{}
					switch mode {
					case "gosched":
						runtime.Gosched()
					case "yield":
						for !got.Load() {
							unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
						}
					case "ppoll0":
						for !got.Load() {
							ts := unix.NsecToTimespec(1000)
							unix.Ppoll(fds, &ts, nil)
						}
					case "ppoll":
						ts := unix.NsecToTimespec(100_000)
						unix.Ppoll(fds, &ts, nil)
					}
					for !got.Load() {
					}
				}
			}()
			<-done
			slices.Sort(late)
			b.ReportMetric(float64(late[len(late)/2])/1e3, "wake-µs-p50")
			b.ReportMetric(float64(late[len(late)*99/100])/1e3, "wake-µs-p99")
			b.ReportMetric(0, "ns/op")
		})
	}
}
