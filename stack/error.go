package stack

import (
	"context"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// Error fails every I/O with EIO. It is a wildcard type: it may replace an
// immutable type (multipath) on reload.
var Error = &TargetType{Name: "error", Version: [3]int{1, 7, 0}, Wildcard: true, New: newError}

// errorErrs are the errors the error target returns.
var errorErrs = newInjectedErrors("error")

type errorTarget struct{}

var (
	_ MapAccounter = errorTarget{}
	_ Discarder    = errorTarget{}
	_ DiscardOwner = errorTarget{}
)

// newError constructs an error target, as drivers/md/dm-target.c:
// io_err_ctr does:
//
//	[<dev> <offset>]
//
// With exactly two arguments they are a device and an offset in sectors, as
// for linear: the offset must parse ("Invalid device sector"), the device
// must open ("Device lookup failed") and the segment must fit on it (the
// kernel checks the area through io_err_iterate_devices). No I/O reaches
// the device. Any other number of arguments is accepted and ignored. The
// kernel's error target has no status function, so table and status print
// no arguments.
func newError(c *Ctor, args []string) (Target, error) {
	if len(args) == 2 {
		if _, err := OpenArea(c, args[0], args[1], "Invalid device sector", c.Len); err != nil {
			return nil, err
		}
	}
	return errorTarget{}, nil
}

// AccountsAtMap marks that every I/O is killed at map time and not counted.
func (errorTarget) AccountsAtMap() {}

func (errorTarget) ReadAt(context.Context, []byte, int64) (int, error) {
	return 0, errorErrs.of(ioop.Read)
}

func (errorTarget) WriteAt(context.Context, []byte, int64) (int, error) {
	return 0, errorErrs.of(ioop.Write)
}

// Discard fails with EIO rather than "not supported": io_err_ctr sets
// num_discard_bios and discards_supported. The target takes no
// write-zeroes, so ZERO_RANGE reaches it as writes, which fail too.
func (errorTarget) Discard(context.Context, int64, int64) error { return errorErrs.of(ioop.Discard) }

// OwnsDiscards marks that discards fail here whatever the device takes.
func (errorTarget) OwnsDiscards() {}

func (errorTarget) Status(StatusType) string { return "" }
func (errorTarget) Close() error             { return nil }

// ErrPushBack is the error of an I/O that a target pushes back to the device
// (dm's DM_MAPIO_REQUEUE and DM_ENDIO_REQUEUE): multipath returns it when it
// finds no usable path while the device is being suspended with noflush and
// queue_if_no_path is off (as presuspend turns it off). During a noflush
// suspend the device holds such an I/O at its gate and issues it again
// after resume; otherwise it fails with EIO, which ErrPushBack wraps (as the
// kernel turns a push-back into EIO outside a noflush suspend).
var ErrPushBack error = pushBackError{}

type pushBackError struct{}

func (pushBackError) Error() string { return "multipath: no usable path: I/O pushed back" }
func (pushBackError) Unwrap() error { return syscall.EIO }
