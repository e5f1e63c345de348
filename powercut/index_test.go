package powercut

import (
	"math/rand/v2"
	"testing"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
)

// TestPowercutIndexForms: the slice index of a small target and the map
// index of a large one map every byte to the same entry as a byte-by-byte
// model, through puts, clears of one entry, clears of a range and resets.
func TestPowercutIndexForms(t *testing.T) {
	const size = 8 << chunkShift
	for _, length := range []int64{size, (flatChunks + 1) << chunkShift} {
		var x index
		x.init(length)
		if (x.flat != nil) != (length == size) {
			t.Fatalf("length %d: flat %v", length, x.flat != nil)
		}
		model := make([]*entry, size)
		var ents []*entry // put, oldest first
		rng := rand.New(rand.NewPCG(1, 2))
		check := func(step int) {
			t.Helper()
			for ck := int64(0); ck < size>>chunkShift; ck++ {
				c := x.get(ck)
				pos := ck << chunkShift
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
				for ; pos < (ck+1)<<chunkShift; pos++ {
					if model[pos] != nil {
						t.Fatalf("length %d step %d: byte %d not indexed", length, step, pos)
					}
				}
			}
		}
		for step := range 2000 {
			off := rng.Int64N(size)
			end := min(size, off+1+rng.Int64N(3<<chunkShift/2))
			switch r := rng.IntN(100); {
			case r < 60:
				e := &entry{kind: ioop.Write, off: off, end: end}
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

// BenchmarkPowercutIndex measures what the index does per 4 KiB write into a
// full 32 MiB cache over a 1 GiB target (8192 entries at random offsets):
// the oldest entry leaves it, the new one goes in. "slice" is the index of
// such a target; "map" the form of a target over 16 GiB, on the same
// offsets.
func BenchmarkPowercutIndex(b *testing.B) {
	for _, form := range []struct {
		name   string
		length int64
	}{{"slice", 1 << 30}, {"map", (flatChunks + 1) << chunkShift}} {
		b.Run(form.name, func(b *testing.B) {
			var x index
			x.init(form.length)
			const n = 8192
			ring := make([]entry, n)
			rng := rand.New(rand.NewPCG(3, 4))
			put := func(e *entry) {
				e.off = rng.Int64N(1<<30/4096) * 4096
				e.end = e.off + 4096
				x.put(e.off, e.end, e)
			}
			for i := range ring {
				put(&ring[i])
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				e := &ring[i%n]
				x.clear(e.off, e.end, e)
				put(e)
			}
		})
	}
}

// TestPowercutStripeMask: the stripes of a range are those of its chunks,
// against a loop over them.
func TestPowercutStripeMask(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		off := rng.Int64N(200 << chunkShift)
		end := off + 1 + rng.Int64N(int64(1+rng.IntN(100))<<chunkShift)
		var want uint64
		for ck := off >> chunkShift; ck<<chunkShift < end; ck++ {
			want |= 1 << (ck % numStripes)
		}
		if got := stripeMask(off, end); got != want {
			t.Fatalf("[%d, %d): mask %#x, want %#x", off, end, got, want)
		}
	}
}

// Settle waits until the destager of powercut target t is idle, so
// that what it writes back is on the device.
func Settle(t stack.Target) {
	p := t.(*powercut)
	p.room.Lock()
	p.idleLocked()
	p.room.Unlock()
}
