package snapshot

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestPersistentStoreModel drives the persistent store as the targets do,
// against a model: batches of prepares, their commits arriving in any
// order from as many goroutines; every done runs once with ok, and after
// each batch the store read afresh from the device holds exactly the
// exceptions committed, in allocation order, with the same usage; the COW
// fills with errFull at the kernel's bound and nothing is written past it.
// One-sector chunks (32 entries an area) cross many areas.
func TestPersistentStoreModel(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		const chunks = 200
		cow := stacktest.NewMemDevice("c", chunks*512)
		p := &persistent{cow: cow, cs: 1, blockSize: 512}
		if valid, err := p.read(func(uint64, uint64) { t.Fatal("a new store has exceptions") }); err != nil || !valid {
			t.Fatalf("new store: %v, %v", valid, err)
		}
		var model []Exception
		full := false
		for !full {
			n := 1 + rng.IntN(6)
			var batch []Exception
			for i := 0; i < n; i++ {
				nw, err := p.prepare()
				if err == errFull {
					full = true
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				batch = append(batch, Exception{Old: rng.Uint64N(1 << 40), New: nw})
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			calls := map[uint64]int{}
			for _, i := range rng.Perm(len(batch)) {
				wg.Add(1)
				go func(e Exception) {
					p.commit(e.Old, e.New, true, func(ok bool) {
						if !ok {
							t.Errorf("commit of %+v: not ok", e)
						}
						mu.Lock()
						calls[e.New]++
						mu.Unlock()
						wg.Done()
					})
				}(batch[i])
			}
			wg.Wait()
			for _, e := range batch {
				if calls[e.New] != 1 {
					t.Fatalf("done of %+v ran %d times", e, calls[e.New])
				}
			}
			model = append(model, batch...)
			again := &persistent{cow: cow, cs: 1, blockSize: 512}
			var got []Exception
			if valid, err := again.read(func(o, n uint64) { got = append(got, Exception{o, n}) }); err != nil || !valid {
				t.Fatalf("reopen: %v, %v", valid, err)
			}
			if len(got) != len(model) {
				t.Fatalf("seed %d: reopened with %d exceptions, want %d", seed, len(got), len(model))
			}
			for i := range got {
				if got[i] != model[i] {
					t.Fatalf("seed %d: entry %d is %+v, want %+v", seed, i, got[i], model[i])
				}
			}
			a1, t1, m1 := p.usage()
			a2, t2, m2 := again.usage()
			if a1 != a2 || t1 != t2 || m1 != m2 {
				t.Fatalf("usage live %d/%d %d, reopened %d/%d %d", a1, t1, m1, a2, t2, m2)
			}
		}
		// Full: the last area's successor (the terminator) still fits.
		if last := model[len(model)-1].New; (last+2)*512 > chunks*512 {
			t.Errorf("seed %d: allocated chunk %d of %d", seed, last, chunks)
		}
	}
}
