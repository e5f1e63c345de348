package metadata

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// benchImages holds, per mapping count, a committed metadata image on a
// file with device 1 mapping virtual blocks [0, n) (built once a run).
var (
	benchMu     sync.Mutex
	benchImages = map[int]string{}
)

func benchImage(b *testing.B, n int) string {
	benchMu.Lock()
	defer benchMu.Unlock()
	if path, ok := benchImages[n]; ok {
		return path
	}
	dir, err := os.MkdirTemp("", "dmfuse-thinmeta-bench")
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "meta")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(n/100+4096) * 4096); err != nil {
		b.Fatal(err)
	}
	p, err := Open(fileDev{f}, Options{Format: true, DataBlockSize: 128, DataBlocks: uint64(4 * n), CacheBlocks: 1024})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.CreateThin(1); err != nil {
		b.Fatal(err)
	}
	th, _ := p.OpenThin(1)
	for v := 0; v < n; v++ {
		d, err := p.AllocDataBlock()
		if err != nil {
			b.Fatal(err)
		}
		if err := th.Insert(uint64(v), d); err != nil {
			b.Fatal(err)
		}
		if v%100000 == 0 {
			if err := p.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	th.Close()
	if err := p.Commit(); err != nil {
		b.Fatal(err)
	}
	benchImages[n] = path
	return path
}

// TestMain removes the benchmarks' images.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, path := range benchImages {
		os.RemoveAll(filepath.Dir(path))
	}
	os.Exit(code)
}

// openBench opens the image of n mappings: read-only in place, or a
// writable copy.
func openBench(b *testing.B, n, cache int, writable bool) *DiskStore {
	if !writable {
		f, err := os.Open(benchImage(b, n))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		p, err := Open(fileDev{f}, Options{DataBlockSize: 128, CacheBlocks: cache, ReadOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	src, err := os.ReadFile(benchImage(b, n))
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "meta")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	p, err := Open(fileDev{f}, Options{DataBlockSize: 128, CacheBlocks: cache})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkFind looks up random mapped blocks of a device of one million
// mappings through caches of 256 blocks (1 MiB) and 8192 (all of it).
func BenchmarkFind(b *testing.B) {
	const n = 1 << 20
	for _, cache := range []int{256, 8192} {
		b.Run(fmt.Sprintf("cache=%d", cache), func(b *testing.B) {
			p := openBench(b, n, cache, false)
			th, _ := p.OpenThin(1)
			rng := rand.New(rand.NewSource(1))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, _, err := th.Find(uint64(rng.Intn(n))); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			s := p.CacheStats()
			b.ReportMetric(float64(s.Misses)/float64(b.N), "misses/op")
		})
	}
}

// BenchmarkFindParallel is BenchmarkFind from GOMAXPROCS goroutines
// through a cache that holds the whole tree.
func BenchmarkFindParallel(b *testing.B) {
	const n = 1 << 20
	p := openBench(b, n, 8192, false)
	th, _ := p.OpenThin(1)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewSource(rand.Int63()))
		for pb.Next() {
			if _, _, err := th.Find(uint64(rng.Intn(n))); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkInsert maps random new blocks (allocation included) into a
// device of one million mappings, committing every 1000 inserts.
func BenchmarkInsert(b *testing.B) {
	const n = 1 << 20
	for _, cache := range []int{256, 8192} {
		b.Run(fmt.Sprintf("cache=%d", cache), func(b *testing.B) {
			p := openBench(b, n, cache, true)
			if err := p.ResizeData(uint64(4*n + b.N)); err != nil {
				b.Fatal(err)
			}
			th, _ := p.OpenThin(1)
			rng := rand.New(rand.NewSource(1))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d, err := p.AllocDataBlock()
				if err != nil {
					b.Fatal(err)
				}
				if err := th.Insert(uint64(n+rng.Intn(8*n)), d); err != nil {
					b.Fatal(err)
				}
				if i%1000 == 999 {
					if err := p.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := p.Commit(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkMemory1M opens a pool of one million mappings with a cache of
// 1024 blocks (4 MiB), looks up b.N random mappings and reports the heap
// the pool holds then.
func BenchmarkMemory1M(b *testing.B) {
	const n = 1 << 20
	benchImage(b, n)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	p := openBench(b, n, 1024, false)
	th, _ := p.OpenThin(1)
	rng := rand.New(rand.NewSource(1))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := th.Find(uint64(rng.Intn(n))); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MiB")
	mb, _ := p.MetadataBlocks()
	free, _ := p.FreeMetadataBlocks()
	b.ReportMetric(float64(mb-free)*4096/(1<<20), "metadata-MiB")
	runtime.KeepAlive(p)
}
