package conformance_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/targets"
	"github.com/dmfuse/dmfuse/targets/conformance"
)

// faultyType is a remapping target type with one fault chosen by its second
// argument, to show that each check of the suite catches the fault it is
// about. Its table line is `<dev> <mode>`; mode "good" has no fault.
var faultyType = &stack.TargetType{Name: "faulty", Version: [3]int{1, 0, 0}, New: newFaulty}

func newFaulty(c *stack.Ctor, args []string) (stack.Target, error) {
	if len(args) != 2 {
		return nil, stack.Errorf("Invalid argument count")
	}
	dev, err := c.Open(args[0])
	if err != nil {
		return nil, err
	}
	f := &faulty{dev: dev, mode: args[1]}
	if f.mode == "absolute" {
		// Uses device offsets instead of segment-relative ones.
		f.shift = c.Begin * stack.SectorSize
	}
	if f.mode == "noflush" {
		return f, nil
	}
	return &flushingFaulty{f}, nil
}

type faulty struct {
	dev      stack.BlockDevice
	mode     string
	shift    int64
	inFlight atomic.Int32
}

type flushingFaulty struct{ *faulty }

func (f *flushingFaulty) Flush(ctx context.Context) error { return f.dev.Flush(ctx) }

// enter fails an I/O that overlaps another in "serial" mode, after giving
// the others time to arrive.
func (f *faulty) enter() error {
	if f.mode != "serial" {
		return nil
	}
	defer f.inFlight.Add(-1)
	if f.inFlight.Add(1) > 1 {
		return syscall.EIO
	}
	time.Sleep(50 * time.Microsecond)
	runtime.Gosched()
	return nil
}

func (f *faulty) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := f.enter(); err != nil {
		return 0, err
	}
	if f.mode == "drop" {
		clear(p)
		return len(p), nil
	}
	return f.dev.ReadAt(ctx, p, off+f.shift)
}

func (f *faulty) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := f.enter(); err != nil {
		return 0, err
	}
	if f.mode == "drop" {
		return len(p), nil
	}
	return f.dev.WriteAt(ctx, p, off+f.shift)
}

func (f *faulty) Status(t stack.StatusType) string {
	switch {
	case t == stack.StatusInfo && f.mode == "ctlinfo":
		return "line\nbreak"
	case t == stack.StatusInfo:
		return ""
	case f.mode == "badtable":
		return stack.EscapeArg(f.dev.Name())
	case f.mode == "rawname":
		return f.dev.Name() + " " + f.mode
	}
	return stack.EscapeArg(f.dev.Name()) + " " + f.mode
}

func (f *faulty) Close() error { return nil }

func faultyEntry(mode string) targets.Entry {
	return targets.Entry{Type: faultyType, Case: targets.Case{Params: func(s targets.Segment) string { return s.Dev + " " + mode }}}
}

// recorder is a testing.TB that records failures instead of failing the
// test, so that a check can be seen to fail.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func (r *recorder) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *recorder) Fail() { r.Errorf("failed") }

func (r *recorder) FailNow() { r.Fatalf("failed") }

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// runRecorded runs check on r in its own goroutine, as Fatal ends it.
func runRecorded(r *recorder, check conformance.Check, e targets.Entry) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r, conformance.Suite{}, e)
	}()
	<-done
}

// TestSuitePassesGoodTarget: a correct remapping target passes every check.
func TestSuitePassesGoodTarget(t *testing.T) {
	conformance.Suite{}.Run(t, faultyEntry("good"))
}

