package tm

import (
	"errors"
	"testing"

	"github.com/dmfuse/dmfuse/internal/memdev"
	"github.com/dmfuse/dmfuse/persistent/block"
)

type mapSM struct {
	counts map[uint64]uint32
	next   uint64
}

func (s *mapSM) NewBlock() (uint64, error) {
	for s.counts[s.next] != 0 {
		s.next++
	}
	s.counts[s.next] = 1
	return s.next, nil
}
func (s *mapSM) Inc(b uint64) error { s.counts[b]++; return nil }
func (s *mapSM) Dec(b uint64) error {
	if s.counts[b] == 0 {
		return errors.New("below 0")
	}
	s.counts[b]--
	return nil
}
func (s *mapSM) Count(b uint64) (uint32, error) { return s.counts[b], nil }

func TestShadow(t *testing.T) {
	sm := &mapSM{counts: map[uint64]uint32{}}
	bm := block.NewManager(memdev.New("meta", 64*4096), 16)
	tm := New(bm, sm)
	b, err := tm.NewBlock(block.Bitmap)
	if err != nil {
		t.Fatal(err)
	}
	orig := b.Loc()
	b.Data()[100] = 42
	tm.Unlock(b)
	// Made in this transaction, not shared: changed in place.
	s, shared, err := tm.Shadow(orig, block.Bitmap)
	if err != nil || s.Loc() != orig || shared {
		t.Fatalf("shadow of a new block: %d shared %v %v; want %d in place", s.Loc(), shared, err, orig)
	}
	tm.Unlock(s)
	if err := bm.Flush(); err != nil {
		t.Fatal(err)
	}
	tm.Commit()
	// Committed: copied, and the original loses its reference.
	s, shared, err = tm.Shadow(orig, block.Bitmap)
	if err != nil || s.Loc() == orig || shared {
		t.Fatalf("shadow of a committed block: %d shared %v %v", s.Loc(), shared, err)
	}
	if s.Data()[100] != 42 {
		t.Error("shadow lost the contents")
	}
	copyLoc := s.Loc()
	tm.Unlock(s)
	if sm.counts[orig] != 0 || sm.counts[copyLoc] != 1 {
		t.Errorf("counts orig %d copy %d; want 0, 1", sm.counts[orig], sm.counts[copyLoc])
	}
	if !tm.IsShadow(copyLoc) || tm.IsShadow(orig) {
		t.Error("shadow set wrong")
	}
	// Shared (two references), even if made in this transaction: copied,
	// and the caller told to add references to its children.
	if err := tm.Inc(copyLoc); err != nil {
		t.Fatal(err)
	}
	s, shared, err = tm.Shadow(copyLoc, block.Bitmap)
	if err != nil || s.Loc() == copyLoc || !shared {
		t.Fatalf("shadow of a shared block: %d shared %v %v", s.Loc(), shared, err)
	}
	tm.Unlock(s)
	if sm.counts[copyLoc] != 1 {
		t.Errorf("shared block count %d after shadowing, want 1", sm.counts[copyLoc])
	}
}
