package metadata

import (
	"testing"

	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/sm"
)

// TestSuperblockGolden packs the superblock of a kernel-formatted pool of
// 1024 metadata blocks and block size 128 and checks its checksum against
// the value derived from the kernel's layout, then reads it back.
func TestSuperblockGolden(t *testing.T) {
	sb := superblock{
		magic:             block.Magic,
		version:           thinVersion,
		dataSM:            sm.Root{NrBlocks: 0, NrAllocated: 0, BitmapRoot: 4, RefCountRoot: 5},
		metaSM:            sm.Root{NrBlocks: 1024, NrAllocated: 8, BitmapRoot: 1, RefCountRoot: 2},
		mappingRoot:       6,
		detailsRoot:       7,
		dataBlockSize:     128,
		metadataBlockSize: metadataBlockSize,
		metadataNrBlocks:  1024,
	}
	b := make([]byte, block.Size)
	sb.pack(b)
	block.Superblock.Prepare(b, 0)
	if got := le.Uint32(b); got != 0xcaff9186 {
		t.Fatalf("superblock csum %#08x, want 0xcaff9186", got)
	}
	if err := block.Superblock.Verify(b, 0); err != nil {
		t.Fatal(err)
	}
	back := unpackSuperblock(b)
	back.csum = 0
	if back != sb {
		t.Errorf("read back %+v, wrote %+v", back, sb)
	}
	var d [detailsSize]byte
	want := deviceDetails{mappedBlocks: 3, transactionID: 5, creationTime: 1, snapshottedTime: 1}
	want.pack(d[:])
	if got := unpackDetails(d[:]); got != want || d[16] != 1 || d[8] != 5 || d[0] != 3 {
		t.Errorf("details %+v packed as % x", got, d)
	}
	if v := packBlockTime(21, 1); v != 352321537 {
		t.Errorf("block 21 at time 1 packs as %d, want 352321537", v)
	}
}
