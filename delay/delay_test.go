package delay

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/hints"
	"github.com/dmfuse/dmfuse/stack"
)

// TestStatusVectors checks the table form of delay tables with one, two and
// three triples, as drivers/md/dm-delay.c: delay_status prints them, and the
// fractional form.
func TestStatusVectors(t *testing.T) {
	for _, tc := range []struct{ in, table string }{
		{"8:16 0 100", "8:16 0 100"},
		{"8:16 0 0 8:32 0 400", "8:16 0 0 8:32 0 400"},
		{"8:16 0 50 8:16 0 100 8:16 0 333", "8:16 0 50 8:16 0 100 8:16 0 333"},
		{"8:16 16 0.25", "8:16 16 0.25"},
		{"8:16 0 0.50 8:32 8 +007", "8:16 0 0.5 8:32 8 7"},
		{"8:16 0 0.1 8:32 0 1.000001 8:48 0 4294967295", "8:16 0 0.1 8:32 0 1.000001 8:48 0 4294967295"},
		{"8:16 0 0.0000001", "8:16 0 0.0000001"},
	} {
		r := newRig(t)
		tg := r.target(tc.in)
		if got := tg.Status(stack.StatusTable); got != tc.table {
			t.Errorf("%q: table %q, want %q", tc.in, got, tc.table)
		}
		if got := tg.Status(stack.StatusInfo); got != "0 0 0" {
			t.Errorf("%q: status %q, want \"0 0 0\"", tc.in, got)
		}
		// TABLE output is accepted back and prints the same.
		again := r.target(tc.table)
		if got := again.Status(stack.StatusTable); got != tc.table {
			t.Errorf("%q: re-parsed table %q", tc.table, got)
		}
	}
	if Type.Name != "delay" || Type.Version != [3]int{1, 5, 0} {
		t.Errorf("type %s v%v", Type.Name, Type.Version)
	}
}

func TestBadArguments(t *testing.T) {
	for _, tc := range []struct{ in, reason string }{
		{"", "Requires exactly 3, 6 or 9 arguments"},
		{"8:16 0", "Requires exactly 3, 6 or 9 arguments"},
		{"8:16 0 100 8:32", "Requires exactly 3, 6 or 9 arguments"},
		{"8:16 0 1 8:16 0 1 8:16 0", "Requires exactly 3, 6 or 9 arguments"},
		{"8:16 0 1 8:16 0 1 8:16 0 1 8:16", "Requires exactly 3, 6 or 9 arguments"},
		{"8:16 10x 1", `Invalid device sector: argument 2 "10x"`},
		{"8:16 -1 1", `Invalid device sector: argument 2 "-1"`},
		{"nosuch 10x 1", `Invalid device sector: argument 2 "10x"`}, // offset is checked before the device
		{"8:16 0 1 8:32 0 abc", `Invalid delay: argument 6 "abc"`},
		{"nosuch 0 -1", `Invalid delay: argument 3 "-1"`},
		{"8:16 0 1e3", `Invalid delay: argument 3 "1e3"`},
		{"8:16 0 4294967296", `Invalid delay: argument 3 "4294967296"`},
		{"8:16 0 4294967295.5", `Invalid delay: argument 3 "4294967295.5"`},
		{"8:16 0 inf", `Invalid delay: argument 3 "inf"`},
		{"8:16 0 0x10", `Invalid delay: argument 3 "0x10"`},
		{"8:16 0 1.", `Invalid delay: argument 3 "1."`},
		{"8:16 0 .5", `Invalid delay: argument 3 ".5"`},
		{"8:16 0 1 8:32 0 1 8:48 0 1_0", `Invalid delay: argument 9 "1_0"`},
		{"nosuch 0 1", "Device lookup failed: nosuch: no such mapped device"},
		{"8:16 0 1 8:32 3000 1", "8:32 too small for target: start=3000, len=2048, dev_size=4096"},
	} {
		r := newRig(t)
		_, err := New(r.s, r.ctor(2048), stack.SplitArgs(tc.in))
		var ae *stack.ArgError
		if !errors.As(err, &ae) || ae.Reason != tc.reason {
			t.Errorf("%q: error %v, want reason %q", tc.in, err, tc.reason)
			continue
		}
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: error %v is not EINVAL", tc.in, err)
		}
	}
}

