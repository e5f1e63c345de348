// Package memdev is an in-memory metadata device for the layers' tests.
package memdev

import (
	"context"
	"fmt"
	"sync"
)

// Dev is a device of fixed size in memory that counts its writes and
// flushes.
type Dev struct {
	mu      sync.Mutex
	data    []byte
	Writes  int
	Flushes int
}

// New returns a zeroed device of blocks 4 KiB blocks.
func New(blocks int) *Dev { return &Dev{data: make([]byte, blocks*4096)} }

// ReadAt reads from the device.
func (d *Dev) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(d.data)) {
		return 0, fmt.Errorf("read %d bytes at %d: out of range", len(p), off)
	}
	return copy(p, d.data[off:]), nil
}

// WriteAt writes to the device.
func (d *Dev) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(d.data)) {
		return 0, fmt.Errorf("write %d bytes at %d: out of range", len(p), off)
	}
	d.Writes++
	return copy(d.data[off:], p), nil
}

// Flush counts a flush.
func (d *Dev) Flush(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Flushes++
	return nil
}

// Size is the device's size in bytes.
func (d *Dev) Size() int64 { return int64(len(d.data)) }

// Bytes returns the device's contents (not a copy).
func (d *Dev) Bytes() []byte { return d.data }
