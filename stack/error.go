package stack

import (
	"context"
	"syscall"
)

// Error fails every I/O with EIO. It is a wildcard type: it may replace an
// immutable type (multipath) on reload.
var Error = &TargetType{Name: "error", Version: [3]int{1, 7, 0}, Wildcard: true, New: newError}

type errorTarget struct{}

var (
	_ MapAccounter = errorTarget{}
	_ Discarder    = errorTarget{}
	_ ZeroWriter   = errorTarget{}
)

// newError constructs an error target. Arguments are accepted and ignored, as
// in dm (which opens a device given as `<dev> <offset>` only for its limits).
func newError(_ *Ctor, _ []string) (Target, error) { return errorTarget{}, nil }

// AccountsAtMap marks that every I/O is killed at map time and not counted.
func (errorTarget) AccountsAtMap() {}

func (errorTarget) ReadAt(context.Context, []byte, int64) (int, error)  { return 0, syscall.EIO }
func (errorTarget) WriteAt(context.Context, []byte, int64) (int, error) { return 0, syscall.EIO }

// Discard fails with EIO rather than "not supported", as in dm.
func (errorTarget) Discard(context.Context, int64, int64) error     { return syscall.EIO }
func (errorTarget) WriteZeroes(context.Context, int64, int64) error { return syscall.EIO }
func (errorTarget) Status(StatusType) string                        { return "" }
func (errorTarget) Close() error                                    { return nil }
