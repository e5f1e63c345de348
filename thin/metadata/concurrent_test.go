package metadata

import (
	"sync"
	"testing"
)

// TestConcurrentReadersAndWriter runs Finds from several goroutines while
// one goroutine maps, unmaps and commits, through a small cache.
func TestConcurrentReadersAndWriter(t *testing.T) {
	dev := newMemDev(4096)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 100000, CacheBlocks: 16})
	if err := p.CreateThin(1); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(2); err != nil {
		t.Fatal(err)
	}
	a, _ := p.OpenThin(1)
	defer a.Close()
	want := map[uint64]uint64{}
	for v := uint64(0); v < 5000; v++ {
		d, err := p.AllocDataBlock()
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Insert(v, d); err != nil {
			t.Fatal(err)
		}
		want[v] = d
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := uint64(g); ; i += 7 {
				select {
				case <-stop:
					return
				default:
				}
				v := i % 5000
				d, _, err := a.Find(v)
				if err != nil || d != want[v] {
					errs <- err
					return
				}
			}
		}(g)
	}
	b, _ := p.OpenThin(2)
	mapped := map[uint64]bool{}
	for v := uint64(0); v < 4000; v++ {
		d, err := p.AllocDataBlock()
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Insert(v, d); err != nil {
			t.Fatal(err)
		}
		mapped[v] = true
		if v%3 == 0 && mapped[v/2] {
			if err := b.Remove(v / 2); err != nil {
				t.Fatal(err)
			}
			delete(mapped, v/2)
		}
		if v%500 == 0 {
			if err := p.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, _ := b.MappedCount(); n != uint64(len(mapped)) {
		t.Errorf("device 2: %d mappings, want %d", n, len(mapped))
	}
	b.Close()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("reader: %v", err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
}
