package main

import (
	"runtime"
	"testing"
)

// TestRaiseProcs: the runtime gets a P per CPU on top of one per queue,
// never fewer than it had, and GOMAXPROCS in the environment wins.
func TestRaiseProcs(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(old) })
	t.Setenv("GOMAXPROCS", "")
	runtime.GOMAXPROCS(1)
	raiseProcs(3)
	if got, want := runtime.GOMAXPROCS(0), runtime.NumCPU()+3; got != want {
		t.Errorf("GOMAXPROCS %d after raiseProcs(3), want %d", got, want)
	}
	big := runtime.NumCPU() + 10
	runtime.GOMAXPROCS(big)
	raiseProcs(3)
	if got := runtime.GOMAXPROCS(0); got != big {
		t.Errorf("GOMAXPROCS lowered from %d to %d", big, got)
	}
	t.Setenv("GOMAXPROCS", "1")
	runtime.GOMAXPROCS(1)
	raiseProcs(3)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS=1 in the environment: raised to %d", got)
	}
}
