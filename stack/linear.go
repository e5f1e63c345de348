package stack

import (
	"context"
	"fmt"
	"syscall"
)

// Linear maps a segment onto a contiguous range of another device.
var Linear = &TargetType{Name: "linear", Version: [3]int{1, 5, 0}, New: newLinear}

// Remap is a segment mapped onto Dev starting at byte Off: the pass-through
// that linear is, and that flakey, dust and delay build on.
type Remap struct {
	Dev BlockDevice
	Off int64 // bytes
}

// ReadAt reads from the mapped range.
func (r *Remap) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return r.Dev.ReadAt(ctx, p, r.Off+off)
}

// WriteAt writes to the mapped range.
func (r *Remap) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return r.Dev.WriteAt(ctx, p, r.Off+off)
}

// Flush passes a flush down.
func (r *Remap) Flush(ctx context.Context) error { return r.Dev.Flush(ctx) }

// Discard passes a discard down.
func (r *Remap) Discard(ctx context.Context, off, n int64) error {
	return r.Dev.Discard(ctx, r.Off+off, n)
}

// WriteZeroes passes write-zeroes down.
func (r *Remap) WriteZeroes(ctx context.Context, off, n int64) error {
	return r.Dev.WriteZeroes(ctx, r.Off+off, n)
}

// Devices lists the underlying device.
func (r *Remap) Devices() []BlockDevice { return []BlockDevice{r.Dev} }

// Table prints "<dev> <offset>" with the offset in sectors.
func (r *Remap) Table() string { return fmt.Sprintf("%s %d", r.Dev.Name(), r.Off/SectorSize) }

// OpenArea opens a device argument and a sector offset argument and checks that
// [offset, offset+c.Len) lies inside the device. offErr is the reason given
// for a malformed offset ("Invalid device sector").
func OpenArea(c *Ctor, devArg, offArg, offErr string, sectors int64) (*Remap, error) {
	off, err := ParseSector(offArg)
	if err != nil {
		return nil, Errorf("%s", offErr)
	}
	dev, err := c.Open(devArg)
	if err != nil {
		return nil, err
	}
	if err := CheckArea(dev, off, sectors); err != nil {
		return nil, err
	}
	return &Remap{Dev: dev, Off: off * SectorSize}, nil
}

// CheckArea fails when [off, off+n) sectors does not lie inside dev. dm checks
// this at resume; dmfuse checks it when the table is built. Like dm, a device
// that reports size 0 is not checked.
func CheckArea(dev BlockDevice, off, n int64) error {
	size := dev.Size() / SectorSize
	if size == 0 {
		return nil
	}
	if off+n > size || off+n < off {
		return &ArgError{Reason: fmt.Sprintf("%s too small for target: start=%d, len=%d, dev_size=%d", dev.Name(), off, n, size), Errno: syscall.EINVAL}
	}
	return nil
}

// linear is the linear target.
type linear struct{ Remap }

var (
	_ Flusher      = (*linear)(nil)
	_ Discarder    = (*linear)(nil)
	_ ZeroWriter   = (*linear)(nil)
	_ DeviceLister = (*linear)(nil)
)

// newLinear constructs a linear target.
//
//	<dev> <offset>
//
// dev is a device argument (interface.md §4), offset is in sectors.
func newLinear(c *Ctor, args []string) (Target, error) {
	if len(args) != 2 {
		return nil, Errorf("Invalid argument count")
	}
	r, err := OpenArea(c, args[0], args[1], "Invalid device sector", c.Len)
	if err != nil {
		return nil, err
	}
	return &linear{*r}, nil
}

func (l *linear) Status(t StatusType) string {
	if t == StatusTable {
		return l.Table()
	}
	return ""
}

func (l *linear) Close() error { return nil }