// TestSuiteCatchesFaults: each check fails on a target with the fault it is
// about, with a message that says what went wrong.
func TestSuiteCatchesFaults(t *testing.T) {
	for _, tc := range []struct {
		mode, check, want string
	}{
		{"drop", "ShortReadAtEnd", "read crossing the end: data differs"},
		{"absolute", "SegmentOffsets", "input/output error; want"},
		{"serial", "ConcurrentIO", "input/output error; want"},
		{"noflush", "FlushReachesDevices", "the flush did not reach mem0"},
		{"badtable", "TableRoundTrip", "the printed table does not load again"},
		{"rawname", "EscapedPathRoundTrip", "does not give the device name"},
		{"ctlinfo", "StatusInfoFormat", "status output has 4 lines for 2 targets"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			r := &recorder{TB: t}
			runRecorded(r, conformance.All[tc.check], faultyEntry(tc.mode))
			if !r.Failed() {
				t.Fatalf("%s passed a target with fault %q", tc.check, tc.mode)
			}
			all := strings.Join(r.msgs, "\n")
			if !strings.Contains(all, tc.want) {
				t.Errorf("%s on fault %q failed with\n%s\nwant a message containing %q", tc.check, tc.mode, all, tc.want)
			}
			// The fault is caught by the check that is about it, not only
			// by chance elsewhere: the good target passes the same check.
			g := &recorder{TB: t}
			runRecorded(g, conformance.All[tc.check], faultyEntry("good"))
			if g.Failed() {
				t.Errorf("%s fails the good target too:\n%s", tc.check, strings.Join(g.msgs, "\n"))
			}
		})
	}
}

// TestCases: every case of the list names a check of All in each
// NotApplicable declaration and gives a reason, and has Params; a case that
// builds below its lines says what it stores.
func TestCases(t *testing.T) {
	for _, e := range targets.All() {
		c := e.Case
		for name, why := range c.NotApplicable {
			if _, ok := conformance.All[name]; !ok {
				t.Errorf("%s: NotApplicable names %q, which is no check", e.Type.Name, name)
			}
			if strings.TrimSpace(why) == "" {
				t.Errorf("%s: NotApplicable %q gives no reason", e.Type.Name, name)
			}
		}
		if c.Params == nil {
			t.Errorf("%s: no Params", e.Type.Name)
		}
		if (c.Below == nil) != (c.Stored == nil) {
			t.Errorf("%s: Below and Stored come together", e.Type.Name)
		}
	}
}

// TestConformance runs the suite on every target type dmfuse registers,
// in process.
func TestConformance(t *testing.T) {
	conformance.Suite{}.RunAll(t, targets.All())
}

// belowEntry is the faulty type over a linear device the case builds below
// each segment; with wrongStored, the case's Stored reads that device from
// the wrong offset, which the checks that look below must catch.
func belowEntry(wrongStored bool) targets.Entry {
	return targets.Entry{Type: faultyType, Case: targets.Case{
		Params: func(s targets.Segment) string { return s.Below + " good" },
		Uses:   []*stack.TargetType{stack.Linear},
		Below: func(m *stack.Manager, s targets.Segment) (string, error) {
			d, err := m.Create(stack.CreateOptions{Name: fmt.Sprintf("lin%d", s.Index), Minor: -1, Table: fmt.Sprintf("0 %d linear %s 0", s.Sectors, s.Dev)})
			if err != nil {
				return "", err
			}
			return d.DevNo(), nil
		},
		Stored: func(m *stack.Manager, s targets.Segment, n int64) ([]byte, error) {
			p := make([]byte, n)
			off := int64(0)
			if wrongStored {
				off = stack.SectorSize
				p = p[:n-off]
			}
			_, err := m.Lookup(fmt.Sprintf("lin%d", s.Index)).ReadAt(context.Background(), p, off)
			return p, err
		},
	}}
}

// TestSuiteBelow: a case that builds devices below its lines runs every
// check, and the checks that compare what was stored read it through the
// case's Stored: a Stored that reads the wrong place fails them.
func TestSuiteBelow(t *testing.T) {
	conformance.Suite{}.Run(t, belowEntry(false))
	for check, want := range map[string]string{"SegmentOffsets": "holds other data", "ConcurrentIO": "differs from the model"} {
		r := &recorder{TB: t}
		runRecorded(r, conformance.All[check], belowEntry(true))
		if !r.Failed() || !strings.Contains(strings.Join(r.msgs, "\n"), want) {
			t.Errorf("%s on a case whose Stored reads the wrong offset: %q, want a message containing %q", check, r.msgs, want)
		}
	}
}
