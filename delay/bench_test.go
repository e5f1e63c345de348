package delay

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// benchTarget returns a 3-argument delay target on a scheduler of its own
// on the real clock.
func benchTarget(b *testing.B, delay string) *Target {
	b.Helper()
	s, err := NewRealScheduler()
	if err != nil {
		b.Fatal(err)
	}
	ctor := &stack.Ctor{Len: 2048, Open: stacktest.Opener{"m": stacktest.NewMemDevice("m", 1<<20)}.Open}
	tg, err := New(s, ctor, []string{"m", "0", delay})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		tg.Close()
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	})
	return tg
}

// reportLateness reports the median and p99 of actual minus requested delay.
func reportLateness(b *testing.B, late []time.Duration) {
	slices.Sort(late)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	b.ReportMetric(us(late[len(late)/2]), "late-µs-p50")
	b.ReportMetric(us(late[len(late)*99/100]), "late-µs-p99")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAccuracy compares the delay a request actually gets, through the
// scheduler (a whole ReadAt of 4 KiB from a memory device) and through a
// time.Timer wait.
func BenchmarkAccuracy(b *testing.B) {
	for _, d := range []struct {
		name string
		dur  time.Duration
	}{{"0.05", 50 * time.Microsecond}, {"0.1", 100 * time.Microsecond}, {"1", time.Millisecond}, {"10", 10 * time.Millisecond}} {
		b.Run("scheduler/"+d.name+"ms", func(b *testing.B) {
			tg := benchTarget(b, d.name)
			buf := make([]byte, 4096)
			ctx := context.Background()
			late := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if _, err := tg.ReadAt(ctx, buf, 0); err != nil {
					b.Fatal(err)
				}
				late = append(late, time.Since(t0)-d.dur)
			}
			reportLateness(b, late)
		})
		b.Run("timer/"+d.name+"ms", func(b *testing.B) {
			tm := time.NewTimer(time.Hour)
			tm.Stop()
			late := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				tm.Reset(d.dur)
				<-tm.C
				late = append(late, time.Since(t0)-d.dur)
			}
			reportLateness(b, late)
		})
	}
}

// BenchmarkWakeup measures the hand-off the scheduler uses to release a
// request: a signal (futex wake) from a goroutine locked to its thread to a
// goroutine parked in futex wait (waiter.park), until that goroutine runs;
// "yield" then naps in 1 us ppolls as the scheduler does after a release
// (Yield, then lingering or sleeping), "spin" keeps the CPU.
func BenchmarkWakeup(b *testing.B) {
	b.Run("yield", func(b *testing.B) { benchWakeup(b, true) })
	b.Run("spin", func(b *testing.B) { benchWakeup(b, false) })
}

func benchWakeup(b *testing.B, yield bool) {
	c, err := NewRealClock()
	if err != nil {
		b.Fatal(err)
	}
	w := waiterPool.Get().(*waiter)
	var sent atomic.Int64
	var got atomic.Bool
	late := make([]time.Duration, 0, b.N)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range b.N {
			w.park()
			w.sig.Store(0)
			late = append(late, time.Duration(clock.Now()-sent.Load()))
			got.Store(true)
		}
	}()
	b.ResetTimer()
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for range b.N {
			for t := clock.Now(); clock.Now()-t < 20_000; { // let the receiver park
			}
			got.Store(false)
			sent.Store(clock.Now())
			w.signal()
			for !got.Load() {
				if yield {
					c.Yield()
				}
			}
		}
	}()
	<-done
	slices.Sort(late)
	b.ReportMetric(float64(late[len(late)/2])/1e3, "wake-µs-p50")
	b.ReportMetric(float64(late[len(late)*99/100])/1e3, "wake-µs-p99")
	b.ReportMetric(0, "ns/op")
}

// cpuTime returns the process's user+system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdleCPU reports the CPU the process uses per second while a
// delay target exists and no I/O is queued (one op is one idle second).
func BenchmarkIdleCPU(b *testing.B) {
	benchTarget(b, "1")
	time.Sleep(10 * time.Millisecond)
	b.ResetTimer()
	c0 := cpuTime(b)
	for range b.N {
		time.Sleep(time.Second)
	}
	b.ReportMetric(float64(cpuTime(b)-c0)/1e6/float64(b.N), "cpu-ms/s")
}

// BenchmarkQD1CPU reports the CPU used per second of serving one request at
// a time with a 1 ms delay, and the requests served per second.
func BenchmarkQD1CPU(b *testing.B) {
	tg := benchTarget(b, "1")
	buf := make([]byte, 4096)
	ctx := context.Background()
	b.ResetTimer()
	t0, c0 := time.Now(), cpuTime(b)
	for range b.N {
		if _, err := tg.ReadAt(ctx, buf, 0); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(t0).Seconds()
	b.ReportMetric(float64(cpuTime(b)-c0)/1e6/el, "cpu-ms/s")
	b.ReportMetric(float64(b.N)/el, "IOPS")
}

// BenchmarkQueueDepth runs 64 goroutines (2 jobs x QD32) on a 10 ms delay:
// the ceiling is 6400 IOPS.
func BenchmarkQueueDepth(b *testing.B) {
	tg := benchTarget(b, "10")
	ctx := context.Background()
	var n atomic.Int64
	n.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ResetTimer()
	t0 := time.Now()
	for range 64 {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for n.Add(-1) >= 0 {
				if _, err := tg.ReadAt(ctx, buf, 0); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "IOPS")
}
