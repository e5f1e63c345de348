// Package tm is the transaction manager (the kernel's
// dm-transaction-manager): it hands out new blocks and shadows committed or
// shared ones, copy-on-write, so that nothing reachable from the last
// committed superblock is overwritten before the next commit.
package tm

import (
	"github.com/dmfuse/dmfuse/persistent/block"
)

// SpaceMap counts the references to metadata blocks.
type SpaceMap interface {
	// NewBlock allocates a free block with one reference.
	NewBlock() (uint64, error)
	Inc(b uint64) error
	Dec(b uint64) error
	Count(b uint64) (uint32, error)
}

// TM is one transaction manager.
type TM struct {
	bm      *block.Manager
	sm      SpaceMap
	shadows map[uint64]struct{}
}

// New returns a transaction manager of bm's blocks counted by sm.
func New(bm *block.Manager, sm SpaceMap) *TM {
	return &TM{bm: bm, sm: sm, shadows: make(map[uint64]struct{})}
}

// BM is the block manager.
func (t *TM) BM() *block.Manager { return t.bm }

// SM is the metadata space map.
func (t *TM) SM() SpaceMap { return t.sm }

// SetSM replaces the space map (while one is being built).
func (t *TM) SetSM(sm SpaceMap) { t.sm = sm }

// NewBlock allocates a block and returns it zeroed and write-locked.
func (t *TM) NewBlock(v *block.Validator) (*block.Block, error) {
	loc, err := t.sm.NewBlock()
	if err != nil {
		return nil, err
	}
	b, err := t.bm.WriteLockZero(loc, v)
	if err != nil {
		return nil, err
	}
	t.shadows[loc] = struct{}{}
	return b, nil
}

// Shadow returns a write-locked block with orig's contents that may be
// changed: orig itself if it was made in this transaction and is not
// shared, otherwise a copy in a new block, and orig loses a reference.
// shared says orig had more than one reference: then the caller must add
// a reference to everything the copy points to.
func (t *TM) Shadow(orig uint64, v *block.Validator) (b *block.Block, shared bool, err error) {
	c, err := t.sm.Count(orig)
	if err != nil {
		return nil, false, err
	}
	shared = c > 1
	if _, ok := t.shadows[orig]; ok && !shared {
		b, err = t.bm.WriteLock(orig, v)
		return b, false, err
	}
	ob, err := t.bm.ReadLock(orig, v)
	if err != nil {
		return nil, false, err
	}
	defer t.bm.Unlock(ob)
	loc, err := t.sm.NewBlock()
	if err != nil {
		return nil, false, err
	}
	if err := t.sm.Dec(orig); err != nil {
		return nil, false, err
	}
	b, err = t.bm.WriteLockZero(loc, v)
	if err != nil {
		return nil, false, err
	}
	copy(b.Data(), ob.Data())
	t.shadows[loc] = struct{}{}
	return b, shared, nil
}

// IsShadow says whether loc was made or shadowed in this transaction.
func (t *TM) IsShadow(loc uint64) bool {
	_, ok := t.shadows[loc]
	return ok
}

// ReadLock returns loc locked for reading.
func (t *TM) ReadLock(loc uint64, v *block.Validator) (*block.Block, error) {
	return t.bm.ReadLock(loc, v)
}

// Unlock releases a block.
func (t *TM) Unlock(b *block.Block) { t.bm.Unlock(b) }

// Inc adds a reference to loc.
func (t *TM) Inc(loc uint64) error { return t.sm.Inc(loc) }

// Dec drops a reference to loc.
func (t *TM) Dec(loc uint64) error { return t.sm.Dec(loc) }

// Count is loc's reference count.
func (t *TM) Count(loc uint64) (uint32, error) { return t.sm.Count(loc) }

// Commit ends the transaction: every block becomes committed.
func (t *TM) Commit() { clear(t.shadows) }
