package stack

import "github.com/dmfuse/dmfuse/internal/memdev"

// The package's own tests reach into unexported state, so they cannot import
// stacktest (which imports stack). They use the same in-memory device that
// stacktest.MemDevice names, under these names.

// MemDevice is stacktest.MemDevice for the package's internal tests.
type MemDevice = memdev.Device

// NewMemDevice is stacktest.NewMemDevice for the package's internal tests.
func NewMemDevice(name string, size int64) *MemDevice { return memdev.New(name, size) }
