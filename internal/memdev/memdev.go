// Package memdev holds the one in-memory block device of the tests. It
// imports nothing of dmfuse, so that every package's tests can use it:
// package stack's own, stacktest (which re-exports it as
// stacktest.MemDevice) and the persistent-data layers'.
package memdev

import (
	"context"
	"sync"
	"syscall"
)

// Device is an in-memory block device (it satisfies stack.BlockDevice). An
// I/O that does not lie wholly inside the device fails with EIO, as a read or
// write past the end of a block device does, so that a target handing its
// device a range beyond it is caught. It counts writes and flushes so that
// tests can see them reach it. Every method may be called concurrently.
type Device struct {
	name    string
	mu      sync.RWMutex
	data    []byte
	writes  int
	flushes int
}

// New returns a zero-filled device of size bytes that prints as name.
func New(name string, size int64) *Device {
	return &Device{name: name, data: make([]byte, size)}
}

// Bytes returns the device's contents (not a copy). Reading it while I/O is
// in flight is a data race.
func (m *Device) Bytes() []byte { return m.data }

// Contents returns a copy of the device's contents, taken under the
// device's lock: unlike Bytes, it may be called while I/O is in flight, and
// it orders after every I/O that completed before it, also for the race
// detector when the I/O completed through the kernel (a FUSE mount served
// by the same process).
func (m *Device) Contents() []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]byte(nil), m.data...)
}

// Writes returns how many writes reached the device.
func (m *Device) Writes() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.writes
}

// Flushes returns how many flushes reached the device.
func (m *Device) Flushes() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.flushes
}

// ReadAt reads len(p) bytes at off.
func (m *Device) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.data)) {
		return 0, syscall.EIO
	}
	return copy(p, m.data[off:]), nil
}

// WriteAt writes p at off.
func (m *Device) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.data)) {
		return 0, syscall.EIO
	}
	m.writes++
	return copy(m.data[off:], p), nil
}

// Flush counts one flush.
func (m *Device) Flush(context.Context) error {
	m.mu.Lock()
	m.flushes++
	m.mu.Unlock()
	return nil
}

// Discard makes [off, off+n) read back as zeros.
func (m *Device) Discard(ctx context.Context, off, n int64) error {
	return m.WriteZeroes(ctx, off, n)
}

// WriteZeroes zeroes [off, off+n).
func (m *Device) WriteZeroes(_ context.Context, off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || n < 0 || off+n > int64(len(m.data)) {
		return syscall.EIO
	}
	clear(m.data[off : off+n])
	return nil
}

// Size returns the device's size in bytes.
func (m *Device) Size() int64 { return int64(len(m.data)) }

// Name returns the name the device prints as in tables and status.
func (m *Device) Name() string { return m.name }
