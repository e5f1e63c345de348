package stack

import (
	"errors"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// ErrInjected is matched (errors.Is) by every I/O error that a fault target
// (error, flakey, dust) makes up on purpose, and by no error of an
// underlying device. Such errors are also EIO, so callers that only look
// for the errno see what the kernel's targets return (BLK_STS_IOERR).
var ErrInjected = errors.New("injected fault")

// InjectedError is an I/O error made up by a fault target: it unwraps to
// EIO and matches ErrInjected. Targets return preallocated values (see
// injectedErrors), so failing an I/O allocates nothing.
type InjectedError struct {
	// Target is the target type that failed the I/O.
	Target string
	// Op is the kind of I/O it failed.
	Op ioop.Op
}

// Error returns "<target>: injected <op> error: input/output error".
func (e *InjectedError) Error() string {
	return e.Target + ": injected " + e.Op.String() + " error: " + syscall.EIO.Error()
}

// Unwrap returns EIO.
func (e *InjectedError) Unwrap() error { return syscall.EIO }

// Is reports whether target is ErrInjected.
func (e *InjectedError) Is(target error) bool { return target == ErrInjected }

// injectedErrors holds one InjectedError per kind of I/O for a target type.
type injectedErrors [ioop.NumOps]InjectedError

// newInjectedErrors returns the errors of target type name.
func newInjectedErrors(name string) *injectedErrors {
	var e injectedErrors
	for op := range e {
		e[op] = InjectedError{Target: name, Op: ioop.Op(op)}
	}
	return &e
}

// of returns the error for op.
func (e *injectedErrors) of(op ioop.Op) error { return &e[op] }