// TestReleaseOrderAndBatching: one pass releases every expired request in
// arrival order, across classes, even though the write class expired first.
func TestReleaseOrderAndBatching(t *testing.T) {
	r := newRig(t)
	tg := r.target("8:16 0 5 8:32 0 1") // reads 5 ms, writes 1 ms
	ctx := context.Background()
	var ops []*op
	for i, want := range []string{"1 0 0", "1 1 0", "2 1 0", "2 2 0", "3 2 0"} {
		if i%2 == 0 {
			ops = append(ops, r.read(tg, ctx))
		} else {
			ops = append(ops, r.write(tg, ctx))
		}
		waitStatus(t, tg, want)
	}
	if d := r.clock.Settle(); d != r.clock.Nanotime()+1*ms {
		t.Fatalf("scheduler waits for %d, want the write deadline %d", d, r.clock.Nanotime()+1*ms)
	}
	r.clock.Advance(time.Duration(ms / 2))
	r.clock.Settle()
	for _, o := range ops {
		if o.finished() {
			t.Fatal("a request finished before its deadline")
		}
	}
	before := r.clock.Waits()
	r.clock.Advance(time.Duration(6 * ms))
	r.clock.Settle()
	for _, o := range ops {
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.releasedSeqs(); !slices.Equal(got, []uint64{1, 2, 3, 4, 5}) {
		t.Errorf("release order %v, want arrival order [1 2 3 4 5]", got)
	}
	passes := r.clock.Waits() - before
	if passes != 1 {
		t.Errorf("%d wake-ups to release one batch, want 1", passes)
	}
	waitStatus(t, tg, "0 0 0")
}

// TestPartialRelease: entries not yet expired stay queued, in order.
func TestPartialRelease(t *testing.T) {
	r := newRig(t)
	tg := r.target("8:16 0 10")
	ctx := context.Background()
	var ops []*op
	for i := range 4 {
		ops = append(ops, r.read(tg, ctx))
		waitStatus(t, tg, []string{"1 0 0", "2 0 0", "3 0 0", "4 0 0"}[i])
		r.clock.Advance(time.Duration(2 * ms)) // issued at 0, 2, 4, 6 ms
	}
	r.clock.Settle()                       // now 8 ms: nothing due before 10 ms
	r.clock.Advance(time.Duration(5 * ms)) // 13 ms: first two due
	if d := r.clock.Settle(); d != ops[2].issued+10*ms {
		t.Errorf("next wait until %d, want %d", d, ops[2].issued+10*ms)
	}
	for _, o := range ops[:2] {
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
	}
	if ops[2].finished() || ops[3].finished() {
		t.Fatal("request released before its deadline")
	}
	waitStatus(t, tg, "2 0 0")
	r.clock.Advance(time.Duration(10 * ms))
	for _, o := range ops[2:] {
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.releasedSeqs(); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
		t.Errorf("release order %v", got)
	}
}

// TestEarlierDeadlineWakes: a request due before the one being waited for
// wakes the scheduler, even from another target.
func TestEarlierDeadlineWakes(t *testing.T) {
	r := newRig(t)
	slow := r.target("8:16 0 100")
	fast := r.target("8:32 0 0.05")
	ctx := context.Background()
	s1 := r.read(slow, ctx)
	waitStatus(t, slow, "1 0 0")
	if d := r.clock.Settle(); d != s1.issued+100*ms {
		t.Fatalf("waiting until %d, want %d", d, s1.issued+100*ms)
	}
	f1 := r.write(fast, ctx)
	waitStatus(t, fast, "0 1 0")
	if d := r.clock.Settle(); d != f1.issued+50_000 {
		t.Fatalf("after an earlier request, waiting until %d, want %d", d, f1.issued+50_000)
	}
	r.clock.Advance(time.Duration(50_000))
	if err := f1.result(t); err != nil {
		t.Fatal(err)
	}
	if d := r.clock.Settle(); d != s1.issued+100*ms {
		t.Fatalf("then waiting until %d, want %d", d, s1.issued+100*ms)
	}
	if s1.finished() {
		t.Fatal("slow request released early")
	}
	r.clock.Advance(time.Duration(100 * ms))
	if err := s1.result(t); err != nil {
		t.Fatal(err)
	}
	if d := r.clock.Settle(); d != Forever {
		t.Errorf("idle scheduler waits until %d, want Forever", d)
	}
}

// TestPresuspendAndResume: presuspend releases everything at once, I/O
// passes straight through until resume, then is delayed again.
func TestPresuspendAndResume(t *testing.T) {
	r := newRig(t)
	tg := r.target("8:16 0 100 8:32 0 100 8:48 0 100")
	ctx := context.Background()
	ops := []*op{r.read(tg, ctx), r.read(tg, ctx), r.write(tg, ctx),
		r.start(func(ctx context.Context) error { return tg.Flush(ctx) }, ctx)}
	waitStatus(t, tg, "2 1 1")
	tg.Presuspend(false)
	if got := tg.Status(stack.StatusInfo); got != "0 0 0" {
		t.Errorf("after presuspend status %q", got)
	}
	for _, o := range ops {
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(r.releasedSeqs()); got != 0 {
		t.Errorf("scheduler released %d, want 0 (presuspend released them)", got)
	}
	// Suspended: passes through without the clock moving.
	if err := r.read(tg, ctx).result(t); err != nil {
		t.Fatal(err)
	}
	if r.devs["8:48"].Flushes() != 1 {
		t.Errorf("flush device saw %d flushes, want 1", r.devs["8:48"].Flushes())
	}
	tg.Resume()
	o := r.read(tg, ctx)
	waitStatus(t, tg, "1 0 0")
	r.clock.Advance(time.Duration(100 * ms))
	if err := o.result(t); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, tg, "0 0 0")
}

// TestCancel: a cancelled request leaves the queue with EINTR; the others
// are released as before.
func TestCancel(t *testing.T) {
	r := newRig(t)
	tg := r.target("8:16 0 10")
	ctx, cancel := context.WithCancel(context.Background())
	a := r.read(tg, context.Background())
	waitStatus(t, tg, "1 0 0")
	b := r.read(tg, ctx)
	waitStatus(t, tg, "2 0 0")
	c := r.read(tg, context.Background())
	waitStatus(t, tg, "3 0 0")
	cancel()
	err := b.result(t)
	if !errors.Is(err, syscall.EINTR) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled read: %v, want EINTR and context.Canceled", err)
	}
	waitStatus(t, tg, "2 0 0")
	r.clock.Advance(time.Duration(10 * ms))
	for _, o := range []*op{a, c} {
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.releasedSeqs(); !slices.Equal(got, []uint64{1, 3}) {
		t.Errorf("released %v, want [1 3]", got)
	}
}

// TestClasses: each class goes to its device at its offset; a zero delay
// passes through; discards are writes. delay takes no write-zeroes
// (drivers/md/dm-delay.c: delay_ctr sets num_discard_bios but not
// num_write_zeroes_bios): they reach it as writes of zeros.
func TestClasses(t *testing.T) {
	r := newRig(t)
	tg := r.target("8:16 8 0 8:32 16 10 8:48 0 10")
	ctx := context.Background()
	copy(r.devs["8:16"].Bytes()[8*512:], "read-me")
	buf := make([]byte, 7)
	if _, err := tg.ReadAt(ctx, buf, 0); err != nil || string(buf) != "read-me" {
		t.Fatalf("zero-delay read: %q, %v", buf, err)
	}
	w := r.start(func(ctx context.Context) error {
		_, err := tg.WriteAt(ctx, []byte("written"), 512)
		return err
	}, ctx)
	waitStatus(t, tg, "0 1 0")
	z := r.start(func(ctx context.Context) error {
		_, err := tg.WriteAt(ctx, make([]byte, 512), 0)
		return err
	}, ctx)
	waitStatus(t, tg, "0 2 0")
	d := r.start(func(ctx context.Context) error { return tg.Discard(ctx, 1024, 512) }, ctx)
	waitStatus(t, tg, "0 3 0")
	f := r.start(func(ctx context.Context) error { return tg.Flush(ctx) }, ctx)
	waitStatus(t, tg, "0 3 1")
	wdev := r.devs["8:32"].Bytes()
	for i := range 3 * 512 {
		wdev[16*512+i] = 0xff
	}
	if w.finished() || z.finished() || d.finished() || f.finished() {
		t.Fatal("a delayed request finished before its deadline")
	}
	r.clock.Advance(time.Duration(10 * ms))
	for _, o := range []*op{w, z, d, f} {
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
	}
	got := wdev[16*512:]
	if !bytes.Equal(got[512:519], []byte("written")) || !bytes.Equal(got[:512], make([]byte, 512)) ||
		!bytes.Equal(got[1024:1536], make([]byte, 512)) {
		t.Error("write, zeros or discard did not reach the write device at its offset")
	}
	if r.devs["8:48"].Flushes() != 1 || r.devs["8:32"].Flushes() != 0 || r.devs["8:16"].Flushes() != 0 {
		t.Error("flush did not go to the flush device only")
	}
	if _, ok := any(tg).(stack.ZeroWriter); ok {
		t.Error("delay takes write-zeroes")
	}
}

// TestImpliedClasses: with 3 arguments every class uses the triple; with 6
// flushes use the write triple.
func TestImpliedClasses(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	t6 := r.target("8:16 0 0 8:32 0 10")
	f := r.start(func(ctx context.Context) error { return t6.Flush(ctx) }, ctx)
	waitStatus(t, t6, "0 0 1")
	r.clock.Advance(time.Duration(10 * ms))
	if err := f.result(t); err != nil || r.devs["8:32"].Flushes() != 1 {
		t.Fatalf("6-arg flush: %v, flushes on write device %d", err, r.devs["8:32"].Flushes())
	}
	t3 := r.target("8:48 0 10")
	f = r.start(func(ctx context.Context) error { return t3.Flush(ctx) }, ctx)
	w := r.write(t3, ctx)
	waitStatus(t, t3, "0 1 1")
	r.clock.Advance(time.Duration(10 * ms))
	if err := errors.Join(f.result(t), w.result(t)); err != nil || r.devs["8:48"].Flushes() != 1 {
		t.Fatalf("3-arg flush/write: %v, flushes %d", err, r.devs["8:48"].Flushes())
	}
}

// TestManyConcurrent runs many requests on several targets and classes from
// many goroutines while the clock moves in random steps; no request may
// complete before its deadline, and every one completes.
func TestManyConcurrent(t *testing.T) {
	r := newRig(t)
	targets := []*Target{
		r.target("8:16 0 1 8:32 0 3 8:48 0 0.5"),
		r.target("8:32 0 0.25"),
		r.target("8:48 0 7 8:16 0 0"),
	}
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		tg := targets[i%len(targets)]
		kind := rng.IntN(3)
		cls := tg.cls[kind]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			issued := r.clock.Nanotime()
			var err error
			switch kind {
			case classRead:
				_, err = tg.ReadAt(ctx, make([]byte, 512), int64(i%64)*512)
			case classWrite:
				_, err = tg.WriteAt(ctx, make([]byte, 512), int64(i%64)*512)
			default:
				err = tg.Flush(ctx)
			}
			if err == nil && r.clock.Nanotime() < issued+cls.delay {
				err = errors.New("released before its deadline")
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
			r.clock.Advance(time.Duration(rng.Int64N(300_000)))
			for range 50 {
				runtime.Gosched()
			}
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, tg := range targets {
		waitStatus(t, tg, "0 0 0")
	}
}

// TestSchedulerStops: the loop goroutine ends with the last target and
// starts again with the next one.
func TestSchedulerStops(t *testing.T) {
	r := newRig(t)
	for round := range 2 {
		tg, err := New(r.s, r.ctor(2048), []string{"8:16", "0", "1"})
		if err != nil {
			t.Fatal(err)
		}
		o := r.read(tg, context.Background())
		waitStatus(t, tg, "1 0 0")
		tg.Close() // releases what is queued
		if err := o.result(t); err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			r.s.mu.Lock()
			running := r.s.running
			r.s.mu.Unlock()
			if !running {
				break
			}
			if i > 10_000_000 {
				t.Fatalf("round %d: scheduler still running with no target", round)
			}
			runtime.Gosched()
		}
	}
}

// TestLookupErrorOnce: a table naming a missing device fails with the
// reason the device lookup gave, "Device lookup failed" once
// (drivers/md/dm-delay.c: delay_class_ctr sets ti->error to "Device lookup
// failed" when dm_get_device fails).
func TestLookupErrorOnce(t *testing.T) {
	r := newRig(t)
	reg, err := stack.NewRegistry(NewType(r.s))
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg})
	defer m.Close()
	for _, tc := range []struct{ table, want string }{
		{"0 8 delay nosuch 0 1", "d: line 1: delay: Device lookup failed: nosuch: no such mapped device"},
		{"0 8 delay ./nosuch.img 0 1", "d: line 1: delay: Device lookup failed: ./nosuch.img: no such file or directory"},
	} {
		_, err := m.Create(stack.CreateOptions{Name: "d", Minor: -1, Table: tc.table, Dir: t.TempDir()})
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: %v, want %q", tc.table, err, tc.want)
		}
	}
}

