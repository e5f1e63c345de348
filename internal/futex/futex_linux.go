// Package futex parks an OS thread on a 32-bit word and wakes it
// (futex(2) on a process-private word).
//
// A goroutine that waits here blocks its OS thread in the kernel, and the
// thread's P goes to another thread only when the runtime's sysmon retakes
// it. The wake-up is one system call that readies that thread: a goroutine
// locked to its thread (runtime.LockOSThread) and woken through a channel
// instead needs the Go scheduler to hand a P to the locked thread and to
// stop the thread that did (startlockedm, stoplockedm), two more futex
// calls and thread switches.
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

// Wait blocks the calling thread while *w is val. It may return without a
// Wake or while *w is still val (a signal, a wake-up meant for an earlier
// use of the word): callers check the word again.
func Wait(w *atomic.Uint32, val uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), waitPrivate, uintptr(val), 0, 0, 0)
}

// Wake wakes up to n threads blocked in Wait on w. The caller changes *w
// first, so that a thread not yet in Wait does not block.
func Wake(w *atomic.Uint32, n int) {
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), wakePrivate, uintptr(n), 0, 0, 0)
}
