package snapshot

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// FuzzReadStore: ReadStore never panics on any COW image, and what it
// accepts has a valid chunk size and chunk numbers of 56 bits (the
// kernel's DM_CHUNK_NUMBER_BITS: an entry whose high bits alone are set is
// no terminator, and maps to chunk 0, as in the kernel).
func FuzzReadStore(f *testing.F) {
	f.Add(kernelCOW(8, 64<<10, []uint64{5, 9}, nil))
	f.Add(kernelCOW(1, 8<<10, []uint64{1, 2, 3}, nil))
	f.Add(make([]byte, 4096))
	f.Fuzz(func(t *testing.T, img []byte) {
		st, err := ReadStore(bytes.NewReader(img), int64(len(img)))
		if err != nil {
			return
		}
		if st.Chunk != 0 && chunkProblem(st.Chunk, 512) != "" {
			t.Fatalf("accepted chunk %d", st.Chunk)
		}
		for _, e := range st.Exceptions {
			if e.New >= 1<<56 {
				t.Fatalf("a chunk number of more than 56 bits: %+v", e)
			}
		}
	})
}

// FuzzLoad: a snapshot table over a COW of any content, with any store
// arguments, loads or is refused without a panic; a refused load leaves a
// COW that held a store unchanged, and a loaded one reads and writes.
func FuzzLoad(f *testing.F) {
	f.Add(kernelCOW(8, 64<<10, []uint64{5, 9}, nil), "P", "8")
	f.Add(make([]byte, 64<<10), "PO", "0")
	f.Add(make([]byte, 4096), "N", "16")
	f.Fuzz(func(t *testing.T, img []byte, typ, chunk string) {
		if len(img) > 1<<20 || len(img) < 512 {
			return
		}
		img = img[:len(img)&^511]
		origin := stacktest.NewMemDevice("o", 1<<20)
		cow := stacktest.NewMemDevice("c", int64(len(img)))
		cow.WriteAt(context.Background(), img, 0)
		open := stacktest.Opener{"o": origin, "c": cow}
		lines, err := stack.ParseTable("0 2048 snapshot o c " + stack.EscapeArg(typ) + " " + stack.EscapeArg(chunk))
		if err != nil {
			return
		}
		tb, err := stack.Build(lines, stack.BuildOptions{Registry: mustRegistry(t), Clock: &clock.Manual{}, Context: context.Background(), Open: open.Open})
		if err != nil {
			if len(img) >= 4 && binary.LittleEndian.Uint32(img) != 0 && !bytes.Equal(memBytes(t, cow), img) {
				t.Fatal("a refused load changed a COW that held a store")
			}
			return
		}
		defer tb.Close()
		tb.Format(stack.StatusInfo)
		tb.Format(stack.StatusTable)
		tg, _, err := tb.TargetAt(0)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, 4096)
		tg.ReadAt(context.Background(), p, 0)
		tg.WriteAt(context.Background(), p, 8192)
	})
}

func mustRegistry(t *testing.T) *stack.Registry {
	reg, err := stack.NewRegistry(Type, OriginType, MergeType)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
