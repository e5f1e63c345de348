package sm

import (
	"fmt"
	"slices"

	"github.com/dmfuse/dmfuse/persistent"
	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/btree"
	"github.com/dmfuse/dmfuse/persistent/tm"
)

// MaxDataBlocks bounds the data space map: a mapping keeps 40 bits of
// data block.
const MaxDataBlocks = 1 << 40

// Disk is the data space map, kept on metadata blocks: an index btree of
// bitmaps and an overflow tree.
type Disk struct {
	tm      *tm.TM
	idxInfo btree.Info
	refInfo btree.Info

	nrBlocks, nrAllocated uint64
	indexRoot, refRoot    uint64
	old                   Root // the last committed root

	ies    map[uint64]IndexEntry // current entries read or changed
	dirty  map[uint64]bool
	oldIes map[uint64]IndexEntry
	cursor uint64
}

func newDisk(t *tm.TM) *Disk {
	return &Disk{
		tm:      t,
		idxInfo: btree.Info{TM: t, VT: btree.ValueType{Size: IndexEntrySize}},
		refInfo: btree.Info{TM: t, VT: refValueType},
		ies:     make(map[uint64]IndexEntry),
		dirty:   make(map[uint64]bool),
		oldIes:  make(map[uint64]IndexEntry),
	}
}

// NewDisk makes an empty data space map of nrBlocks blocks.
func NewDisk(t *tm.TM, nrBlocks uint64) (*Disk, error) {
	d := newDisk(t)
	var err error
	if d.indexRoot, err = btree.Empty(&d.idxInfo); err != nil {
		return nil, err
	}
	if d.refRoot, err = btree.Empty(&d.refInfo); err != nil {
		return nil, err
	}
	d.old = d.Root()
	return d, d.Extend(nrBlocks)
}

