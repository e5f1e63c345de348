package delay

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex(2) operations on a process-private word (FUTEX_WAIT or FUTEX_WAKE
// with FUTEX_PRIVATE_FLAG, include/uapi/linux/futex.h).
const (
	futexWaitPrivate = 0 | 128
	futexWakePrivate = 1 | 128
)

// park blocks the calling goroutine, and its OS thread, in futex(2) until
// signal is called; it returns at once if signal already was. A request
// parks its thread rather than its goroutine so that the release is one
// kernel wake-up of that thread. A goroutine parked on a channel and readied
// by the scheduler's locked thread lands in the run queue of that thread's P,
// which the scheduler keeps while it naps in ppoll; unless another P is idle
// to steal it, it waits for the runtime's sysmon, which sleeps up to 10 ms
// when the process is quiet (what parking on a futex saved is in
// docs/benchmarks.md, Delay).
func (w *waiter) park() {
	for w.sig.Load() == 0 {
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&w.sig)), futexWaitPrivate, 0, 0, 0, 0)
	}
}

// signal ends the park of w. The word is set before the wake-up, so a park
// that has not reached futex(2) yet returns without sleeping; a wake-up that
// lands on a waiter reused meanwhile only makes that one check its word again.
func (w *waiter) signal() {
	w.sig.Store(1)
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&w.sig)), futexWakePrivate, 1, 0, 0, 0)
}
