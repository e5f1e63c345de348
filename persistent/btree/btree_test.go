package btree

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/dmfuse/dmfuse/internal/memdev"
	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/tm"
)

// mapSM is a space map in a Go map; blocks freed in a transaction are not
// reused before commit, as in the real ones.
type mapSM struct {
	n      uint64
	counts map[uint64]uint32
	freed  map[uint64]bool
	next   uint64
}

func (s *mapSM) NewBlock() (uint64, error) {
	for i := uint64(0); i < s.n; i++ {
		b := (s.next + i) % s.n
		if s.counts[b] == 0 && !s.freed[b] {
			s.counts[b] = 1
			s.next = b + 1
			return b, nil
		}
	}
	return 0, errors.New("full")
}

func (s *mapSM) Inc(b uint64) error { s.counts[b]++; return nil }

func (s *mapSM) Dec(b uint64) error {
	if s.counts[b] == 0 {
		return fmt.Errorf("block %d below 0", b)
	}
	s.counts[b]--
	if s.counts[b] == 0 {
		delete(s.counts, b)
		s.freed[b] = true
	}
	return nil
}

func (s *mapSM) Count(b uint64) (uint32, error) { return s.counts[b], nil }

func (s *mapSM) commit() { clear(s.freed) }

func newTree(t testing.TB, blocks int, vt ValueType) (*Info, *mapSM) {
	t.Helper()
	dev := memdev.New("meta", int64(blocks)*4096)
	sm := &mapSM{n: uint64(blocks), counts: map[uint64]uint32{}, freed: map[uint64]bool{}}
	return &Info{TM: tm.New(block.NewManager(dev, 64), sm), VT: vt}, sm
}

