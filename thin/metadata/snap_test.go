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

func mustThin(t *testing.T, p *Pool, id uint32) Thin {
	t.Helper()
	th, err := p.OpenThin(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { th.Close() })
	return th
}
