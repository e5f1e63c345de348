package selectors

import (
	"fmt"
	"sync"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// TestConcurrent hammers every selector from many goroutines: select, start,
// end, fail, reinstate and status at once (run with -race). Afterwards every
// in-flight count must be back to zero.
func TestConcurrent(t *testing.T) {
	for _, typ := range Types() {
		t.Run(typ.Name, func(t *testing.T) {
			clk := &clock.Manual{}
			clk.Set(1 << 40)
			s, err := typ.New(nil, clk)
			if err != nil {
				t.Fatal(err)
			}
			ps := make([]*Path, 8)
			for i := range ps {
				ps[i] = &Path{Dev: i}
				if err := s.AddPath(ps[i], nil); err != nil {
					t.Fatal(err)
				}
			}
			tr, _ := s.(IOTracker)
			var wg sync.WaitGroup
			const workers, iters = 16, 5000
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range iters {
						p := s.SelectPath(4096)
						if p == nil {
							continue // every path may be failed for a moment
						}
						if w == 2 {
							clk.Advance(1000)
						}
						if tr != nil {
							st := clk.Nanotime()
							tr.StartIO(p, 4096)
							tr.EndIO(p, 4096, st)
						}
						if w == 0 && i%50 == 0 {
							q := ps[(i/50)%len(ps)]
							s.FailPath(q)
							_ = s.Status(q, StatusInfo)
							if err := s.ReinstatePath(q); err != nil {
								t.Error(err)
							}
						}
						if w == 1 && i%100 == 0 {
							_ = s.Status(nil, StatusInfo)
							_ = s.Status(ps[i%len(ps)], StatusInfo)
						}
					}
				}()
			}
			wg.Wait()
			for _, p := range ps {
				info := s.Status(p, StatusInfo)
				var zero bool
				switch typ.Name {
				case "round-robin":
					zero = info == ""
				case "queue-length":
					zero = info == "0 "
				case "service-time":
					zero = info == "0 1 "
				case "historical-service-time":
					var h, out, stale uint64
					fmt.Sscanf(info, "%d %d %d", &h, &out, &stale)
					zero = out == 0
				}
				if !zero {
					t.Errorf("path %v: INFO %q after all I/O ended", p.Dev, info)
				}
			}
			// Every path is valid again and reachable (HST: once every
			// estimate is stale, idle paths are preferred to busy ones).
			clk.Advance(3600e9)
			seen := map[*Path]bool{}
			for range 10 * len(ps) {
				p := s.SelectPath(4096)
				seen[p] = true
				if tr != nil {
					tr.StartIO(p, 4096)
				}
			}
			if len(seen) != len(ps) {
				t.Errorf("%d paths reachable after the run, want %d", len(seen), len(ps))
			}
		})
	}
}

// TestNoAllocs: the hot path (select, start, end) allocates nothing.
func TestNoAllocs(t *testing.T) {
	for _, typ := range Types() {
		clk := &clock.Manual{}
		s, _ := typ.New(nil, clk)
		for i := range 10 {
			s.AddPath(&Path{Dev: i}, nil)
		}
		tr, _ := s.(IOTracker)
		var now int64
		allocs := testing.AllocsPerRun(1000, func() {
			now += 1000
			clk.Set(now)
			p := s.SelectPath(4096)
			if tr != nil {
				tr.StartIO(p, 4096)
				tr.EndIO(p, 4096, now-500)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per I/O", typ.Name, allocs)
		}
	}
}

func BenchmarkSelectStartEnd(b *testing.B) {
	for _, typ := range Types() {
		b.Run(typ.Name, func(b *testing.B) {
			s, _ := typ.New(nil, clock.System)
			for i := range 10 {
				s.AddPath(&Path{Dev: i}, nil)
			}
			tr, _ := s.(IOTracker)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p := s.SelectPath(4096)
					if tr != nil {
						st := clock.System.Nanotime()
						tr.StartIO(p, 4096)
						tr.EndIO(p, 4096, st)
					}
				}
			})
		})
	}
}
