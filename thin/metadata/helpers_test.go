package metadata

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// memDev is an in-memory metadata device.
type memDev struct {
	mu      sync.Mutex
	data    []byte
	writes  int
	flushes int
}

func newMemDev(blocks int) *memDev { return &memDev{data: make([]byte, blocks*4096)} }

func (d *memDev) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(p, d.data[off:]), nil
}

func (d *memDev) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes++
	return copy(d.data[off:], p), nil
}

func (d *memDev) Flush(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flushes++
	return nil
}

func (d *memDev) Size() int64 { return int64(len(d.data)) }

func (d *memDev) clone() *memDev {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &memDev{data: append([]byte(nil), d.data...)}
}

// fileDev is a metadata device on a file.
type fileDev struct{ f *os.File }

func (d fileDev) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	return d.f.ReadAt(p, off)
}
func (d fileDev) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	return d.f.WriteAt(p, off)
}
func (d fileDev) Flush(context.Context) error { return d.f.Sync() }
func (d fileDev) Size() int64 {
	st, err := d.f.Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}

func newFileDev(t testing.TB, blocks int) (fileDev, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "meta")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(blocks) * 4096); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return fileDev{f}, path
}

func mustOpen(t testing.TB, dev Device, o Options) *DiskStore {
	t.Helper()
	p, err := Open(dev, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return p
}