// hintCounter counts hints.Waiting calls.
type hintCounter struct{ n atomic.Int32 }

func (h *hintCounter) Waiting() { h.n.Add(1) }

// TestWaitingHint: a delayed request tells its transport it waits, before
// its delay runs out; a request of a class without delay does not.
func TestWaitingHint(t *testing.T) {
	r := newRig(t)
	tg := r.target("8:16 0 10 8:32 0 0")
	h := &hintCounter{}
	ctx := hints.WithWaiter(context.Background(), h)
	w := r.write(tg, ctx)
	if err := w.result(t); err != nil {
		t.Fatal(err)
	}
	if n := h.n.Load(); n != 0 {
		t.Fatalf("%d hints for an undelayed write", n)
	}
	a := r.read(tg, ctx)
	waitStatus(t, tg, "1 0 0")
	if n := h.n.Load(); n != 1 {
		t.Errorf("%d hints for a queued read, want 1", n)
	}
	r.clock.Advance(time.Duration(10 * ms))
	if err := a.result(t); err != nil {
		t.Fatal(err)
	}
}

// continueRecorder records the order of a request's hints.
type continueRecorder struct {
	mu    sync.Mutex
	hints []string
}

func (c *continueRecorder) Waiting()    { c.add("waiting") }
func (c *continueRecorder) Continuing() { c.add("continuing") }
func (c *continueRecorder) add(s string) {
	c.mu.Lock()
	c.hints = append(c.hints, s)
	c.mu.Unlock()
}