// OpenDisk opens the data space map at root, checking its index tree.
func OpenDisk(t *tm.TM, root Root) (*Disk, error) {
	d := newDisk(t)
	d.nrBlocks, d.nrAllocated = root.NrBlocks, root.NrAllocated
	d.indexRoot, d.refRoot = root.BitmapRoot, root.RefCountRoot
	d.old = root
	if root.NrBlocks > MaxDataBlocks {
		return nil, persistent.Corruptf("data space map of %d blocks", root.NrBlocks)
	}
	want := uint64(0)
	nrMeta := t.BM().NrBlocks()
	err := btree.Walk(&d.idxInfo, d.indexRoot, func(k uint64, v []byte) error {
		ie := unpackIE(v)
		if k != want || ie.Blocknr == 0 || ie.Blocknr >= nrMeta || ie.NrFree > EntriesPerBlock {
			return persistent.Corruptf("data space map index entry %d: bitmap %d, %d free", k, ie.Blocknr, ie.NrFree)
		}
		want++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if want != (root.NrBlocks+EntriesPerBlock-1)/EntriesPerBlock {
		return nil, persistent.Corruptf("data space map of %d blocks has %d bitmaps", root.NrBlocks, want)
	}
	if err := btree.Walk(&d.refInfo, d.refRoot, func(k uint64, v []byte) error {
		if k >= root.NrBlocks {
			return persistent.Corruptf("data overflow count for block %d out of range", k)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return d, nil
}

// Root is the map's current root (valid on disk after Commit).
func (d *Disk) Root() Root {
	return Root{NrBlocks: d.nrBlocks, NrAllocated: d.nrAllocated, BitmapRoot: d.indexRoot, RefCountRoot: d.refRoot}
}

// NrBlocks is the map's size.
func (d *Disk) NrBlocks() uint64 { return d.nrBlocks }

// NrFree is the number of blocks with no reference.
func (d *Disk) NrFree() uint64 { return d.nrBlocks - d.nrAllocated }

func (d *Disk) loadIE(i uint64) (IndexEntry, error) {
	if ie, ok := d.ies[i]; ok {
		return ie, nil
	}
	var v [IndexEntrySize]byte
	ok, err := btree.Lookup(&d.idxInfo, d.indexRoot, i, v[:])
	if err != nil {
		return IndexEntry{}, err
	}
	if !ok {
		return IndexEntry{}, persistent.Corruptf("data space map: no index entry for bitmap %d", i)
	}
	ie := unpackIE(v[:])
	d.ies[i] = ie
	return ie, nil
}

func (d *Disk) oldIE(i uint64) (IndexEntry, error) {
	if ie, ok := d.oldIes[i]; ok {
		return ie, nil
	}
	var v [IndexEntrySize]byte
	ok, err := btree.Lookup(&d.idxInfo, d.old.BitmapRoot, i, v[:])
	if err != nil {
		return IndexEntry{}, err
	}
	if !ok {
		return IndexEntry{}, persistent.Corruptf("committed data space map: no index entry for bitmap %d", i)
	}
	ie := unpackIE(v[:])
	d.oldIes[i] = ie
	return ie, nil
}

func (d *Disk) bigCount(root, b uint64) (uint32, error) {
	var v [4]byte
	ok, err := btree.Lookup(&d.refInfo, root, b, v[:])
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, persistent.Corruptf("data block %d: count 3 missing from the overflow tree", b)
	}
	return le.Uint32(v[:]), nil
}

// Count is b's reference count.
func (d *Disk) Count(b uint64) (uint32, error) {
	if b >= d.nrBlocks {
		return 0, persistent.Corruptf("data block %d out of range (%d blocks)", b, d.nrBlocks)
	}
	ie, err := d.loadIE(b / EntriesPerBlock)
	if err != nil {
		return 0, err
	}
	bb, err := d.tm.ReadLock(ie.Blocknr, block.Bitmap)
	if err != nil {
		return 0, err
	}
	c := bitmapGet(bb.Data(), int(b%EntriesPerBlock))
	d.tm.Unlock(bb)
	if c == 3 {
		return d.bigCount(d.refRoot, b)
	}
	return c, nil
}

// oldFree says whether b was free at the last commit.
func (d *Disk) oldFree(b uint64, cur IndexEntry) (bool, error) {
	if b >= d.old.NrBlocks {
		return true, nil
	}
	ie, err := d.oldIE(b / EntriesPerBlock)
	if err != nil {
		return false, err
	}
	if ie.Blocknr == cur.Blocknr {
		return true, nil // the bitmap is unchanged and b is free in it
	}
	bb, err := d.tm.ReadLock(ie.Blocknr, block.Bitmap)
	if err != nil {
		return false, err
	}
	c := bitmapGet(bb.Data(), int(b%EntriesPerBlock))
	d.tm.Unlock(bb)
	return c == 0, nil
}

// mutate adds delta to b's count.
func (d *Disk) mutate(b uint64, delta int) error {
	if b >= d.nrBlocks {
		return persistent.Corruptf("data block %d out of range (%d blocks)", b, d.nrBlocks)
	}
	i := b / EntriesPerBlock
	ie, err := d.loadIE(i)
	if err != nil {
		return err
	}
	bb, _, err := d.tm.Shadow(ie.Blocknr, block.Bitmap)
	if err != nil {
		return err
	}
	defer d.tm.Unlock(bb)
	ie.Blocknr = bb.Loc()
	j := int(b % EntriesPerBlock)
	old := bitmapGet(bb.Data(), j)
	if old == 3 {
		if old, err = d.bigCount(d.refRoot, b); err != nil {
			return err
		}
	}
	if delta < 0 && old == 0 {
		return persistent.Corruptf("data block %d: reference dropped below 0", b)
	}
	c := uint32(int64(old) + int64(delta))
	switch {
	case c >= 3:
		bitmapSet(bb.Data(), j, 3)
		d.refRoot, _, err = btree.Insert(&d.refInfo, d.refRoot, b, le32(c))
	case old >= 3:
		bitmapSet(bb.Data(), j, c)
		d.refRoot, err = btree.Remove(&d.refInfo, d.refRoot, b)
	default:
		bitmapSet(bb.Data(), j, c)
	}
	if err != nil {
		return err
	}
	if old == 0 && c > 0 {
		d.nrAllocated++
		ie.NrFree--
		if uint32(j) == ie.NoneFreeBefore {
			ie.NoneFreeBefore++
		}
	} else if old > 0 && c == 0 {
		d.nrAllocated--
		ie.NrFree++
		ie.NoneFreeBefore = min(ie.NoneFreeBefore, uint32(j))
	}
	d.ies[i] = ie
	d.dirty[i] = true
	return nil
}

// Inc adds a reference to b.
func (d *Disk) Inc(b uint64) error { return d.mutate(b, 1) }

// Dec drops a reference to b.
func (d *Disk) Dec(b uint64) error { return d.mutate(b, -1) }

// NewBlock allocates a block free now and at the last commit, searching
// from the block after the last allocation and wrapping once.
func (d *Disk) NewBlock() (uint64, error) {
	for pass := 0; pass < 2; pass++ {
		begin, end := d.cursor, d.nrBlocks
		if pass == 1 {
			begin, end = 0, min(d.cursor, d.nrBlocks)
		}
		b, ok, err := d.findFree(begin, end)
		if err != nil {
			return 0, err
		}
		if ok {
			if err := d.mutate(b, 1); err != nil {
				return 0, err
			}
			d.cursor = b + 1
			return b, nil
		}
	}
	return 0, fmt.Errorf("data space map: %w (%d blocks)", persistent.ErrNoSpace, d.nrBlocks)
}

func (d *Disk) findFree(begin, end uint64) (uint64, bool, error) {
	for begin < end {
		i := begin / EntriesPerBlock
		base := i * EntriesPerBlock
		next := min(base+EntriesPerBlock, end)
		ie, err := d.loadIE(i)
		if err != nil {
			return 0, false, err
		}
		if ie.NrFree > 0 {
			bb, err := d.tm.ReadLock(ie.Blocknr, block.Bitmap)
			if err != nil {
				return 0, false, err
			}
			from := max(int(begin-base), int(ie.NoneFreeBefore))
			to := int(next - base)
			for {
				j := bitmapFindFree(bb.Data(), from, to)
				if j < 0 {
					break
				}
				ok, err := d.oldFree(base+uint64(j), ie)
				if err != nil {
					d.tm.Unlock(bb)
					return 0, false, err
				}
				if ok {
					d.tm.Unlock(bb)
					return base + uint64(j), true, nil
				}
				from = j + 1
			}
			d.tm.Unlock(bb)
		}
		begin = next
	}
	return 0, false, nil
}

// Extend grows the map to nrBlocks, with zeroed new bitmaps.
func (d *Disk) Extend(nrBlocks uint64) error {
	if nrBlocks < d.nrBlocks {
		return fmt.Errorf("data space map cannot shrink from %d to %d blocks", d.nrBlocks, nrBlocks)
	}
	if nrBlocks > MaxDataBlocks {
		return fmt.Errorf("data space map of %d blocks: more than %d", nrBlocks, uint64(MaxDataBlocks))
	}
	have := (d.nrBlocks + EntriesPerBlock - 1) / EntriesPerBlock
	want := (nrBlocks + EntriesPerBlock - 1) / EntriesPerBlock
	for i := have; i < want; i++ {
		b, err := d.tm.NewBlock(block.Bitmap)
		if err != nil {
			return err
		}
		d.ies[i] = IndexEntry{Blocknr: b.Loc(), NrFree: EntriesPerBlock}
		d.dirty[i] = true
		d.tm.Unlock(b)
	}
	d.nrBlocks = nrBlocks
	return nil
}

// Commit writes the changed index entries into the index tree and makes
// the result the committed map that allocation checks against.
func (d *Disk) Commit() (Root, error) {
	keys := make([]uint64, 0, len(d.dirty))
	for i := range d.dirty {
		keys = append(keys, i)
	}
	slices.Sort(keys)
	var v [IndexEntrySize]byte
	for _, i := range keys {
		d.ies[i].pack(v[:])
		var err error
		if d.indexRoot, _, err = btree.Insert(&d.idxInfo, d.indexRoot, i, v[:]); err != nil {
			return Root{}, err
		}
	}
	clear(d.dirty)
	return d.Root(), nil
}

// Committed starts a new transaction after a durable commit.
func (d *Disk) Committed() {
	d.old = d.Root()
	clear(d.ies)
	clear(d.oldIes)
}
