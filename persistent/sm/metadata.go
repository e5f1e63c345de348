package sm

import (
	"fmt"
	"slices"

	"github.com/dmfuse/dmfuse/persistent"
	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/btree"
	"github.com/dmfuse/dmfuse/persistent/tm"
)

// refValueType is the overflow tree's value: a plain le32 count.
var refValueType = btree.ValueType{Size: 4}

const bigCount = 255 // counts[b] == bigCount: the count is in big

// Metadata is the metadata space map.
type Metadata struct {
	tm      *tm.TM
	refInfo btree.Info

	nrBlocks    uint64
	counts      []uint8
	big         map[uint64]uint32
	used        []uint64 // bit b: b's count was > 0 at the last commit
	nrAllocated uint64
	cursor      uint64

	indexLoc      uint64
	bitmaps       []uint64
	ies           []IndexEntry
	refRoot       uint64
	dirty         []bool // bitmap's counts changed in this transaction
	shadowed      []bool // bitmap written to a new block in this transaction
	indexShadowed bool
	bigDirty      map[uint64]struct{}
	touched       []uint64 // blocks whose count left or reached 0
}

func nrBitmaps(nrBlocks uint64) int {
	return int((nrBlocks + EntriesPerBlock - 1) / EntriesPerBlock)
}

func newMetadata(nrBlocks uint64) (*Metadata, error) {
	if nrBlocks > MaxMetadataBlocks {
		return nil, fmt.Errorf("metadata space map of %d blocks: more than %d", nrBlocks, MaxMetadataBlocks)
	}
	n := nrBitmaps(nrBlocks)
	return &Metadata{
		refInfo:  btree.Info{VT: refValueType},
		nrBlocks: nrBlocks,
		counts:   make([]uint8, nrBlocks),
		big:      make(map[uint64]uint32),
		used:     make([]uint64, (nrBlocks+63)/64),
		bitmaps:  make([]uint64, n),
		ies:      make([]IndexEntry, n),
		dirty:    make([]bool, n),
		shadowed: make([]bool, n),
		bigDirty: make(map[uint64]struct{}),
	}, nil
}

// NewMetadata returns the space map of a new metadata device of nrBlocks
// blocks, with the superblock (block 0) counted. Call Init with the
// transaction manager that allocates through it.
func NewMetadata(nrBlocks uint64) (*Metadata, error) {
	m, err := newMetadata(nrBlocks)
	if err != nil {
		return nil, err
	}
	for i := range m.dirty {
		m.dirty[i] = true
	}
	if nrBlocks > 0 {
		m.set(0, 1)
	}
	m.cursor = 1
	return m, nil
}

// Init attaches the transaction manager and makes the empty overflow
// tree.
func (m *Metadata) Init(t *tm.TM) error {
	m.tm = t
	m.refInfo.TM = t
	r, err := btree.Empty(&m.refInfo)
	m.refRoot = r
	return err
}

// OpenMetadata reads the metadata space map from its root, checking its
// index block, bitmaps and overflow tree.
func OpenMetadata(t *tm.TM, root Root) (*Metadata, error) {
	m, err := newMetadata(root.NrBlocks)
	if err != nil {
		return nil, persistent.Corruptf("%v", err)
	}
	m.tm, m.refInfo.TM = t, t
	m.indexLoc, m.refRoot = root.BitmapRoot, root.RefCountRoot
	ib, err := t.ReadLock(root.BitmapRoot, block.Index)
	if err != nil {
		return nil, err
	}
	idx := ib.Data()
	for i := range m.bitmaps {
		m.ies[i] = unpackIE(idx[16+IndexEntrySize*i:])
	}
	t.Unlock(ib)
	var threes int
	for i, ie := range m.ies {
		if ie.Blocknr == 0 || ie.Blocknr >= root.NrBlocks {
			return nil, persistent.Corruptf("metadata index entry %d: bitmap block %d out of range", i, ie.Blocknr)
		}
		m.bitmaps[i] = ie.Blocknr
		bb, err := t.ReadLock(ie.Blocknr, block.Bitmap)
		if err != nil {
			return nil, err
		}
		base := uint64(i) * EntriesPerBlock
		for j := 0; j < EntriesPerBlock && base+uint64(j) < m.nrBlocks; j++ {
			c := bitmapGet(bb.Data(), j)
			m.counts[base+uint64(j)] = uint8(c)
			if c == 3 {
				threes++
			}
		}
		t.Unlock(bb)
	}
	err = btree.Walk(&m.refInfo, m.refRoot, func(k uint64, v []byte) error {
		c := le.Uint32(v)
		if k >= m.nrBlocks || m.counts[k] != 3 || c < 3 {
			return persistent.Corruptf("metadata overflow count %d for block %d", c, k)
		}
		m.counts[k] = 0
		m.set(k, c)
		threes--
		return nil
	})
	if err != nil {
		return nil, err
	}
	if threes != 0 {
		return nil, persistent.Corruptf("metadata space map: %d counts of 3 or more missing from the overflow tree", threes)
	}
	clear(m.bigDirty)
	m.nrAllocated = 0
	for b := uint64(0); b < m.nrBlocks; b++ {
		if m.counts[b] != 0 {
			m.used[b/64] |= 1 << (b % 64)
			m.nrAllocated++
		}
	}
	clear(m.dirty)
	m.touched = m.touched[:0]
	return m, nil
}

