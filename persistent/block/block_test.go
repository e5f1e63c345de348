package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/dmfuse/dmfuse/internal/memdev"
	"github.com/dmfuse/dmfuse/persistent"
)

// emptyLeaf is the kernel's empty btree leaf (dm_btree_empty).
func emptyLeaf(valueSize int) []byte {
	b := make([]byte, Size)
	binary.LittleEndian.PutUint32(b[4:], 2)
	n := (Size - 32) / (8 + valueSize)
	binary.LittleEndian.PutUint32(b[20:], uint32(3*(n/3)))
	binary.LittleEndian.PutUint32(b[24:], uint32(valueSize))
	return b
}

// TestChecksumGolden checks the seal of the blocks of a kernel-formatted
// pool of 1024 blocks (golden values derived from the kernel's code).
func TestChecksumGolden(t *testing.T) {
	node := &Validator{Name: "node", Salt: NodeSalt}
	for _, c := range []struct {
		loc       uint64
		valueSize int
		want      uint32
	}{{2, 4, 0xc360e452}, {4, 16, 0x787f52c8}, {5, 4, 0x41bfaa04}, {6, 8, 0xcb3dda35}, {7, 24, 0xb1c81346}} {
		b := emptyLeaf(c.valueSize)
		node.Prepare(b, c.loc)
		if got := binary.LittleEndian.Uint32(b); got != c.want {
			t.Errorf("empty leaf of %d-byte values at %d: csum %#08x, want %#08x", c.valueSize, c.loc, got, c.want)
		}
		if err := node.Verify(b, c.loc); err != nil {
			t.Error(err)
		}
	}
	bm := make([]byte, Size)
	binary.LittleEndian.PutUint64(bm[16:], 0xAAAA)
	Bitmap.Prepare(bm, 3)
	if got := binary.LittleEndian.Uint32(bm); got != 0xa19f6375 {
		t.Errorf("bitmap csum %#08x, want 0xa19f6375", got)
	}
	idx := make([]byte, Size)
	binary.LittleEndian.PutUint64(idx[16:], 3)
	binary.LittleEndian.PutUint32(idx[24:], 16312)
	binary.LittleEndian.PutUint32(idx[28:], 8)
	Index.Prepare(idx, 1)
	if got := binary.LittleEndian.Uint32(idx); got != 0x18e0660a {
		t.Errorf("index csum %#08x, want 0x18e0660a", got)
	}
}

func TestVerifyRejects(t *testing.T) {
	b := make([]byte, Size)
	Bitmap.Prepare(b, 9)
	if err := Bitmap.Verify(b, 10); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("wrong location: %v", err)
	}
	if err := Index.Verify(b, 9); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("wrong salt: %v", err)
	}
	b[2000] ^= 1
	if err := Bitmap.Verify(b, 9); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("flipped bit: %v", err)
	}
	Superblock.Prepare(b, 0)
	if err := Superblock.Verify(b, 0); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("superblock without magic: %v", err)
	}
}

