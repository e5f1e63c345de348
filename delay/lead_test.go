package delay

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// stillRunning fails the test if o finishes while the other goroutines get
// plenty of chances to run.
func stillRunning(t *testing.T, o *op, what string) {
	t.Helper()
	for range 1000 {
		runtime.Gosched()
	}
	if o.finished() {
		t.Fatalf("%s finished before its deadline", what)
	}
}

// TestEarlyRelease: with a clock whose Lead is 2 ms, the scheduler releases
// a request 2 ms before its deadline and the request finishes the wait
// itself, returning only at the deadline; a delay no longer than the lead
// never parks but still waits its full delay; presuspend still releases at
// once, parked or spinning.
func TestEarlyRelease(t *testing.T) {
	r := newRig(t)
	r.clock.lead.Store(2 * ms)
	tg := r.target("8:16 0 10 8:32 0 1") // reads 10 ms, writes 1 ms (no longer than the lead)
	ctx := context.Background()

	rd := r.read(tg, ctx)
	waitStatus(t, tg, "1 0 0")
	if d := r.clock.Settle(); d != rd.issued+8*ms {
		t.Fatalf("scheduler waits until %d, want 2 ms before the deadline (%d)", d-rd.issued, 8*ms)
	}
	r.clock.Advance(time.Duration(8 * ms))
	waitStatus(t, tg, "0 0 0") // released, early
	stillRunning(t, rd, "an early released read")
	r.clock.Advance(time.Duration(2*ms - 1))
	stillRunning(t, rd, "an early released read")
	r.clock.Advance(time.Duration(1))
	if err := rd.result(t); err != nil {
		t.Fatal(err)
	}
	if got := r.releasedSeqs(); len(got) != 1 {
		t.Fatalf("released %v, want one request", got)
	}

	wr := r.write(tg, ctx)
	waitStatus(t, tg, "0 1 0") // queued (its deadline taken) before the clock moves
	stillRunning(t, wr, "a write shorter than the lead")
	r.clock.Advance(time.Duration(ms))
	if err := wr.result(t); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, tg, "0 0 0")

	// Presuspend releases a parked request without waiting for its
	// deadline, lead or not.
	rd = r.read(tg, ctx)
	waitStatus(t, tg, "1 0 0")
	tg.Presuspend(false)
	if err := rd.result(t); err != nil {
		t.Fatal(err)
	}
	tg.Resume()

	// A request no longer than the lead spins without the scheduler but
	// counts as queued, and presuspend releases it too.
	wr = r.write(tg, ctx)
	waitStatus(t, tg, "0 1 0")
	stillRunning(t, wr, "a write shorter than the lead")
	tg.Presuspend(false)
	if err := wr.result(t); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, tg, "0 0 0")
	tg.Resume()
}

