package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeExporter is an Exporter that exports every device as 7:minor+100,
// with users set by the test, and records freezes and thaws.
type fakeExporter struct {
	m     *Manager
	mu    sync.Mutex
	users map[string]int32
	log   []string
	// thawErr is what Thaw returns.
	thawErr error
}

func (e *fakeExporter) Block(d *Device) (uint32, uint32, bool) { return 7, d.Minor() + 100, true }

func (e *fakeExporter) Users(d *Device) (int32, int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.users[d.Name()], 0
}

func (e *fakeExporter) Lookup(major, minor uint32) *Device {
	for _, d := range e.m.Devices() {
		if major == 7 && d.Minor()+100 == minor {
			return d
		}
	}
	return nil
}

func (e *fakeExporter) setUsers(name string, n int32) {
	e.mu.Lock()
	e.users[name] = n
	e.mu.Unlock()
}

func (e *fakeExporter) Freeze(d *Device) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, "freeze "+d.Name())
	return nil
}

func (e *fakeExporter) Thaw(d *Device) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, "thaw "+d.Name())
	return e.thawErr
}

func (e *fakeExporter) events() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.log
	e.log = nil
	return out
}

func newExportManager(t *testing.T) (*Manager, *fakeExporter) {
	t.Helper()
	reg, err := NewRegistry(Linear, Zero, Error)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := NewManager(ManagerOptions{Registry: reg, Context: ctx})
	e := &fakeExporter{m: m, users: map[string]int32{}}
	m.SetExporter(e)
	t.Cleanup(func() { m.Close(); cancel() })
	return m, e
}

