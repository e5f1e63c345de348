package metadata

import (
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"testing"
)

// model is what the pool's devices should map.
type model map[uint32]map[uint64]uint64

func (m model) clone() model {
	c := model{}
	for id, mp := range m {
		c[id] = map[uint64]uint64{}
		for k, v := range mp {
			c[id][k] = v
		}
	}
	return c
}

// checkModel compares every device and mapping with the model.
func checkModel(t testing.TB, p *DiskStore, m model) {
	t.Helper()
	if err := diffModel(p, m); err != nil {
		t.Fatal(err)
	}
}

func diffModel(p *DiskStore, m model) error {
	for id, mp := range m {
		th, err := p.OpenThin(id)
		if err != nil {
			return fmt.Errorf("open %d: %v", id, err)
		}
		defer th.Close()
		if n, err := th.MappedCount(); err != nil || n != uint64(len(mp)) {
			return fmt.Errorf("device %d: mapped count %d (%v), want %d", id, n, err, len(mp))
		}
		var highest uint64
		for v, d := range mp {
			got, _, err := th.Find(v)
			if err != nil || got != d {
				return fmt.Errorf("device %d: Find(%d) = %d, %v; want %d", id, v, got, err, d)
			}
			highest = max(highest, v)
		}
		h, ok, err := th.HighestMapped()
		if err != nil || ok != (len(mp) > 0) || (ok && h != highest) {
			return fmt.Errorf("device %d: HighestMapped = %d, %v, %v; want %d", id, h, ok, err, highest)
		}
	}
	return nil
}

// randomOps runs n random operations on the pool and the model.
func randomOps(t testing.TB, rng *rand.Rand, p *DiskStore, m model, n int, nextID *uint32) {
	t.Helper()
	ids := func() []uint32 {
		var s []uint32
		for id := range m {
			s = append(s, id)
		}
		slices.Sort(s)
		return s
	}
	for i := 0; i < n; i++ {
		all := ids()
		switch op := rng.Intn(100); {
		case op < 3 || len(all) == 0:
			id := *nextID
			*nextID++
			if err := p.CreateThin(id); err != nil {
				t.Fatal(err)
			}
			m[id] = map[uint64]uint64{}
		case op < 6:
			origin := all[rng.Intn(len(all))]
			id := *nextID
			*nextID++
			if err := p.CreateSnap(id, origin); err != nil {
				t.Fatal(err)
			}
			m[id] = map[uint64]uint64{}
			for k, v := range m[origin] {
				m[id][k] = v
			}
		case op < 7 && len(all) > 2:
			id := all[rng.Intn(len(all))]
			if err := p.DeleteThin(id); errors.Is(err, ErrBusy) {
				continue
			} else if err != nil {
				t.Fatal(err)
			}
			delete(m, id)
		case op < 75:
			id := all[rng.Intn(len(all))]
			th, err := p.OpenThin(id)
			if err != nil {
				t.Fatal(err)
			}
			for j := 0; j < 20; j++ {
				v := uint64(rng.Intn(3000))
				d, err := p.AllocDataBlock()
				if errors.Is(err, ErrNoSpace) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := th.Insert(v, d); err != nil {
					t.Fatal(err)
				}
				m[id][v] = d
			}
			th.Close()
		default:
			id := all[rng.Intn(len(all))]
			th, err := p.OpenThin(id)
			if err != nil {
				t.Fatal(err)
			}
			for j := 0; j < 20; j++ {
				v := uint64(rng.Intn(3000))
				err := th.Remove(v)
				if _, ok := m[id][v]; ok {
					if err != nil {
						t.Fatalf("remove %d/%d: %v", id, v, err)
					}
					delete(m[id], v)
				} else if !errors.Is(err, ErrNotFound) {
					t.Fatalf("remove unmapped %d/%d: %v", id, v, err)
				}
			}
			if rng.Intn(4) == 0 {
				b := uint64(rng.Intn(3000))
				e := b + uint64(rng.Intn(200))
				if err := th.RemoveRange(b, e); err != nil {
					t.Fatal(err)
				}
				for v := range m[id] {
					if v >= b && v < e {
						delete(m[id], v)
					}
				}
			}
			th.Close()
		}
	}
}

func TestStoreRandomAgainstModel(t *testing.T) {
	dev := newMemDev(4096)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 40000, CacheBlocks: 64})
	rng := rand.New(rand.NewSource(1))
	m := model{}
	var next uint32
	const rounds = 30
	var maxMeta, maxData uint32
	for r := 0; r < rounds; r++ {
		randomOps(t, rng, p, m, 60, &next)
		if r%5 == 2 {
			// Two snapshots in a row: three devices share a tree.
			var origin uint32
			for origin = range m {
				break
			}
			for i := 0; i < 2; i++ {
				if err := p.CreateSnap(next, origin); err != nil {
					t.Fatal(err)
				}
				m[next] = maps.Clone(m[origin])
				next++
			}
		}
		if err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		checkModel(t, p, m)
		mm, md := verifyCounts(t, p)
		maxMeta, maxData = max(maxMeta, mm), max(maxData, md)
		if r%5 == 4 {
			p.Close()
			p = mustOpen(t, dev, Options{DataBlockSize: 128, CacheBlocks: 64})
			checkModel(t, p, m)
		}
	}
	// The overflow trees of both space maps were used.
	if maxMeta < 3 || maxData < 3 {
		t.Errorf("highest counts: metadata %d, data %d; the test never reached the overflow trees", maxMeta, maxData)
	}
}
