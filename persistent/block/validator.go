package block

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/dmfuse/dmfuse/persistent"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the kernel's dm_bm_checksum of a block's bytes 4..end:
// crc32c seeded with ~0 and not inverted at the end, XOR the salt.
func Checksum(b []byte, salt uint32) uint32 {
	return crc32.Checksum(b[4:], castagnoli) ^ 0xffffffff ^ salt
}

// Validator seals a block before it is written (its own location at
// offset 8, then the checksum at offset 0) and checks it when it is read,
// as the kernel's dm_block_validator does for each kind of block.
type Validator struct {
	// Name is the kind's name in error messages.
	Name string
	// Salt is the checksum XOR of the kind.
	Salt uint32
	// Check, if set, runs further checks after the checksum.
	Check func(b []byte, loc uint64) error
}

// The kinds of metadata block and their checksum salts.
const (
	SuperblockSalt = 160774
	NodeSalt       = 121107
	BitmapSalt     = 240779
	IndexSalt      = 160478
)

// Superblock, Bitmap and Index are the validators of the superblock, the
// space-map bitmaps and the metadata space-map index. The btree package
// defines the node validator, whose checks know the node layout.
var (
	Superblock = &Validator{Name: "superblock", Salt: SuperblockSalt, Check: checkMagic}
	Bitmap     = &Validator{Name: "bitmap", Salt: BitmapSalt}
	Index      = &Validator{Name: "index", Salt: IndexSalt}
)

// Magic is the thin-pool superblock magic.
const Magic = 27022010

func checkMagic(b []byte, loc uint64) error {
	if m := binary.LittleEndian.Uint64(b[32:]); m != Magic {
		return persistent.Corruptf("block %d: superblock magic %d, want %d", loc, m, Magic)
	}
	return nil
}

// Prepare stores loc and the checksum in b.
func (v *Validator) Prepare(b []byte, loc uint64) {
	binary.LittleEndian.PutUint64(b[8:], loc)
	binary.LittleEndian.PutUint32(b[0:], Checksum(b, v.Salt))
}

// Verify checks a block read from loc.
func (v *Validator) Verify(b []byte, loc uint64) error {
	if got := binary.LittleEndian.Uint64(b[8:]); got != loc {
		return persistent.Corruptf("%s block %d: it says it is block %d", v.Name, loc, got)
	}
	if sum, want := binary.LittleEndian.Uint32(b), Checksum(b, v.Salt); sum != want {
		return persistent.Corruptf("%s block %d: checksum %#08x, want %#08x", v.Name, loc, sum, want)
	}
	if v.Check != nil {
		return v.Check(b, loc)
	}
	return nil
}
