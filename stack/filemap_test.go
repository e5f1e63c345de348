package stack

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// shmFile makes a file of size bytes on tmpfs (/dev/shm), or skips.
func shmFile(t *testing.T, size int64) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "dmfuse-filemap-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Skip("/dev/shm is not tmpfs")
	}
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMappedFileConcurrent: a file on tmpfs is mapped; concurrent writers
// of their own blocks and readers of every block through the device read
// only each block's own data, and at the end the file, read with the
// system calls, holds what the device last wrote to every block.
func TestMappedFileConcurrent(t *testing.T) {
	const blk, blocks = 4096, 512
	p := shmFile(t, blk*blocks)
	bd, err := OpenFile(p, p, false)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.(*fileDev).Close()
	if bd.(*fileDev).mm == nil {
		t.Fatal("a file on tmpfs is not mapped")
	}
	ctx := context.Background()
	stamp := func(b []byte, n int, gen uint64) {
		for s := 0; s < len(b); s += SectorSize {
			binary.LittleEndian.PutUint64(b[s:], uint64(n)<<32|gen)
		}
	}
	last := make([]uint64, blocks)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			b := make([]byte, blk)
			for gen := uint64(1); gen <= 2000; gen++ {
				n := w + 4*r.IntN(blocks/4)
				stamp(b, n, gen)
				if _, err := bd.WriteAt(ctx, b, int64(n)*blk); err != nil {
					t.Error(err)
					return
				}
				last[n] = gen
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, blk)
			for i := range 4000 {
				n := i % blocks
				if _, err := bd.ReadAt(ctx, b, int64(n)*blk); err != nil {
					t.Error(err)
					return
				}
				// A read racing a write of its block may see parts of
				// two generations (pread gives no more), but only its
				// block's.
				first := binary.LittleEndian.Uint64(b)
				if first != 0 && first>>32 != uint64(n) {
					t.Errorf("block %d holds block %d's data", n, first>>32)
					return
				}
			}
		}()
	}
	wg.Wait()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for n := range blocks {
		want := make([]byte, blk)
		if last[n] != 0 {
			stamp(want, n, last[n])
		}
		if !bytes.Equal(got[n*blk:(n+1)*blk], want) {
			t.Fatalf("block %d: the file does not hold the last write (generation %d)", n, last[n])
		}
	}
}

// TestMappedFileShrinks: a backing file truncated under the mapping does
// not crash the daemon: reads past its new end read zeros, writes there
// extend it again (the system calls' behaviour), reads before it work.
func TestMappedFileShrinks(t *testing.T) {
	p := shmFile(t, 1<<20)
	bd, err := OpenFile(p, p, false)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.(*fileDev).Close()
	ctx := context.Background()
	b := bytes.Repeat([]byte{7}, 8192)
	if _, err := bd.WriteAt(ctx, b, 1<<19); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 1<<18); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8192)
	if n, err := bd.ReadAt(ctx, got, 1<<19); err != nil || n != len(got) || !bytes.Equal(got, make([]byte, 8192)) {
		t.Errorf("a read past the new end: %d, %v, zeros %v", n, err, bytes.Equal(got, make([]byte, 8192)))
	}
	if _, err := bd.ReadAt(ctx, got, 0); err != nil {
		t.Errorf("a read before the new end: %v", err)
	}
	if n, err := bd.WriteAt(ctx, b, 1<<19); err != nil || n != len(b) {
		t.Fatalf("a write past the new end: %d, %v", n, err)
	}
	f, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 1<<19+8192 || !bytes.Equal(f[1<<19:], b) {
		t.Errorf("the write past the end: file of %d bytes", len(f))
	}
	// Within the file's size again, the mapping serves it.
	if n, err := bd.ReadAt(ctx, got, 1<<19); err != nil || n != len(got) || !bytes.Equal(got, b) {
		t.Errorf("reading the rewritten block: %d, %v", n, err)
	}
}

// TestMappedFileOnlyInMemory: a file elsewhere keeps pread and pwrite.
func TestMappedFileOnlyInMemory(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) != nil || fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.RAMFS_MAGIC {
		t.Skip("the temporary folder is in memory")
	}
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	bd, err := OpenFile(p, p, false)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.(*fileDev).Close()
	if bd.(*fileDev).mm != nil {
		t.Error("a file on disk is mapped")
	}
}
