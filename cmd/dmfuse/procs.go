package main

import (
	"os"
	"runtime"
)

// raiseProcs makes sure the runtime has a P per CPU on top of extra, unless
// GOMAXPROCS is set in the environment; it never lowers GOMAXPROCS. The
// daemon calls it once, with what the packages report they need
// (delay.SchedulerProcs, fs.Server.Procs).
//
// A thread that waits in a system call through the runtime's ordinary path
// (unix.Syscall: an io_uring queue's leader in io_uring_enter, a delayed
// request parked in futex(2), the delay scheduler napping in ppoll) leaves
// its P marked as in a system call: nothing else runs on it until the
// runtime's sysmon takes it back, after 20 us while the process is busy but
// up to 10 ms once it has been quiet. With GOMAXPROCS equal to the number of
// CPUs, such threads can hold every P, and a goroutine readied meanwhile (a
// request started or released, a thread promoted to lead a queue) sits
// runnable until sysmon comes: up to 2 ms in a runtime trace of a delay
// device at queue depth 1. With spare Ps, the runtime runs it at once.
func raiseProcs(extra int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	want := runtime.NumCPU() + extra
	if runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}
