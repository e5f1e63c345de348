package sm

import (
	"errors"
	"math/rand"
	"testing"

	"github.com/dmfuse/dmfuse/internal/memdev"
	"github.com/dmfuse/dmfuse/persistent"
	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/tm"
)

type rig struct {
	dev *memdev.Device
	bm  *block.Manager
	tm  *tm.TM
	msm *Metadata
}

func newRig(t testing.TB, blocks int) *rig {
	t.Helper()
	dev := memdev.New("meta", int64(blocks)*4096)
	bm := block.NewManager(dev, 32)
	msm, err := NewMetadata(uint64(blocks))
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{dev: dev, bm: bm, tm: tm.New(bm, msm), msm: msm}
	if err := msm.Init(r.tm); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) commit(t testing.TB) Root {
	t.Helper()
	root, err := r.msm.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.bm.Flush(); err != nil {
		t.Fatal(err)
	}
	r.tm.Commit()
	r.msm.Committed()
	return root
}

// reopen reads the committed metadata space map back through a new block
// manager.
func (r *rig) reopen(t testing.TB, root Root) *Metadata {
	t.Helper()
	bm := block.NewManager(r.dev, 32)
	t2 := tm.New(bm, nil)
	m, err := OpenMetadata(t2, root)
	if err != nil {
		t.Fatal(err)
	}
	t2.SetSM(m)
	return m
}

// TestMetadataCountsAgainstModel changes counts at random, across the
// 2-bit values, the overflow tree (3 and over) and the in-memory overflow
// (255 and over), and checks that each commit lays out a map that reads
// back the same, its own blocks included.
func TestMetadataCountsAgainstModel(t *testing.T) {
	const blocks = 40000 // three bitmaps
	r := newRig(t, blocks)
	rng := rand.New(rand.NewSource(1))
	model := map[uint64]uint32{}
	var held []uint64
	for round := 0; round < 12; round++ {
		for i := 0; i < 3000; i++ {
			switch op := rng.Intn(10); {
			case op < 4 || len(held) == 0:
				b, err := r.msm.NewBlock()
				if err != nil {
					t.Fatal(err)
				}
				if c, _ := r.msm.Count(b); c != 1 {
					t.Fatalf("new block %d has count %d", b, c)
				}
				model[b] = 1
				held = append(held, b)
			case op < 7:
				b := held[rng.Intn(len(held))]
				n := uint32(1)
				if rng.Intn(50) == 0 {
					n = 300
				}
				for j := uint32(0); j < n; j++ {
					if err := r.msm.Inc(b); err != nil {
						t.Fatal(err)
					}
				}
				model[b] += n
			default:
				k := rng.Intn(len(held))
				b := held[k]
				if err := r.msm.Dec(b); err != nil {
					t.Fatal(err)
				}
				model[b]--
				if model[b] == 0 {
					delete(model, b)
					held[k] = held[len(held)-1]
					held = held[:len(held)-1]
				}
			}
		}
		root := r.commit(t)
		m := r.reopen(t, root)
		for b := uint64(0); b < blocks; b++ {
			got, _ := m.Count(b)
			mine, _ := r.msm.Count(b)
			if got != mine {
				t.Fatalf("round %d: block %d reads back %d, was %d", round, b, got, mine)
			}
			if want, ok := model[b]; ok && got != want {
				t.Fatalf("round %d: block %d count %d, model %d", round, b, got, want)
			}
		}
		if m.NrFree() != r.msm.NrFree() {
			t.Fatalf("free %d, was %d", m.NrFree(), r.msm.NrFree())
		}
	}
	if err := r.msm.Dec(blocks - 1); !errors.Is(err, persistent.ErrCorrupt) && model[blocks-1] == 0 {
		t.Errorf("dec of a free block: %v", err)
	}
}

// TestMetadataFreedWaitsForCommit: a block freed in a transaction is not
// handed out again before the commit.
func TestMetadataFreedWaitsForCommit(t *testing.T) {
	r := newRig(t, 200)
	r.commit(t)
	a, _ := r.msm.NewBlock()
	r.commit(t)
	if err := r.msm.Dec(a); err != nil {
		t.Fatal(err)
	}
	for {
		b, err := r.msm.NewBlock()
		if err != nil {
			break
		}
		if b == a {
			t.Fatalf("block %d reused in the transaction that freed it", a)
		}
	}
}

func newDiskRig(t testing.TB, dataBlocks uint64) (*rig, *Disk) {
	r := newRig(t, 2000)
	d, err := NewDisk(r.tm, dataBlocks)
	if err != nil {
		t.Fatal(err)
	}
	return r, d
}

func (r *rig) commitDisk(t testing.TB, d *Disk) (Root, Root) {
	t.Helper()
	dr, err := d.Commit()
	if err != nil {
		t.Fatal(err)
	}
	mr := r.commit(t)
	d.Committed()
	return dr, mr
}

