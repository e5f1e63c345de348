// Package sm holds the kernel's two space maps
// (dm-space-map-common, -disk and -metadata): reference counts of 2 bits
// per block in bitmap blocks, an overflow btree for counts of 3 and more,
// and an index of the bitmaps (a btree for the data space map, one index
// block for the metadata space map).
//
// The data space map works on disk through the transaction manager, its
// bitmaps shadowed like any other block. The metadata space map counts
// the blocks that the transaction manager itself allocates, including its
// own, so it keeps its counts in memory (one byte a block) and lays out
// its bitmaps, index block and overflow tree at commit, repeating until
// laying them out allocates nothing more: the fixpoint that the kernel
// reaches with its bootstrap allocator and deferred operations.
package sm

import (
	"encoding/binary"
	"math/bits"

	"github.com/dmfuse/dmfuse/persistent/block"
)

var le = binary.LittleEndian

// EntriesPerBlock is the number of 2-bit counts in a bitmap block.
const EntriesPerBlock = (block.Size - 16) * 4

// MaxMetadataBitmaps is the number of entries of the metadata index
// block, which bounds the metadata device.
const MaxMetadataBitmaps = 255

// MaxMetadataBlocks is the largest metadata space map.
const MaxMetadataBlocks = MaxMetadataBitmaps * EntriesPerBlock

// RootSize is the size of a packed space-map root.
const RootSize = 32

// Root is a space map's root (struct disk_sm_root).
type Root struct {
	NrBlocks, NrAllocated, BitmapRoot, RefCountRoot uint64
}

// Pack stores r in b.
func (r Root) Pack(b []byte) {
	le.PutUint64(b[0:], r.NrBlocks)
	le.PutUint64(b[8:], r.NrAllocated)
	le.PutUint64(b[16:], r.BitmapRoot)
	le.PutUint64(b[24:], r.RefCountRoot)
}

// UnpackRoot reads a root.
func UnpackRoot(b []byte) Root {
	return Root{le.Uint64(b[0:]), le.Uint64(b[8:]), le.Uint64(b[16:]), le.Uint64(b[24:])}
}

// IndexEntry describes one bitmap (struct disk_index_entry).
type IndexEntry struct {
	Blocknr        uint64
	NrFree         uint32
	NoneFreeBefore uint32
}

// IndexEntrySize is a packed index entry's size.
const IndexEntrySize = 16

func (e IndexEntry) pack(b []byte) {
	le.PutUint64(b[0:], e.Blocknr)
	le.PutUint32(b[8:], e.NrFree)
	le.PutUint32(b[12:], e.NoneFreeBefore)
}

func unpackIE(b []byte) IndexEntry {
	return IndexEntry{le.Uint64(b[0:]), le.Uint32(b[8:]), le.Uint32(b[12:])}
}

// bitmapGet returns entry i of a bitmap block: bit 2j of its word has
// weight 2, bit 2j+1 weight 1 (sm_lookup_bitmap).
func bitmapGet(data []byte, i int) uint32 {
	w := le.Uint64(data[16+8*(i/32):])
	j := uint(i%32) * 2
	return uint32((w>>j)&1)<<1 | uint32((w>>(j+1))&1)
}

func bitmapSet(data []byte, i int, v uint32) {
	off := 16 + 8*(i/32)
	w := le.Uint64(data[off:])
	j := uint(i%32) * 2
	w &^= 3 << j
	w |= uint64(v>>1&1)<<j | uint64(v&1)<<(j+1)
	le.PutUint64(data[off:], w)
}

// bitmapFindFree returns the first entry in [from, to) that is 0, or -1.
func bitmapFindFree(data []byte, from, to int) int {
	for i := from; i < to; {
		if i%32 == 0 && i+32 <= to {
			w := le.Uint64(data[16+8*(i/32):])
			free := ^(w | w>>1) & 0x5555555555555555
			if free == 0 {
				i += 32
				continue
			}
			return i + bits.TrailingZeros64(free)/2
		}
		if bitmapGet(data, i) == 0 {
			return i
		}
		i++
	}
	return -1
}

func le32(v uint32) []byte {
	var b [4]byte
	le.PutUint32(b[:], v)
	return b[:]
}
