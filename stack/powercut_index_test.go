package stack

import (
	"math/rand/v2"
	"testing"
)

// TestPowercutIndexForms: the slice index of a small target and the map
// index of a large one map every byte to the same entry as a byte-by-byte
// model, through puts, clears of one entry, clears of a range and resets.
func TestPowercutIndexForms(t *testing.T) {
	const size = 8 << pcChunkShift
	for _, length := range []int64{size, (pcFlatChunks + 1) << pcChunkShift} {
		var x pcIndex
		x.init(length)
		if (x.flat != nil) != (length == size) {
			t.Fatalf("length %d: flat %v", length, x.flat != nil)
		}
		model := make([]*pcEntry, size)
		var ents []*pcEntry // put, oldest first
		rng := rand.New(rand.NewPCG(1, 2))
		check := func(step int) {
			t.Helper()
			for ck := int64(0); ck < size>>pcChunkShift; ck++ {
				c := x.get(ck)
				pos := ck << pcChunkShift
				if c != nil {
					for _, ex := range c.ext {
						for ; pos < ex.off; pos++ {
							if model[pos] != nil {
								t.Fatalf("length %d step %d: byte %d not indexed", length, step, pos)
							}
						}
						for ; pos < ex.end; pos++ {
							if model[pos] != ex.e {
								t.Fatalf("length %d step %d: byte %d maps to the wrong entry", length, step, pos)
							}
						}
					}
				}
				for ; pos < (ck+1)<<pcChunkShift; pos++ {
					if model[pos] != nil {
						t.Fatalf("length %d step %d: byte %d not indexed", length, step, pos)
					}
				}
			}
		}
		for step := range 2000 {
			off := rng.Int64N(size)
			end := min(size, off+1+rng.Int64N(3<<pcChunkShift/2))
			switch r := rng.IntN(100); {
			case r < 60:
				e := &pcEntry{kind: pcWrite, off: off, end: end}
				ents = append(ents, e)
				x.put(off, end, e)
				for i := off; i < end; i++ {
					model[i] = e
				}
			case r < 85 && len(ents) > 0:
				// As a write-back drops an entry: its whole range.
				e := ents[0]
				ents = ents[1:]
				x.clear(e.off, e.end, e)
				for i := e.off; i < e.end; i++ {
					if model[i] == e {
						model[i] = nil
					}
				}
			case r < 99:
				x.clear(off, end, nil)
				clear(model[off:end])
			case r == 99:
				x.reset()
				clear(model)
				ents = nil
			}
			if step%150 == 0 {
				check(step)
			}
		}
		check(-1)
	}
}
