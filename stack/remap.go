package stack

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"
)

// Remap is the core of the targets that map their segment onto one range of
// one device, as drivers/md/dm-linear.c does: linear is a Remap and little
// else; flakey, dust and delay embed it, override the methods whose
// behaviour they change and call the Remap's for the rest, as nbdkit filters
// call next. Dev was opened through Ctor.Open, so the table owns it.
//
// Remap passes reads, writes, flushes and discards down (dm's
// num_flush_bios and num_discard_bios of 1); it has no WriteZeroes, since
// of these targets only linear sets num_write_zeroes_bios.
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

// Table prints "<dev> <offset>", the device escaped (EscapeArg) and the
// offset in sectors, as the constructors read them back.
func (r *Remap) Table() string {
	return EscapeArg(r.Dev.Name()) + " " + strconv.FormatInt(r.Off/SectorSize, 10)
}

// Status returns Table for StatusTable and nothing for StatusInfo, as
// drivers/md/dm-linear.c: linear_status does.
func (r *Remap) Status(t StatusType) string {
	if t == StatusTable {
		return r.Table()
	}
	return ""
}

// Close releases nothing: the device belongs to the table.
func (r *Remap) Close() error { return nil }

// OpenArea parses offArg, an offset in sectors (offErr is the reason given
// for a malformed one: "Invalid device sector" in most targets), then opens
// devArg with OpenRemap.
func OpenArea(c *Ctor, devArg, offArg, offErr string, sectors int64) (Remap, error) {
	off, err := ParseSector(offArg)
	if err != nil {
		return Remap{}, Errorf("%s", offErr)
	}
	return OpenRemap(c, devArg, off, sectors)
}

// OpenRemap opens devArg through c.Open and checks that sectors
// [off, off+sectors) lie inside it: dm_get_device, then the check that
// drivers/md/dm-table.c: dm_calculate_queue_limits makes through each
// target's iterate_devices with device_area_is_invalid. A failed lookup is
// returned as LookupError says.
func OpenRemap(c *Ctor, devArg string, off, sectors int64) (Remap, error) {
	dev, err := c.Open(devArg)
	if err != nil {
		return Remap{}, LookupError(err)
	}
	if err := CheckArea(dev, off, sectors); err != nil {
		return Remap{}, err
	}
	return Remap{Dev: dev, Off: off * SectorSize}, nil
}

// LookupError returns a failure of Ctor.Open as a constructor error. An
// *ArgError (the manager's "Device lookup failed: <arg>: <cause>") is
// returned unchanged; anything else becomes "Device lookup failed: <cause>"
// with the errno the cause carries (ENODEV if none), since the kernel's
// targets set ti->error to "Device lookup failed" and most return
// dm_get_device's errno.
func LookupError(err error) error {
	var ae *ArgError
	if errors.As(err, &ae) {
		return err
	}
	e := syscall.ENODEV
	errors.As(err, &e)
	return &ArgError{Reason: "Device lookup failed: " + err.Error(), Errno: e}
}

// CheckArea fails when [off, off+n) sectors does not lie inside dev, in the
// words of drivers/md/dm-table.c: device_area_is_invalid. dm checks this at
// resume; dmfuse checks it when the table is built, so a mapped device with
// an inactive table counts with the larger of its two tables' sizes: the
// one it will have once resumed, as a resize reloads the devices below
// before it resumes them all from the bottom up (lvextend of a thin pool's
// data device, a snapshot origin's -real device). Like dm, a device that
// reports size 0 is not checked.
func CheckArea(dev BlockDevice, off, n int64) error {
	size := dev.Size()
	if r, ok := dev.(*mappedRef); ok {
		if t := r.Device.Inactive(); t != nil {
			size = max(size, t.Size())
		}
	}
	size /= SectorSize
	if size == 0 {
		return nil
	}
	if off >= size || off+n > size || off+n < off {
		return &ArgError{Reason: fmt.Sprintf("%s too small for target: start=%d, len=%d, dev_size=%d", dev.Name(), off, n, size), Errno: syscall.EINVAL}
	}
	return nil
}
