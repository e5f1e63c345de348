package uring

import (
	"os"
	"runtime"
)

// raiseProcs makes sure the runtime has a P for every CPU on top of one per
// queue, unless GOMAXPROCS is set in the environment.
//
// A queue's leader waits for requests in io_uring_enter, and a delayed
// request in futex(2), through the runtime's ordinary system call path,
// which leaves the thread's P marked as in a system call: nothing else runs
// on it until the runtime's sysmon takes it back, after 20 us while the
// process is busy but up to 10 ms once it has been quiet. With GOMAXPROCS
// equal to the number of CPUs, the leaders alone hold every P, and a
// goroutine readied by a leader just before it waits (a request parked off
// the queue, a thread promoted to lead) sat runnable for up to 2 ms in a
// runtime trace of a delay device at queue depth 1. With spare Ps, the
// runtime wakes a thread for it at once.
func raiseProcs(queues int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	want := runtime.NumCPU() + queues
	if runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}