// TestLeadOnlyWhenAlone: the scheduler releases a request early only while
// it is the only active request of all its targets, waiting for that in
// Wait; with another one queued (on another target) it releases at the
// deadline, waiting for it in Sleep (the clock is a Sleeper), and the
// released request does not spin; once alone again, a request is released
// early.
func TestLeadOnlyWhenAlone(t *testing.T) {
	r, sc := newSleepRig(t)
	r.clock.lead.Store(2 * ms)
	ta := r.target("8:16 0 10")
	tb := r.target("8:32 0 10")
	ctx := context.Background()
	r.clock.Settle() // with nothing queued yet, in Sleep: nothing was released
	base := sc.sleeps.Load()

	a := r.read(ta, ctx)
	waitStatus(t, ta, "1 0 0")
	if d := r.clock.Settle(); d != a.issued+8*ms {
		t.Fatalf("alone: scheduler waits until %d, want the lead before the deadline (%d)", d-a.issued, 8*ms)
	}
	if n := sc.sleeps.Load() - base; n != 0 {
		t.Fatalf("alone: %d sleeps, want the scheduler in Wait", n)
	}
	r.clock.Advance(time.Duration(ms))
	b := r.read(tb, ctx)
	waitStatus(t, tb, "1 0 0")
	r.clock.Advance(time.Duration(7 * ms)) // a's early release time, now with b active
	if d := r.clock.Settle(); d != a.issued+10*ms {
		t.Fatalf("with another request active: scheduler waits until %d, want the deadline (%d)", d-a.issued, 10*ms)
	}
	if n := sc.sleeps.Load() - base; n != 1 {
		t.Fatalf("with another request active: %d sleeps, want 1", n)
	}
	waitStatus(t, ta, "1 0 0") // not released early
	r.clock.Advance(time.Duration(2 * ms))
	if err := a.result(t); err != nil { // released at its deadline, no spin
		t.Fatal(err)
	}
	waitStatus(t, ta, "0 0 0")

	// b is alone now (1 ms before its deadline, within the lead): the
	// scheduler's next look releases it early, and it spins the rest.
	r.clock.Wake()
	waitStatus(t, tb, "0 0 0")
	stillRunning(t, b, "an early released read")
	r.clock.Advance(time.Duration(ms))
	if err := b.result(t); err != nil {
		t.Fatal(err)
	}
	if got := r.releasedSeqs(); len(got) != 2 {
		t.Fatalf("released %v, want two requests", got)
	}
}

// sleepClock is a manualClock that is also a Sleeper, counting its Sleeps.
type sleepClock struct {
	*manualClock
	sleeps atomic.Int32
}

func (c *sleepClock) Sleep(deadline int64) {
	c.sleeps.Add(1)
	c.manualClock.Wait(deadline)
}

// TestLingerOnlyAfterShortDelays: with nothing queued, the scheduler waits
// in Wait (which lingers on the real clock) only after releasing a request
// shorter than LingerBelow; after a longer one it sleeps in Sleep at once.
func TestLingerOnlyAfterShortDelays(t *testing.T) {
	r, sc := newSleepRig(t)
	lead := ms / 10
	r.clock.lead.Store(lead)
	short := int64(LingerBelow) / 2
	long := r.target("8:16 0 10")
	brief := r.target(fmt.Sprintf("8:32 0 %g", float64(short)/float64(ms)))
	ctx := context.Background()

	// serve runs one read of tg, of delay d, to its end and returns how
	// many times the scheduler slept in Sleep from the read's release to
	// its next wait with nothing queued.
	serve := func(tg *Target, d int64) int32 {
		t.Helper()
		o := r.read(tg, ctx)
		waitStatus(t, tg, "1 0 0")
		if got := r.clock.Settle(); got != o.issued+d-lead {
			t.Fatalf("delay %d: scheduler waits until %d, want %d", d, got-o.issued, d-lead)
		}
		n := sc.sleeps.Load()
		r.clock.Advance(time.Duration(d - lead))
		waitStatus(t, tg, "0 0 0")
		r.clock.Advance(time.Duration(lead))
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
		if got := r.clock.Settle(); got != Forever {
			t.Fatalf("delay %d: after the release the scheduler waits until %d, want Forever", d, got)
		}
		return sc.sleeps.Load() - n
	}
	if n := serve(long, 10*ms); n != 1 {
		t.Errorf("after a 10 ms request: %d sleeps, want 1 (no linger)", n)
	}
	if n := serve(brief, short); n != 0 {
		t.Errorf("after a %d ns request: %d sleeps, want 0 (a Wait, which lingers)", short, n)
	}
	if n := serve(long, 10*ms); n != 1 {
		t.Errorf("after a 10 ms request again: %d sleeps, want 1", n)
	}
}

// newSleepRig is newRig with a scheduler whose clock is a Sleeper that
// counts its sleeps.
func newSleepRig(t *testing.T) (*rig, *sleepClock) {
	r := newRig(t)
	sc := &sleepClock{manualClock: r.clock}
	onRelease := r.s.onRelease
	r.s = NewScheduler(sc)
	r.s.onRelease = onRelease
	return r, sc
}
