package delay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/stack"
)

func BenchmarkExpSched(b *testing.B) {
	for _, d := range []string{"0.1", "1", "10"} {
		b.Run(d, func(b *testing.B) {
			c, _ := NewRealClock()
			s := NewScheduler(c)
			var rel []int64
			s.onRelease = func(w *waiter) { rel = append(rel, c.Now()-w.deadline) }
			dev := stack.NewMemDevice("m", 1<<20)
			ctor := &stack.Ctor{Len: 2048, Open: func(string) (stack.BlockDevice, error) { return dev, nil }}
			tg, _ := New(s, ctor, []string{"m", "0", d})
			defer tg.Close()
			buf := make([]byte, 4096)
			var tot []int64
			for range b.N {
				t0 := c.Now()
				tg.ReadAt(context.Background(), buf, 0)
				tot = append(tot, c.Now()-t0-tg.cls[0].delay)
			}
			slices.Sort(rel)
			slices.Sort(tot)
			b.ReportMetric(float64(rel[len(rel)/2])/1e3, "rel-p50")
			b.ReportMetric(float64(rel[len(rel)*99/100])/1e3, "rel-p99")
			b.ReportMetric(float64(tot[len(tot)/2])/1e3, "tot-p50")
			b.ReportMetric(float64(tot[len(tot)*99/100])/1e3, "tot-p99")
			_ = time.Now
		})
	}
}