func TestCacheBoundAndWriteBack(t *testing.T) {
	dev := memdev.New("meta", 256*4096)
	m := NewManager(dev, 8)
	for loc := uint64(0); loc < 100; loc++ {
		b, err := m.WriteLockZero(loc, Bitmap)
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(b.Data()[16:], loc*7)
		m.Unlock(b)
		if s := m.Stats(); s.Cached > 8 {
			t.Fatalf("%d blocks cached, bound 8", s.Cached)
		}
	}
	if s := m.Stats(); s.Writes < 90 || s.Evictions < 90 {
		t.Errorf("stats %+v: evicted dirty blocks not written", s)
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	// A fresh manager reads every block back, checked.
	m2 := NewManager(dev, 4)
	for loc := uint64(0); loc < 100; loc++ {
		b, err := m2.ReadLock(loc, Bitmap)
		if err != nil {
			t.Fatal(err)
		}
		if got := binary.LittleEndian.Uint64(b.Data()[16:]); got != loc*7 {
			t.Fatalf("block %d: %d, want %d", loc, got, loc*7)
		}
		m2.Unlock(b)
	}
	if s := m2.Stats(); s.Cached > 4 || s.Misses != 100 {
		t.Errorf("stats %+v", s)
	}
}

func TestLocks(t *testing.T) {
	dev := memdev.New("meta", 16*4096)
	m := NewManager(dev, 4)
	w, err := m.WriteLockZero(3, Bitmap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReadLock(3, Bitmap); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("read lock of a write-locked block: %v", err)
	}
	if _, err := m.WriteLock(3, Bitmap); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("second write lock: %v", err)
	}
	if err := m.Flush(); err == nil {
		t.Error("Flush with a write-locked block succeeded")
	}
	m.Unlock(w)
	r1, err := m.ReadLock(3, Bitmap)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := m.ReadLock(3, Bitmap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.WriteLock(3, Bitmap); err == nil {
		t.Error("write lock of a read-locked block succeeded")
	}
	if _, err := m.ReadLock(3, Index); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("read as another kind: %v", err)
	}
	m.Unlock(r1)
	m.Unlock(r2)
	if _, err := m.ReadLock(16, Bitmap); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("block out of range: %v", err)
	}
	if _, err := m.ReadLock(5, Bitmap); !errors.Is(err, persistent.ErrCorrupt) {
		t.Errorf("zero block read as a bitmap: %v", err)
	}
	m.SetReadOnly(true)
	if _, err := m.WriteLock(3, Bitmap); !errors.Is(err, persistent.ErrReadOnly) {
		t.Errorf("write lock when read-only: %v", err)
	}
}

func TestFlushAndInvalidate(t *testing.T) {
	dev := memdev.New("meta", 16*4096)
	m := NewManager(dev, 16)
	b, _ := m.WriteLockZero(2, Index)
	m.Unlock(b)
	if dev.Writes() != 0 {
		t.Fatal("a dirty block was written before Flush")
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	if dev.Writes() != 1 || dev.Flushes() != 1 {
		t.Fatalf("%d writes, %d flushes after Flush; want 1, 1", dev.Writes(), dev.Flushes())
	}
	if err := Index.Verify(dev.Bytes()[2*Size:3*Size], 2); err != nil {
		t.Fatal(err)
	}
	b, _ = m.WriteLockZero(4, Index)
	m.Unlock(b)
	m.Invalidate()
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	if dev.Writes() != 1 {
		t.Error("Invalidate kept a dirty block")
	}
}

// TestConcurrentReads reads 64 blocks from four goroutines through a
// cache of 8, so that hits, misses and evictions overlap; every read must
// see its block's contents.
func TestConcurrentReads(t *testing.T) {
	dev := memdev.New("meta", 64*4096)
	w := NewManager(dev, 64)
	for loc := uint64(0); loc < 64; loc++ {
		b, err := w.WriteLockZero(loc, Bitmap)
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(b.Data()[16:], loc*3+1)
		w.Unlock(b)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	m := NewManager(dev, 8)
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 3000; i++ {
				// Mostly a few hot blocks, sometimes any of them.
				loc := uint64((i*7 + g) % 4)
				if i%3 == 0 {
					loc = uint64((i*13 + g*5) % 64)
				}
				b, err := m.ReadLock(loc, Bitmap)
				if err != nil {
					errc <- err
					return
				}
				if got := binary.LittleEndian.Uint64(b.Data()[16:]); got != loc*3+1 {
					errc <- fmt.Errorf("block %d reads %d, want %d", loc, got, loc*3+1)
					m.Unlock(b)
					return
				}
				m.Unlock(b)
			}
		}(g)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if s := m.Stats(); s.Cached > 8+4 || s.Misses < 64 || s.Evictions == 0 {
		t.Errorf("stats %+v: want at most 12 cached, at least 64 misses, some evictions", s)
	}
}
