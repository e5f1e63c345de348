package delay

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

func TestRealClockWake(t *testing.T) {
	c, err := NewRealClock()
	if err != nil {
		t.Fatal(err)
	}
	c.Wake()
	c.Wake()
	c.Wait(Forever) // a Wake that came first ends the next Wait
	c.Wait(c.Nanotime() - 1)
	c.Wait(c.Nanotime() + 100_000) // spins out
	done := make(chan struct{})
	go func() { c.Wait(Forever); close(done) }()
	c.Wake()
	<-done
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRealSchedulerConcurrent runs delayed reads and writes from many
// goroutines through a scheduler on the real clock and checks the data; the
// scheduler refuses to close while the target lives and closes after.
func TestRealSchedulerConcurrent(t *testing.T) {
	s, err := NewRealScheduler()
	if err != nil {
		t.Fatal(err)
	}
	ctor := &stack.Ctor{Len: 1024, Open: stacktest.Opener{"w": stacktest.NewMemDevice("w", 1<<20)}.Open}
	tg, err := New(s, ctor, []string{"w", "0", "0.02", "w", "0", "0.05"})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Go(func() {
			ctx := context.Background()
			buf := make([]byte, 512)
			want := bytes.Repeat([]byte{byte(g)}, 512)
			for i := range 20 {
				off := int64(g*8+i%8) * 512
				if _, err := tg.WriteAt(ctx, want, off); err != nil {
					errs <- err
					return
				}
				if _, err := tg.ReadAt(ctx, buf, off); err != nil || !bytes.Equal(buf, want) {
					errs <- fmt.Errorf("goroutine %d: read back %v, %v", g, buf[:4], err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := tg.Status(stack.StatusInfo); got != "0 0 0" {
		t.Errorf("status %q after all I/O completed", got)
	}
	if err := s.Close(); err == nil {
		t.Fatal("scheduler closed while its target lives")
	}
	tg.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNapFor: a wait sleeps in one ppoll until NapWindow before its spin,
// then in naps of MaxSleep; a 2 ms wait takes four sleeps, not nineteen.
func TestNapFor(t *testing.T) {
	for _, tc := range []struct {
		rem   int64 // until the spin starts
		naps  int
		first int64
	}{
		{50_000, 1, 50_000},
		{int64(MaxSleep), 1, int64(MaxSleep)},
		{int64(NapWindow), 3, int64(MaxSleep)},
		{int64(NapWindow) + 1, 4, 1},
		{2*ms - int64(EarlyWake) - int64(SpinWindow), 4, 2*ms - int64(EarlyWake) - int64(SpinWindow) - int64(NapWindow)},
		{10 * ms, 4, 10*ms - int64(NapWindow)},
	} {
		var naps []int64
		for rem := tc.rem; rem > 0; {
			d := napFor(rem)
			if d <= 0 || d > rem {
				t.Fatalf("rem %d: nap %d", rem, d)
			}
			if rem <= int64(NapWindow) && d > int64(MaxSleep) {
				t.Errorf("rem %d: nap %d within the nap window", rem, d)
			}
			naps = append(naps, d)
			rem -= d
		}
		if len(naps) != tc.naps || naps[0] != tc.first {
			t.Errorf("rem %d: naps %v, want %d starting with %d", tc.rem, naps, tc.naps, tc.first)
		}
	}
}

// TestSharedScheduler: the delay targets built with one stack.SharedSet share
// one scheduler on the real clock, which closes with the set once they are
// closed; targets of another set get another scheduler.
func TestSharedScheduler(t *testing.T) {
	var set, other stack.SharedSet
	open := stacktest.Opener{"m": stacktest.NewMemDevice("m", 1<<20)}.Open
	build := func(s *stack.SharedSet) *Target {
		tg, err := Type.New(&stack.Ctor{Len: 8, Open: open, Shared: s}, []string{"m", "0", "1"})
		if err != nil {
			t.Fatal(err)
		}
		return tg.(*Target)
	}
	a, b, c := build(&set), build(&set), build(&other)
	if a.q.s != b.q.s || a.q.s == c.q.s {
		t.Fatal("targets of one set do not share one scheduler, or targets of two sets do")
	}
	if _, err := a.WriteAt(context.Background(), make([]byte, 512), 0); err != nil {
		t.Fatal(err)
	}
	for _, tg := range []*Target{a, b, c} {
		tg.Close()
	}
	if err := set.Close(); err != nil {
		t.Fatal(err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Type.New(&stack.Ctor{Len: 8, Open: open, Shared: &set}, []string{"m", "0", "1"}); err == nil {
		t.Error("a target was built on a closed set")
	}
}
