package uring

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// affinity returns the CPUs thread tid may run on.
func affinity(t *testing.T, tid int) unix.CPUSet {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		t.Fatalf("sched_getaffinity(%d): %v", tid, err)
	}
	return set
}

// TestStandbyBoundByPromote: a thread that gave up the queue for a waiting
// request goes to sleep as standby without binding itself to the queue's
// CPU (that system call would move it next to the leader that commits its
// reply); the thread that promotes it binds it before it wakes it, so that
// it leads on the queue's CPU.
func TestStandbyBoundByPromote(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 8)
	if s.cpus.Count() < 2 {
		t.Skip("needs 2 CPUs to tell a bound thread from an unbound one")
	}
	var queueCPU unix.CPUSet
	queueCPU.Set(0)
	q := s.queues[0]
	r.read(1, nodeFast)
	r.reply(t)
	first := int(q.tid.Load())
	if got := affinity(t, first); got != queueCPU {
		t.Fatalf("the first leader may run on %d CPUs, want queue 0's alone", got.Count())
	}

	r.read(100, nodeHint) // the first leader gives the queue up and waits
	<-fs.started
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 100 {
		t.Fatalf("reply %+v, want the waiting request's", p)
	}
	for i := 0; q.standbys() != 1; i++ {
		if i > 10_000_000 {
			t.Fatalf("%d standby threads after the waiting request, want 1", q.standbys())
		}
		runtime.Gosched()
	}
	if got := affinity(t, first); got != s.cpus {
		t.Errorf("the standby thread may run on %d CPUs, want all %d (unbound by its hand-off)", got.Count(), s.cpus.Count())
	}

	r.read(102, nodeHint) // promotes the standby thread
	<-fs.started
	for i := 0; int(q.tid.Load()) != first; i++ {
		if i > 10_000_000 {
			t.Fatalf("thread %d leads, want the standby thread %d", q.tid.Load(), first)
		}
		runtime.Gosched()
	}
	if got := affinity(t, first); got != queueCPU {
		t.Errorf("the promoted thread may run on %d CPUs, want queue 0's alone", got.Count())
	}
	r.read(104, nodeFast)
	if p := r.reply(t); p.unique != 104 {
		t.Errorf("reply %+v, want 104", p)
	}
	fs.release <- struct{}{}
	if p := r.reply(t); p.unique != 102 {
		t.Errorf("reply %+v, want 102", p)
	}
}