func mustCreate(t *testing.T, m *Manager, name, table string) *Device {
	t.Helper()
	d, err := m.Create(CreateOptions{Name: name, Minor: -1, Table: table, NoTable: table == ""})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitGone waits (bounded) for the manager to forget name.
func waitGone(t *testing.T, m *Manager, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); m.Lookup(name) != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("%s still there", name)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDeferredRemove(t *testing.T) {
	m, e := newExportManager(t)
	d := mustCreate(t, m, "d", "0 8 zero")
	// An unused device goes at once, deferred or not.
	mustCreate(t, m, "free", "0 8 zero")
	if err := m.Remove("free", Flags{Deferred: true}); err != nil || m.Lookup("free") != nil {
		t.Fatalf("deferred remove of an unused device: %v", err)
	}
	var mu sync.Mutex
	var removed []string
	m.Subscribe(Listener{OnRemove: func(d *Device) { mu.Lock(); removed = append(removed, d.Name()); mu.Unlock() }})

	// Open through its file: EBUSY without --deferred; flagged with it.
	d.AddOpen(1)
	if err := m.Remove("d", Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("remove of an open device: %v", err)
	}
	if err := m.Remove("d", Flags{Deferred: true}); err != nil {
		t.Fatal(err)
	}
	if in := d.Info(false); !in.DeferredRemove || m.Lookup("d") != d {
		t.Fatalf("after remove --deferred: %+v", in)
	}
	// A plain remove of the flagged, open device still fails.
	if err := m.Remove("d", Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("remove of a flagged open device: %v", err)
	}
	// @cancel_deferred_remove takes exactly one word, then clears the flag.
	if _, err := m.Message(context.Background(), "d", 0, []string{"@cancel_deferred_remove", "x"}); err == nil ||
		err.Error() != "d: Invalid arguments for @cancel_deferred_remove" {
		t.Fatalf("cancel with an argument: %v", err)
	}
	if _, err := m.Message(context.Background(), "d", 0, []string{"@CANCEL_DEFERRED_REMOVE"}); err != nil {
		t.Fatal(err)
	}
	if d.DeferredRemove() {
		t.Fatal("flag still set after @cancel_deferred_remove")
	}
	d.AddOpen(-1)
	time.Sleep(3 * ReapInterval)
	if m.Lookup("d") != d {
		t.Fatal("a cancelled deferred removal removed the device")
	}

	// The users of the exported block device count too (a mount, say).
	e.setUsers("d", 1)
	if err := m.Remove("d", Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("remove of a device whose block device is in use: %v", err)
	}
	if err := m.Remove("d", Flags{Deferred: true}); err != nil {
		t.Fatal(err)
	}
	if got := m.OpenCount(d); got != 1 {
		t.Errorf("open count %d, want 1", got)
	}
	e.setUsers("d", 0)
	waitGone(t, m, "d")
	// The device leaves the table of names before OnRemove runs (outside
	// the manager's lock), so the hook may lag the lookup by a moment.
	var saw []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		saw = append(saw[:0], removed...)
		mu.Unlock()
		if len(saw) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if !reflect.DeepEqual(saw, []string{"d"}) {
		t.Errorf("OnRemove saw %v", saw)
	}
	if _, err := m.Message(context.Background(), "d", 0, []string{"@cancel_deferred_remove"}); !errors.Is(err, syscall.ENXIO) {
		t.Errorf("cancel on a removed device: %v", err)
	}
}

// TestDeferredRemoveStacked: a device another table stacks on is removed once
// the upper device goes.
func TestDeferredRemoveStacked(t *testing.T) {
	m, _ := newExportManager(t)
	mustCreate(t, m, "low", "0 8 zero")
	mustCreate(t, m, "up", "0 8 linear low 0")
	if err := m.Remove("low", Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("remove of a held device: %v", err)
	}
	if err := m.Remove("low", Flags{Deferred: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("up", Flags{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, m, "low")
}

func TestRemoveUnused(t *testing.T) {
	m, _ := newExportManager(t)
	mustCreate(t, m, "a", "0 8 zero")
	mustCreate(t, m, "b", "0 8 linear a 0")
	mustCreate(t, m, "c", "0 8 linear b 0")
	open := mustCreate(t, m, "o", "0 8 zero")
	open.AddOpen(1)
	if left := m.RemoveAll(Flags{}); !reflect.DeepEqual(left, []string{"o"}) {
		t.Fatalf("left %v", left)
	}
	if left := m.RemoveAll(Flags{Deferred: true}); !reflect.DeepEqual(left, []string{"o"}) || !open.DeferredRemove() {
		t.Fatalf("deferred: left %v, flagged %v", left, open.DeferredRemove())
	}
	open.AddOpen(-1)
	waitGone(t, m, "o")
}

func TestWaitEvent(t *testing.T) {
	m, _ := newExportManager(t)
	d := mustCreate(t, m, "w", "0 8 zero")
	// Not equal returns at once, whether above or below.
	for _, nr := range []uint32{1, 7} {
		if n, err := m.WaitEvent(context.Background(), "w", nr); err != nil || n != 0 {
			t.Fatalf("wait %d: %d %v", nr, n, err)
		}
	}
	got := make(chan uint32)
	go func() {
		n, _ := d.WaitEvent(context.Background(), 0)
		got <- n
	}()
	select {
	case n := <-got:
		t.Fatalf("wait returned %d before any event", n)
	case <-time.After(20 * time.Millisecond):
	}
	if err := m.Rename("w", "w2"); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != 1 {
		t.Fatalf("wait after rename: %d", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if _, err := m.WaitEvent(ctx, "w2", d.EventNr()); !errors.Is(err, syscall.EINTR) {
		t.Fatalf("cancelled wait: %v", err)
	}
	if _, err := m.WaitEvent(context.Background(), "nope", 0); !errors.Is(err, syscall.ENXIO) {
		t.Fatalf("wait on a missing device: %v", err)
	}
}

func TestDepsAndExportedNames(t *testing.T) {
	m, _ := newExportManager(t)
	dir := t.TempDir()
	f := filepath.Join(dir, "f.img")
	if err := os.WriteFile(f, make([]byte, 64*SectorSize), 0o600); err != nil {
		t.Fatal(err)
	}
	low := mustCreate(t, m, "low", "0 8 zero")
	if maj, min := m.DevNo(low); maj != DefaultMajor || min != 0 || low.DevNo() != "240:0" {
		t.Errorf("DevNo %d:%d (%s), want the manager's major and the device's minor", maj, min, low.DevNo())
	}
	// 7:100 is low's exported number: it resolves in-process.
	top := mustCreate(t, m, "top", "0 8 linear "+f+" 0\n8 8 linear 7:100 0\n16 8 linear "+f+" 8")
	deps := m.Deps(top, false)
	if len(deps) != 2 || deps[0].Mapped != low || deps[1].Path != f || deps[1].Block {
		t.Fatalf("deps %+v", deps)
	}
	if err := m.Remove("low", Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("low is held by top's table: %v", err)
	}
	if got := m.Deps(low, false); len(got) != 0 {
		t.Errorf("deps of zero: %+v", got)
	}
	// A table naming its own exported number is refused.
	if err := m.Load("low", "0 8 linear 7:100 0", ""); err == nil || err.Error() != "low: line 1: linear: table may not reference the device itself" {
		t.Errorf("self reference: %v", err)
	}
}

func TestSuspendLockFS(t *testing.T) {
	m, e := newExportManager(t)
	mustCreate(t, m, "s", "0 8 zero")
	steps := []struct {
		op   func() error
		want []string
	}{
		{func() error { return m.Suspend("s", Flags{NoLockFS: true}) }, nil},
		{func() error { return m.Resume("s", Flags{}) }, []string{"thaw s"}},
		{func() error { return m.Suspend("s", Flags{}) }, []string{"freeze s"}},
		// Suspending a suspended device freezes nothing more.
		{func() error { return m.Suspend("s", Flags{}) }, nil},
		{func() error { return m.Resume("s", Flags{}) }, []string{"thaw s"}},
		{func() error { return m.Suspend("s", Flags{NoFlush: true}) }, nil},
		{func() error { return m.Resume("s", Flags{}) }, []string{"thaw s"}},
		// A resume that swaps tables suspends with its own flags.
		{func() error { return m.Load("s", "0 16 zero", "") }, nil},
		{func() error { return m.Resume("s", Flags{}) }, []string{"freeze s", "thaw s"}},
		{func() error { return m.Load("s", "0 8 zero", "") }, nil},
		{func() error { return m.Resume("s", Flags{NoLockFS: true}) }, []string{"thaw s"}},
	}
	for i, s := range steps {
		if err := s.op(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := e.events(); !reflect.DeepEqual(got, s.want) {
			t.Errorf("step %d: exporter saw %v, want %v", i, got, s.want)
		}
	}
}

// TestResumeThawFails: a thaw that fails fails the resume, which resumed
// the device all the same; the error names the device and keeps the errno.
func TestResumeThawFails(t *testing.T) {
	m, e := newExportManager(t)
	mustCreate(t, m, "s", "0 8 zero")
	if err := m.Suspend("s", Flags{}); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.thawErr = fmt.Errorf("thawing the file system frozen at /mnt: %w", syscall.EIO)
	e.mu.Unlock()
	err := m.Resume("s", Flags{})
	if !errors.Is(err, syscall.EIO) || err.Error() != "s: thawing the file system frozen at /mnt: input/output error" {
		t.Errorf("resume with a failing thaw: %v", err)
	}
	if d := m.Lookup("s"); d.Suspended() {
		t.Error("the device stayed suspended")
	}
}
