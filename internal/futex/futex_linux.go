package futex

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex(2) operations on a process-private word (FUTEX_WAIT or FUTEX_WAKE
// with FUTEX_PRIVATE_FLAG, include/uapi/linux/futex.h).
const (
	waitPrivate = 0 | 128
	wakePrivate = 1 | 128
)

// wait sleeps in futex(2) while *w is old; it may return for no reason.
func wait(w *atomic.Uint32, old uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), waitPrivate, uintptr(old), 0, 0, 0)
}

// wake wakes one thread sleeping on w.
func wake(w *atomic.Uint32) {
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), wakePrivate, 1, 0, 0, 0)
}
