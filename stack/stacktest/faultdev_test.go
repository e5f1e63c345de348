package stacktest_test

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestFaultDeviceRules: a rule fails only the operations and the range it
// names, only after its After I/Os and only Times times; removing it lets
// I/O through again; Count counts every I/O that reached the device, failed
// ones included; hooks see each I/O they fire on.
func TestFaultDeviceRules(t *testing.T) {
	ctx := context.Background()
	d, mem := stacktest.NewMemFaultDevice("f", 1<<20)
	if d.Name() != "f" || d.Size() != 1<<20 || d.Device() != stack.BlockDevice(mem) {
		t.Fatalf("name %q size %d", d.Name(), d.Size())
	}
	p := bytes.Repeat([]byte{1}, 4096)
	r := d.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Write), Off: 8192, Len: 4096, After: 1, Times: 2, Err: syscall.ENOSPC})
	want := []error{nil, nil, syscall.ENOSPC, syscall.ENOSPC, nil}
	offs := []int64{0, 8192, 4096 + 2048, 8192 + 4095, 8192}
	for i, off := range offs {
		_, err := d.WriteAt(ctx, p, off)
		if !errors.Is(err, want[i]) || (want[i] == nil) != (err == nil) {
			t.Errorf("write %d at %d: %v, want %v", i, off, err, want[i])
		}
	}
	if r.Fired() != 2 {
		t.Errorf("fired %d times, want 2", r.Fired())
	}
	// Reads are not in the rule's ops.
	if _, err := d.ReadAt(ctx, make([]byte, 4096), 8192); err != nil {
		t.Errorf("read: %v", err)
	}
	all := d.Fail(ioop.All, syscall.EIO)
	if err := d.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("flush under a rule on every op: %v", err)
	}
	if err := d.Discard(ctx, 0, 512); !errors.Is(err, syscall.EIO) {
		t.Errorf("discard: %v", err)
	}
	if err := d.WriteZeroes(ctx, 0, 512); !errors.Is(err, syscall.EIO) {
		t.Errorf("write-zeroes: %v", err)
	}
	if mem.Flushes() != 0 {
		t.Errorf("a failed flush reached the device below")
	}
	all.Remove()
	if err := d.Flush(ctx); err != nil || mem.Flushes() != 1 {
		t.Errorf("flush after Remove: %v, %d flushes below", err, mem.Flushes())
	}
	if got := d.Count(ioop.SetOf(ioop.Write)); got != 5 {
		t.Errorf("Count(write) = %d, want 5", got)
	}
	if got := d.Count(ioop.All); got != 10 {
		t.Errorf("Count(all) = %d, want 10", got)
	}
	var seen []string
	d.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Read, ioop.Discard), Hook: func(_ context.Context, op ioop.Op, off, n int64) {
		seen = append(seen, op.String())
	}})
	d.ReadAt(ctx, make([]byte, 512), 0)
	d.WriteAt(ctx, p, 0)
	d.Discard(ctx, 0, 512)
	if len(seen) != 2 || seen[0] != "read" || seen[1] != "discard" {
		t.Errorf("hook saw %q, want [read discard]", seen)
	}
	d.Clear()
}

// TestFaultDeviceHold: a Hold rule delivers each I/O it holds, which
// completes only once released, in the order the test chooses; removing
// the rule releases what it still holds.
func TestFaultDeviceHold(t *testing.T) {
	ctx := context.Background()
	d, mem := stacktest.NewMemFaultDevice("h", 1<<20)
	r := d.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Write, ioop.Flush), Hold: true})
	done := make(chan int64, 3)
	for _, off := range []int64{0, 4096} {
		go func() {
			d.WriteAt(ctx, []byte{byte(off/4096 + 1)}, off)
			done <- off
		}()
	}
	go func() {
		d.Flush(ctx)
		done <- -1
	}()
	held := map[int64]*stacktest.Held{}
	for range 3 {
		h := <-r.Held()
		if h.Op == ioop.Flush {
			held[-1] = h
		} else {
			held[h.Off] = h
		}
	}
	select {
	case off := <-done:
		t.Fatalf("I/O at %d completed while held", off)
	case <-time.After(10 * time.Millisecond):
	}
	held[4096].Release()
	held[4096].Release() // twice does nothing
	if off := <-done; off != 4096 || mem.Bytes()[4096] != 2 || mem.Bytes()[0] != 0 {
		t.Fatalf("released the write at 4096, %d completed (data %d %d)", off, mem.Bytes()[0], mem.Bytes()[4096])
	}
	r.Remove()
	got := map[int64]bool{<-done: true, <-done: true}
	if !got[0] || !got[-1] || mem.Bytes()[0] != 1 || mem.Flushes() != 1 {
		t.Errorf("Remove did not release the write at 0 and the flush: %v", got)
	}
	if _, err := d.WriteAt(ctx, []byte{3}, 0); err != nil {
		t.Errorf("write after Remove: %v", err)
	}
}

// TestFaultDeviceNameAndLimits: a named fault device prints as its own name
// over another device's storage, and SetLimits replaces the limits it
// passes on from the device below.
func TestFaultDeviceNameAndLimits(t *testing.T) {
	ctx := context.Background()
	mem := stacktest.NewMemDevice("a", 4096)
	a, b := stacktest.NewFaultDevice(mem), stacktest.NewNamedFaultDevice("b", mem)
	if a.Name() != "a" || b.Name() != "b" {
		t.Errorf("names %q, %q; want a, b", a.Name(), b.Name())
	}
	if _, err := b.WriteAt(ctx, []byte{9}, 100); err != nil || mem.Bytes()[100] != 9 {
		t.Errorf("a write through b did not reach the storage: %v", err)
	}
	if got, want := a.Limits(), (stack.Limits{Discard: true, WriteZeroes: true}); got != want {
		t.Errorf("limits of a memory device: %+v, want %+v", got, want)
	}
	a.SetLimits(stack.Limits{WriteZeroes: true})
	if got := stack.LimitsOf(a); got != (stack.Limits{WriteZeroes: true}) {
		t.Errorf("limits after SetLimits: %+v", got)
	}
}
