package clock

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNow: Now moves forward and reads CLOCK_MONOTONIC, within the time the
// two reads take.
func TestNow(t *testing.T) {
	var ts unix.Timespec
	a := Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Skip("CLOCK_MONOTONIC:", err)
	}
	b := System.Nanotime()
	if a <= 0 || b < a {
		t.Fatalf("Now %d, then %d", a, b)
	}
	if k := ts.Nano(); k < a-int64(time.Millisecond) || k > b+int64(time.Millisecond) {
		t.Errorf("CLOCK_MONOTONIC %d outside [%d, %d] by more than 1 ms", k, a, b)
	}
}

// TestManualTime: the zero value reads 0; Set and Advance move it.
func TestManualTime(t *testing.T) {
	var c Manual
	if n := c.Nanotime(); n != 0 {
		t.Fatalf("zero Manual reads %d", n)
	}
	c.Set(5)
	if n := c.Advance(3 * time.Nanosecond); n != 8 || c.Nanotime() != 8 {
		t.Fatalf("Advance returned %d, Nanotime %d; want 8", n, c.Nanotime())
	}
}

// TestManualWait: a Wait ends when the time reaches its deadline or on Wake,
// and a Wake that comes first ends the next Wait at once.
func TestManualWait(t *testing.T) {
	c := &Manual{}
	c.Set(100)
	if _, ok := c.Sleeping(); ok {
		t.Fatal("Sleeping with nobody waiting")
	}
	done := make(chan struct{})
	go func() { c.Wait(200); close(done) }()
	if d := c.Settle(); d != 200 {
		t.Fatalf("Settle returned %d, want 200", d)
	}
	if d, ok := c.Sleeping(); !ok || d != 200 {
		t.Fatalf("Sleeping %d %v, want 200 true", d, ok)
	}
	c.Advance(99)
	select {
	case <-done:
		t.Fatal("Wait ended before its deadline")
	case <-time.After(10 * time.Millisecond):
	}
	c.Advance(1)
	<-done
	if n := c.Waits(); n != 1 {
		t.Fatalf("Waits %d, want 1", n)
	}

	done = make(chan struct{})
	go func() { c.Wait(Forever); close(done) }()
	c.Settle()
	c.Wake()
	<-done

	c.Wake() // before the Wait: it ends at once
	c.Wait(Forever)
	if n := c.Waits(); n != 3 {
		t.Fatalf("Waits %d, want 3", n)
	}
}
