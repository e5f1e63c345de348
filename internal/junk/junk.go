// Package junk draws the bytes a lost or torn write leaves where a model
// says "garbage": the same bytes for the same seed and offset, whatever
// read or write asks for them, so that a state or a cut rebuilt from its
// seed reads the same.
package junk

import (
	"encoding/binary"
	"math/rand/v2"
)

// sector is the size of the pieces drawn apart.
const sector = 512

// Fill fills p, the bytes from offset off, with the junk of seed: the
// 512-byte sector s holds the little-endian words of a PCG generator
// seeded with seed and s.
func Fill(p []byte, seed uint64, off int64) {
	var w [sector]byte
	for len(p) > 0 {
		s := off / sector
		r := rand.New(rand.NewPCG(seed, uint64(s)))
		for i := 0; i < sector; i += 8 {
			binary.LittleEndian.PutUint64(w[i:], r.Uint64())
		}
		n := copy(p, w[off-s*sector:])
		p, off = p[n:], off+int64(n)
	}
}