// Count is b's reference count.
func (m *Metadata) Count(b uint64) (uint32, error) {
	if b >= m.nrBlocks {
		return 0, persistent.Corruptf("metadata block %d out of range (%d blocks)", b, m.nrBlocks)
	}
	return m.count(b), nil
}

func (m *Metadata) count(b uint64) uint32 {
	if c := m.counts[b]; c != bigCount {
		return uint32(c)
	}
	return m.big[b]
}

func (m *Metadata) set(b uint64, c uint32) {
	old := m.count(b)
	if c >= bigCount {
		m.counts[b] = bigCount
		m.big[b] = c
	} else {
		m.counts[b] = uint8(c)
		delete(m.big, b)
	}
	if old >= 3 || c >= 3 {
		m.bigDirty[b] = struct{}{}
	}
	if (old == 0) != (c == 0) {
		if c == 0 {
			m.nrAllocated--
		} else {
			m.nrAllocated++
		}
		m.touched = append(m.touched, b)
	}
	m.dirty[b/EntriesPerBlock] = true
}

// Inc adds a reference to b.
func (m *Metadata) Inc(b uint64) error {
	c, err := m.Count(b)
	if err != nil {
		return err
	}
	m.set(b, c+1)
	return nil
}

// Dec drops a reference to b.
func (m *Metadata) Dec(b uint64) error {
	c, err := m.Count(b)
	if err != nil {
		return err
	}
	if c == 0 {
		return persistent.Corruptf("metadata block %d: reference dropped below 0", b)
	}
	m.set(b, c-1)
	return nil
}

func (m *Metadata) allocatable(b uint64) bool {
	return m.counts[b] == 0 && m.used[b/64]&(1<<(b%64)) == 0
}

// NewBlock allocates a block free now and at the last commit.
func (m *Metadata) NewBlock() (uint64, error) {
	for pass := 0; pass < 2; pass++ {
		begin, end := m.cursor, m.nrBlocks
		if pass == 1 {
			begin, end = 0, min(m.cursor, m.nrBlocks)
		}
		for b := begin; b < end; b++ {
			if b%64 == 0 && b+64 <= end && m.used[b/64] == ^uint64(0) {
				b += 63 // all 64 were in use at the last commit
				continue
			}
			if m.allocatable(b) {
				m.set(b, 1)
				m.cursor = b + 1
				return b, nil
			}
		}
	}
	return 0, fmt.Errorf("metadata space map of %d blocks: %w", m.nrBlocks, persistent.ErrNoMetadataSpace)
}

// NrBlocks and NrFree are the size and the blocks with no reference.
func (m *Metadata) NrBlocks() uint64 { return m.nrBlocks }

// NrFree is the number of blocks with no reference.
func (m *Metadata) NrFree() uint64 { return m.nrBlocks - m.nrAllocated }

// Extend grows the map to nrBlocks; the new bitmaps are laid out at the
// next commit.
func (m *Metadata) Extend(nrBlocks uint64) error {
	if nrBlocks < m.nrBlocks {
		return fmt.Errorf("metadata space map cannot shrink from %d to %d blocks", m.nrBlocks, nrBlocks)
	}
	if nrBlocks > MaxMetadataBlocks {
		return fmt.Errorf("metadata space map of %d blocks: more than %d", nrBlocks, MaxMetadataBlocks)
	}
	m.counts = append(m.counts, make([]uint8, nrBlocks-m.nrBlocks)...)
	for uint64(len(m.used))*64 < nrBlocks {
		m.used = append(m.used, 0)
	}
	for n := nrBitmaps(nrBlocks); len(m.bitmaps) < n; {
		m.bitmaps = append(m.bitmaps, 0)
		m.ies = append(m.ies, IndexEntry{})
		m.dirty = append(m.dirty, true)
		m.shadowed = append(m.shadowed, false)
	}
	m.nrBlocks = nrBlocks
	return nil
}

