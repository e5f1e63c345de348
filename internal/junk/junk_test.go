package junk

import (
	"bytes"
	"testing"
)

// TestFill: the junk of a range is the same read whole or in pieces at any
// offsets, depends on the seed, and is not zeros.
func TestFill(t *testing.T) {
	whole := make([]byte, 3000)
	Fill(whole, 7, 100)
	pieces := make([]byte, 3000)
	for _, cut := range [][2]int{{0, 1}, {1, 413}, {413, 412 + 512}, {924, 3000}} {
		Fill(pieces[cut[0]:cut[1]], 7, int64(100+cut[0]))
	}
	if !bytes.Equal(whole, pieces) {
		t.Error("the junk of a range read in pieces differs from it read whole")
	}
	other := make([]byte, 3000)
	Fill(other, 8, 100)
	if bytes.Equal(whole, other) {
		t.Error("seeds 7 and 8 drew the same junk")
	}
	if bytes.Contains(whole, make([]byte, 64)) {
		t.Error("64 zero bytes in a row of junk")
	}
}
