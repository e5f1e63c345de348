package futex

import (
	"runtime"
	"testing"
	"time"
)

// TestSetWakes: Wait returns the value Set stores, whether Set comes
// before Wait or while the waiter sleeps, and Reset makes the next Wait
// block again.
func TestSetWakes(t *testing.T) {
	var e Event
	e.Set(7)
	if v := e.Wait(); v != 7 {
		t.Fatalf("Wait after Set(7) = %d", v)
	}
	e.Reset()
	if v := e.Load(); v != 0 {
		t.Fatalf("Load after Reset = %d", v)
	}
	got := make(chan uint32)
	go func() {
		runtime.LockOSThread()
		got <- e.Wait()
	}()
	select {
	case v := <-got:
		t.Fatalf("Wait on an unset event returned %d", v)
	case <-time.After(20 * time.Millisecond):
	}
	e.Set(2)
	select {
	case v := <-got:
		if v != 2 {
			t.Fatalf("Wait = %d, want 2", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Set did not wake the waiting thread")
	}
}
