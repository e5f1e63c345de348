package stack

import (
	"context"
	"sync"
	"syscall"
)

// MemDevice is an in-memory BlockDevice, for tests and model checks. It
// counts flushes so that tests can see a flush reach it.
type MemDevice struct {
	name string
	mu   sync.RWMutex
	data []byte
	// Flushes counts Flush calls.
	flushes int
}

var _ BlockDevice = (*MemDevice)(nil)

// NewMemDevice returns a zero-filled device of size bytes.
func NewMemDevice(name string, size int64) *MemDevice {
	return &MemDevice{name: name, data: make([]byte, size)}
}

// Bytes returns the device's contents (not a copy).
func (m *MemDevice) Bytes() []byte { return m.data }

// Flushes returns how many flushes reached the device.
func (m *MemDevice) Flushes() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.flushes
}

// ReadAt implements BlockDevice.
func (m *MemDevice) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.data)) {
		return 0, syscall.EIO
	}
	return copy(p, m.data[off:]), nil
}

// WriteAt implements BlockDevice.
func (m *MemDevice) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.data)) {
		return 0, syscall.EIO
	}
	return copy(m.data[off:], p), nil
}

// Flush implements BlockDevice.
func (m *MemDevice) Flush(context.Context) error {
	m.mu.Lock()
	m.flushes++
	m.mu.Unlock()
	return nil
}

// Discard implements BlockDevice: the range reads back as zeros.
func (m *MemDevice) Discard(ctx context.Context, off, n int64) error {
	return m.WriteZeroes(ctx, off, n)
}

// WriteZeroes implements BlockDevice.
func (m *MemDevice) WriteZeroes(_ context.Context, off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || n < 0 || off+n > int64(len(m.data)) {
		return syscall.EIO
	}
	clear(m.data[off : off+n])
	return nil
}

// Size implements BlockDevice.
func (m *MemDevice) Size() int64 { return int64(len(m.data)) }

// Name implements BlockDevice.
func (m *MemDevice) Name() string { return m.name }
