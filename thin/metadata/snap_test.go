package metadata

import (
	"errors"
	"testing"
)

// TestSnapshotSharing follows the kernel's reference counting through a
// snapshot: the snapshot shares the origin's tree (data counts unchanged,
// mappings read as shared by time), and the first change of either
// device copies the leaf and with it a reference to each of its blocks.
func TestSnapshotSharing(t *testing.T) {
	dev := newMemDev(4096)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 40000})
	if err := p.CreateThin(0); err != nil {
		t.Fatal(err)
	}
	th, _ := p.OpenThin(0)
	for v := uint64(0); v < 300; v++ {
		d, err := p.AllocDataBlock()
		if err != nil {
			t.Fatal(err)
		}
		if err := th.Insert(v, d); err != nil {
			t.Fatal(err)
		}
	}
	if _, shared, _ := th.Find(5); shared {
		t.Error("block mapped before any snapshot reads as shared")
	}
	th.Close()
	if err := p.CreateSnap(1, 0); !errors.Is(err, nil) {
		t.Fatal(err)
	}
	if err := p.CreateSnap(1, 0); !errors.Is(err, ErrExists) {
		t.Fatalf("second snapshot 1: %v, want ErrExists", err)
	}
	if err := p.CreateSnap(2, 9); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("snapshot of missing origin: %v, want ErrNoDevice", err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	d5, shared, err := mustThin(t, p, 1).Find(5)
	if err != nil || !shared {
		t.Fatalf("snapshot Find(5) = %d, shared %v, %v", d5, shared, err)
	}
	if s, _ := p.BlockIsShared(d5); s {
		t.Error("data block counted twice before any leaf was copied")
	}
	snap := mustThin(t, p, 1)
	nd, _ := p.AllocDataBlock()
	if err := snap.Insert(7, nd); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.BlockIsShared(d5); !s {
		t.Error("data block of a copied leaf not shared")
	}
	if _, shared, _ := snap.Find(7); shared {
		t.Error("new mapping reads as shared")
	}
	if err := p.DeleteThin(1); !errors.Is(err, ErrBusy) {
		t.Fatalf("delete of an open device: %v, want ErrBusy", err)
	}
	snap.Close()
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	if err := p.DeleteThin(0); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteThin(0); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("second delete: %v, want ErrNoDevice", err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	if s, _ := p.BlockIsShared(d5); s {
		t.Error("data block still shared after its origin was deleted")
	}
}

func mustThin(t *testing.T, p *DiskStore, id uint32) Thin {
	t.Helper()
	th, err := p.OpenThin(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { th.Close() })
	return th
}

func TestFindMappedRange(t *testing.T) {
	p := mustOpen(t, newMemDev(512), Options{Format: true, DataBlockSize: 128, DataBlocks: 1000})
	if err := p.CreateThin(1); err != nil {
		t.Fatal(err)
	}
	th := mustThin(t, p, 1)
	// Runs: [10,15) -> [100,105), [15,18) -> [300,303), 40 -> 7; the
	// mappings hold the blocks' references.
	for _, r := range [][2]uint64{{100, 105}, {300, 303}, {7, 8}} {
		if err := p.IncDataRange(r[0], r[1]); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(0); i < 5; i++ {
		th.Insert(10+i, 100+i)
	}
	for i := uint64(0); i < 3; i++ {
		th.Insert(15+i, 300+i)
	}
	th.Insert(40, 7)
	if err := th.Insert(41, 1000); err == nil {
		t.Error("mapping to a data block past the pool succeeded")
	}
	for _, c := range []struct{ begin, end, vb, db, n uint64 }{
		{0, 100, 10, 100, 5}, {12, 100, 12, 102, 3}, {15, 100, 15, 300, 3}, {18, 100, 40, 7, 1}, {0, 13, 10, 100, 3},
	} {
		vb, db, n, shared, err := th.FindMappedRange(c.begin, c.end)
		if err != nil || vb != c.vb || db != c.db || n != c.n || shared {
			t.Errorf("FindMappedRange(%d, %d) = %d, %d, %d, %v, %v; want %d, %d, %d", c.begin, c.end, vb, db, n, shared, err, c.vb, c.db, c.n)
		}
	}
	if _, _, _, _, err := th.FindMappedRange(41, 1000); !errors.Is(err, ErrNotFound) {
		t.Errorf("FindMappedRange past the last mapping: %v", err)
	}
	if err := th.RemoveRange(11, 16); err != nil {
		t.Fatal(err)
	}
	if n, _ := th.MappedCount(); n != 4 {
		t.Errorf("%d mapped after RemoveRange, want 4", n)
	}
	if _, _, err := th.Find(13); !errors.Is(err, ErrNotFound) {
		t.Errorf("Find of a removed block: %v", err)
	}
	if free, _ := p.FreeDataBlocks(); free != 1000-4 {
		t.Errorf("%d free data blocks, want %d", free, 1000-4)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
}