// Changed says whether any count changed since the last commit.
func (m *Metadata) Changed() bool {
	return slices.Contains(m.dirty, true) || len(m.bigDirty) > 0 || m.indexLoc == 0
}

// Commit lays out the overflow tree, the bitmaps and the index block for
// the current counts: each dirty bitmap and the index block move to a new
// block, which changes counts again, until nothing more moves. The blocks
// are left dirty in the block manager. It returns the root to store in
// the superblock. Committed must follow once the superblock is durable.
func (m *Metadata) Commit() (Root, error) {
	if !m.Changed() {
		return m.Root(), nil
	}
	for {
		progress := false
		for len(m.bigDirty) > 0 {
			keys := make([]uint64, 0, len(m.bigDirty))
			for b := range m.bigDirty {
				keys = append(keys, b)
			}
			clear(m.bigDirty)
			slices.Sort(keys)
			for _, b := range keys {
				var err error
				if c := m.count(b); c >= 3 {
					m.refRoot, _, err = btree.Insert(&m.refInfo, m.refRoot, b, le32(c))
				} else {
					var r uint64
					switch r, err = btree.Remove(&m.refInfo, m.refRoot, b); err {
					case nil:
						m.refRoot = r
					case btree.ErrNotFound:
						err = nil
					}
				}
				if err != nil {
					return Root{}, err
				}
			}
			progress = true
		}
		for i := range m.bitmaps {
			if m.dirty[i] && !m.shadowed[i] {
				loc, err := m.NewBlock()
				if err != nil {
					return Root{}, err
				}
				if old := m.bitmaps[i]; old != 0 {
					if err := m.Dec(old); err != nil {
						return Root{}, err
					}
				}
				m.bitmaps[i], m.shadowed[i] = loc, true
				progress = true
			}
		}
		if !m.indexShadowed {
			loc, err := m.NewBlock()
			if err != nil {
				return Root{}, err
			}
			if m.indexLoc != 0 {
				if err := m.Dec(m.indexLoc); err != nil {
					return Root{}, err
				}
			}
			m.indexLoc, m.indexShadowed = loc, true
			progress = true
		}
		if !progress {
			break
		}
	}
	bm := m.tm.BM()
	for i, loc := range m.bitmaps {
		if !m.shadowed[i] {
			continue
		}
		b, err := bm.WriteLockZero(loc, block.Bitmap)
		if err != nil {
			return Root{}, err
		}
		base := uint64(i) * EntriesPerBlock
		ie := IndexEntry{Blocknr: loc, NrFree: EntriesPerBlock, NoneFreeBefore: EntriesPerBlock}
		for j := 0; j < EntriesPerBlock; j++ {
			c := uint32(0)
			if base+uint64(j) < m.nrBlocks {
				c = min(m.count(base+uint64(j)), 3)
			}
			if c != 0 {
				bitmapSet(b.Data(), j, c)
				ie.NrFree--
			} else if ie.NoneFreeBefore == EntriesPerBlock {
				ie.NoneFreeBefore = uint32(j)
			}
		}
		m.ies[i] = ie
		bm.Unlock(b)
	}
	ib, err := bm.WriteLockZero(m.indexLoc, block.Index)
	if err != nil {
		return Root{}, err
	}
	for i, ie := range m.ies {
		ie.pack(ib.Data()[16+IndexEntrySize*i:])
	}
	bm.Unlock(ib)
	return m.Root(), nil
}

// Root is the map's root as of the last Commit.
func (m *Metadata) Root() Root {
	return Root{NrBlocks: m.nrBlocks, NrAllocated: m.nrAllocated, BitmapRoot: m.indexLoc, RefCountRoot: m.refRoot}
}

// Committed starts a new transaction after a durable commit: blocks freed
// in the last one become allocatable.
func (m *Metadata) Committed() {
	for _, b := range m.touched {
		if m.counts[b] != 0 {
			m.used[b/64] |= 1 << (b % 64)
		} else {
			m.used[b/64] &^= 1 << (b % 64)
		}
	}
	m.touched = m.touched[:0]
	clear(m.dirty)
	clear(m.shadowed)
	m.indexShadowed = false
}