func (c *continueRecorder) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.hints)
}

// waitFor waits until c has n hints (the released request's goroutine
// runs on its own), failing the test if that takes more than 10 s.
func (c *continueRecorder) waitFor(t *testing.T, n int) {
	t.Helper()
	for i := 0; len(c.get()) < n; i++ {
		if i == 10000 {
			t.Fatalf("hints %v, want %d", c.get(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestContinuingHint: a delayed request says it goes on once released,
// ahead of its deadline by the clock's lead and not before, after it said
// it waits; a request no longer than the lead says both at once.
func TestContinuingHint(t *testing.T) {
	r := newRig(t)
	r.clock.lead.Store(2 * ms)
	tg := r.target("8:16 0 10 8:32 0 1") // reads 10 ms, writes 1 ms (no longer than the lead)
	h := &continueRecorder{}
	ctx := hints.WithWaiter(context.Background(), h)
	rd := r.read(tg, ctx)
	waitStatus(t, tg, "1 0 0")
	r.clock.Settle()
	if got := h.get(); !slices.Equal(got, []string{"waiting"}) {
		t.Fatalf("hints while queued: %v", got)
	}
	r.clock.Advance(time.Duration(8 * ms)) // the release, 2 ms early
	waitStatus(t, tg, "0 0 0")
	h.waitFor(t, 2)
	if got := h.get(); !slices.Equal(got, []string{"waiting", "continuing"}) {
		t.Fatalf("hints once released: %v", got)
	}
	stillRunning(t, rd, "an early released read")
	r.clock.Advance(time.Duration(2 * ms))
	if err := rd.result(t); err != nil {
		t.Fatal(err)
	}
	h2 := &continueRecorder{}
	wr := r.write(tg, hints.WithWaiter(context.Background(), h2))
	waitStatus(t, tg, "0 1 0")
	h2.waitFor(t, 2)
	stillRunning(t, wr, "a write shorter than the lead")
	if got := h2.get(); !slices.Equal(got, []string{"waiting", "continuing"}) {
		t.Fatalf("hints of a write shorter than the lead: %v", got)
	}
	r.clock.Advance(time.Duration(ms))
	if err := wr.result(t); err != nil {
		t.Fatal(err)
	}
}

// TestQueueSpinnerThenParked: in a Queue, whose requests have delays of
// their own, a parked request queued behind a spinning one is handed to
// the scheduler when the spinner leaves at its deadline (it was not the
// head when it was queued, so nothing had scheduled it).
func TestQueueSpinnerThenParked(t *testing.T) {
	r := newRig(t)
	r.clock.lead.Store(ms)
	q := r.s.NewQueue()
	t.Cleanup(q.Close)
	queued := func(n int) {
		for i := 0; ; i++ {
			q.q.mu.Lock()
			got := q.q.mu.lists[ClassRead].n
			q.q.mu.Unlock()
			if got == n {
				return
			}
			if i > 10_000_000 {
				t.Fatalf("%d queued, want %d", got, n)
			}
			runtime.Gosched()
		}
	}
	ctx := context.Background()
	short := r.start(func(ctx context.Context) error { return q.Wait(ctx, ClassRead, ms/2) }, ctx)
	queued(1)
	long := r.start(func(ctx context.Context) error { return q.Wait(ctx, ClassRead, 5*ms) }, ctx)
	queued(2)
	r.clock.Advance(time.Duration(ms / 2))
	if err := short.result(t); err != nil {
		t.Fatal(err)
	}
	// The scheduler wakes the clock's Lead before a parked deadline.
	if d := r.clock.Settle(); d != long.issued+5*ms-ms {
		t.Fatalf("after the spinner left, the scheduler waits until %d, want %d", d, long.issued+5*ms-ms)
	}
	r.clock.Advance(time.Duration(5 * ms))
	if err := long.result(t); err != nil {
		t.Fatal(err)
	}
}