// TestDiskCountsAgainstModel allocates, shares and frees data blocks at
// random over several bitmaps, and reads each committed map back.
func TestDiskCountsAgainstModel(t *testing.T) {
	const n = 40000
	r, d := newDiskRig(t, n)
	rng := rand.New(rand.NewSource(3))
	model := map[uint64]uint32{}
	var held []uint64
	for round := 0; round < 8; round++ {
		freed := map[uint64]bool{}
		for i := 0; i < 4000; i++ {
			switch op := rng.Intn(10); {
			case op < 5 || len(held) == 0:
				b, err := d.NewBlock()
				if err != nil {
					t.Fatal(err)
				}
				if freed[b] {
					t.Fatalf("block %d reused in the transaction that freed it", b)
				}
				model[b] = 1
				held = append(held, b)
			case op < 7:
				b := held[rng.Intn(len(held))]
				if err := d.Inc(b); err != nil {
					t.Fatal(err)
				}
				model[b]++
			default:
				k := rng.Intn(len(held))
				b := held[k]
				if err := d.Dec(b); err != nil {
					t.Fatal(err)
				}
				model[b]--
				if model[b] == 0 {
					delete(model, b)
					freed[b] = true
					held[k] = held[len(held)-1]
					held = held[:len(held)-1]
				}
			}
		}
		if d.NrFree() != n-uint64(len(model)) {
			t.Fatalf("free %d, model %d", d.NrFree(), n-len(model))
		}
		dr, mr := r.commitDisk(t, d)
		bm := block.NewManager(r.dev, 16)
		t2 := tm.New(bm, nil)
		m2, err := OpenMetadata(t2, mr)
		if err != nil {
			t.Fatal(err)
		}
		t2.SetSM(m2)
		d2, err := OpenDisk(t2, dr)
		if err != nil {
			t.Fatal(err)
		}
		for b := uint64(0); b < n; b += 7 {
			got, err := d2.Count(b)
			if err != nil {
				t.Fatal(err)
			}
			if got != model[b] {
				t.Fatalf("round %d: data block %d reads back %d, model %d", round, b, got, model[b])
			}
		}
		for b := range model {
			if got, _ := d2.Count(b); got != model[b] {
				t.Fatalf("round %d: data block %d reads back %d, model %d", round, b, got, model[b])
			}
		}
	}
}

func TestDiskExtendAndFull(t *testing.T) {
	r, d := newDiskRig(t, 10)
	for i := 0; i < 10; i++ {
		if _, err := d.NewBlock(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.NewBlock(); !errors.Is(err, persistent.ErrNoSpace) {
		t.Fatalf("alloc from a full map: %v", err)
	}
	r.commitDisk(t, d)
	if err := d.Dec(3); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NewBlock(); !errors.Is(err, persistent.ErrNoSpace) {
		t.Fatalf("alloc of a block freed in this transaction: %v", err)
	}
	r.commitDisk(t, d)
	if b, err := d.NewBlock(); err != nil || b != 3 {
		t.Fatalf("alloc after commit: %d, %v; want 3", b, err)
	}
	if err := d.Extend(5); err == nil {
		t.Fatal("shrink accepted")
	}
	if err := d.Extend(EntriesPerBlock + 100); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for i := 0; i < EntriesPerBlock+90; i++ {
		b, err := d.NewBlock()
		if err != nil {
			t.Fatalf("alloc %d: %v", i, err)
		}
		if seen[b] || b < 10 {
			t.Fatalf("block %d handed out twice", b)
		}
		seen[b] = true
	}
	if _, err := d.NewBlock(); !errors.Is(err, persistent.ErrNoSpace) {
		t.Fatalf("alloc from the full extended map: %v", err)
	}
	r.commitDisk(t, d)
}

func TestBitmapLayout(t *testing.T) {
	b := make([]byte, block.Size)
	for i := 0; i < 8; i++ {
		bitmapSet(b, i, 1)
	}
	if w := le.Uint64(b[16:]); w != 0xAAAA {
		t.Errorf("eight counts of 1: word %#x, want 0xaaaa", w)
	}
	bitmapSet(b, 10, 2)
	if w := le.Uint64(b[16:]); w&(1<<20) == 0 || w&(1<<21) != 0 {
		t.Errorf("count 2 at 10: word %#x", w)
	}
	for i, want := range map[int]uint32{0: 1, 7: 1, 8: 0, 10: 2} {
		if got := bitmapGet(b, i); got != want {
			t.Errorf("entry %d: %d, want %d", i, got, want)
		}
	}
	if got := bitmapFindFree(b, 0, 100); got != 8 {
		t.Errorf("first free %d, want 8", got)
	}
	bitmapSet(b, 8, 3)
	bitmapSet(b, 9, 1)
	if got := bitmapFindFree(b, 0, 100); got != 11 {
		t.Errorf("first free %d, want 11", got)
	}
	full := make([]byte, block.Size)
	for i := 0; i < 64; i++ {
		bitmapSet(full, i, 1)
	}
	if got := bitmapFindFree(full, 0, 64); got != -1 {
		t.Errorf("free in a full range: %d", got)
	}
}