func v64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// reachable counts the references to each node of the trees at roots.
func reachable(t testing.TB, info *Info, roots ...uint64) map[uint64]uint32 {
	t.Helper()
	refs := map[uint64]uint32{}
	seen := map[uint64]bool{}
	var walk func(loc uint64)
	walk = func(loc uint64) {
		refs[loc]++
		if seen[loc] {
			return
		}
		seen[loc] = true
		leaf, keys, vals, err := NodeEntries(info, loc)
		if err != nil {
			t.Fatal(err)
		}
		if !leaf {
			for i := range keys {
				walk(binary.LittleEndian.Uint64(vals[8*i:]))
			}
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return refs
}

func checkAgainst(t testing.TB, info *Info, root uint64, model map[uint64]uint64) {
	t.Helper()
	var keys []uint64
	err := Walk(info, root, func(k uint64, v []byte) error {
		if want, ok := model[k]; !ok || binary.LittleEndian.Uint64(v) != want {
			return fmt.Errorf("key %d: %d, model %d (%v)", k, binary.LittleEndian.Uint64(v), want, ok)
		}
		keys = append(keys, k)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(model) {
		t.Fatalf("tree has %d keys, model %d", len(keys), len(model))
	}
}

func TestRandomAgainstMap(t *testing.T) {
	info, sm := newTree(t, 8192, ValueType{Size: 8})
	root, err := Empty(info)
	if err != nil {
		t.Fatal(err)
	}
	model := map[uint64]uint64{}
	rng := rand.New(rand.NewSource(2))
	n := 30000
	if testing.Short() {
		n = 10000
	}
	keySpace := 30000
	for i := 0; i < n; i++ {
		k := uint64(rng.Intn(keySpace))
		switch op := rng.Intn(10); {
		case op < 6:
			v := rng.Uint64()
			var inserted bool
			root, inserted, err = Insert(info, root, k, v64(v))
			if err != nil {
				t.Fatal(err)
			}
			if _, had := model[k]; had == inserted {
				t.Fatalf("insert %d: inserted %v, model had it %v", k, inserted, had)
			}
			model[k] = v
		case op < 9:
			root, err = Remove(info, root, k)
			if _, had := model[k]; had {
				if err != nil {
					t.Fatalf("remove %d: %v", k, err)
				}
				delete(model, k)
			} else if !errors.Is(err, ErrNotFound) {
				t.Fatalf("remove absent %d: %v", k, err)
			}
		default:
			var v [8]byte
			ok, err := Lookup(info, root, k, v[:])
			want, had := model[k]
			if err != nil || ok != had || (ok && binary.LittleEndian.Uint64(v[:]) != want) {
				t.Fatalf("lookup %d: %v %v, model %d %v", k, ok, err, want, had)
			}
			nk, ok, err := LookupNext(info, root, k, v[:])
			wk, wok := uint64(0), false
			for kk := range model {
				if kk >= k && (!wok || kk < wk) {
					wk, wok = kk, true
				}
			}
			if err != nil || ok != wok || (ok && nk != wk) {
				t.Fatalf("lookup next %d: %d %v %v, want %d %v", k, nk, ok, err, wk, wok)
			}
		}
		if i%500 == 0 {
			info.TM.Commit()
			sm.commit()
		}
		if i%5000 == 0 {
			checkAgainst(t, info, root, model)
		}
		// Phases: fill, drain, fill again.
		if i == n/3 {
			keySpace = 5000
		}
	}
	checkAgainst(t, info, root, model)
	refs := reachable(t, info, root)
	for b, c := range sm.counts {
		if refs[b] != c {
			t.Errorf("block %d: count %d, %d references", b, c, refs[b])
		}
	}
	if len(refs) != len(sm.counts) {
		t.Errorf("%d blocks counted, %d reachable", len(sm.counts), len(refs))
	}
	if h, ok, _ := FindHighest(info, root, nil); ok != (len(model) > 0) || (ok && h != slices.Max(keysOf(model))) {
		t.Errorf("highest %d %v", h, ok)
	}
}

func keysOf(m map[uint64]uint64) []uint64 {
	var ks []uint64
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestDrainToEmpty removes every key of a three-level tree (40000 keys
// inserted in order leave half-full leaves: over 252 of them) in random
// order, checking the structure (a third full, one leaf depth) as it
// shrinks, down to an empty root leaf.
func TestDrainToEmpty(t *testing.T) {
	info, sm := newTree(t, 4096, ValueType{Size: 8})
	root, _ := Empty(info)
	model := map[uint64]uint64{}
	const n = 40000
	var err error
	for k := uint64(0); k < n; k++ {
		if root, _, err = Insert(info, root, k*2, v64(k)); err != nil {
			t.Fatal(err)
		}
		model[k*2] = k
	}
	info.TM.Commit()
	sm.commit()
	leaf, _, vals, err := NodeEntries(info, root)
	if err != nil || leaf {
		t.Fatalf("root: leaf %v, %v", leaf, err)
	}
	if leaf, _, _, err := NodeEntries(info, binary.LittleEndian.Uint64(vals)); err != nil || leaf {
		t.Fatalf("the tree has two levels, not three: %v", err)
	}
	order := rand.New(rand.NewSource(4)).Perm(n)
	for i, k := range order {
		if root, err = Remove(info, root, uint64(k)*2); err != nil {
			t.Fatal(err)
		}
		delete(model, uint64(k)*2)
		if i%4000 == 0 {
			checkAgainst(t, info, root, model)
			info.TM.Commit()
			sm.commit()
		}
	}
	checkAgainst(t, info, root, model)
	if len(sm.counts) != 1 {
		t.Errorf("%d blocks in use after draining, want the root alone", len(sm.counts))
	}
}

// TestSharedTrees clones a tree by a reference on its root, as a
// snapshot does, changes both copies, and checks that each keeps its own
// contents, that the value references follow the shared leaves (Inc on a
// copied shared leaf, Dec on removal), and that deleting both trees
// leaves nothing counted.
func TestSharedTrees(t *testing.T) {
	vals := map[uint64]int{}
	vt := ValueType{Size: 8,
		Inc: func(v []byte, n int) error {
			for i := 0; i < n; i++ {
				vals[binary.LittleEndian.Uint64(v[8*i:])]++
			}
			return nil
		},
		Dec: func(v []byte, n int) error {
			for i := 0; i < n; i++ {
				vals[binary.LittleEndian.Uint64(v[8*i:])]--
			}
			return nil
		},
	}
	info, sm := newTree(t, 4096, vt)
	a, _ := Empty(info)
	ma := map[uint64]uint64{}
	next := uint64(1)
	var err error
	for k := uint64(0); k < 5000; k++ {
		if a, _, err = Insert(info, a, k, v64(next)); err != nil {
			t.Fatal(err)
		}
		vals[next]++ // the caller's reference
		ma[k] = next
		next++
	}
	info.TM.Commit()
	sm.commit()
	if err := info.TM.Inc(a); err != nil {
		t.Fatal(err)
	}
	b := a
	mb := map[uint64]uint64{}
	for k, v := range ma {
		mb[k] = v
	}
	rng := rand.New(rand.NewSource(9))
	for i := 0; i < 3000; i++ {
		k := uint64(rng.Intn(6000))
		root, m := &a, ma
		if rng.Intn(2) == 0 {
			root, m = &b, mb
		}
		if rng.Intn(3) == 0 {
			if _, ok := m[k]; ok {
				if *root, err = Remove(info, *root, k); err != nil {
					t.Fatal(err)
				}
				delete(m, k)
			}
			continue
		}
		if *root, _, err = Insert(info, *root, k, v64(next)); err != nil {
			t.Fatal(err)
		}
		vals[next]++
		m[k] = next
		next++
		if i%400 == 0 {
			info.TM.Commit()
			sm.commit()
		}
	}
	checkAgainst(t, info, a, ma)
	checkAgainst(t, info, b, mb)
	// Each value's count is the number of distinct leaves holding it.
	want := map[uint64]int{}
	seen := map[uint64]bool{}
	for _, r := range []uint64{a, b} {
		if err := WalkNodes(info, r, func(loc uint64, leaf bool, v []byte, nr int) error {
			if leaf && !seen[loc] {
				seen[loc] = true
				for i := 0; i < nr; i++ {
					want[binary.LittleEndian.Uint64(v[8*i:])]++
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for v, c := range vals {
		if c != want[v] {
			t.Fatalf("value %d: count %d, in %d leaves", v, c, want[v])
		}
	}
	refs := reachable(t, info, a, b)
	for blk, c := range sm.counts {
		if refs[blk] != c {
			t.Fatalf("block %d: count %d, %d references", blk, c, refs[blk])
		}
	}
	if err := Del(info, a); err != nil {
		t.Fatal(err)
	}
	if err := Del(info, b); err != nil {
		t.Fatal(err)
	}
	if len(sm.counts) != 0 {
		t.Errorf("%d blocks still counted after deleting both trees", len(sm.counts))
	}
	for v, c := range vals {
		if c != 0 {
			t.Fatalf("value %d: %d references left", v, c)
		}
	}
}

func TestNodeLayout(t *testing.T) {
	for vs, want := range map[int]int{8: 252, 24: 126, 4: 336, 16: 168} {
		if got := MaxEntries(vs); got != want {
			t.Errorf("MaxEntries(%d) = %d, want %d", vs, got, want)
		}
	}
	info, _ := newTree(t, 64, ValueType{Size: 24})
	root, _ := Empty(info)
	b, err := info.TM.ReadLock(root, Validator)
	if err != nil {
		t.Fatal(err)
	}
	n := node(b.Data())
	if n.flags() != LeafNode || n.nr() != 0 || n.max() != 126 || n.valueSize() != 24 {
		t.Errorf("empty tree header: flags %d nr %d max %d vs %d", n.flags(), n.nr(), n.max(), n.valueSize())
	}
	info.TM.Unlock(b)
	// A full root splits beneath itself: it stays where it is and becomes
	// an internal node of 8-byte values.
	for k := uint64(0); k <= 126; k++ {
		if root2, _, err := Insert(info, root, k, make([]byte, 24)); err != nil || root2 != root {
			t.Fatalf("insert %d: root %d (%v), want %d", k, root2, err, root)
		}
	}
	b, _ = info.TM.ReadLock(root, Validator)
	n = node(b.Data())
	if n.flags() != InternalNode || n.nr() != 2 || n.max() != 252 || n.valueSize() != 8 {
		t.Errorf("split root: flags %d nr %d max %d vs %d", n.flags(), n.nr(), n.max(), n.valueSize())
	}
	info.TM.Unlock(b)
}
