package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestHandover: a reload of a snapshot over the same COW keeps its
// exceptions (transient ones too), usage and Overflow; a second device over
// a live snapshot's COW loads but its resume fails until the first is
// suspended, then takes over and the first fails its I/O; a third load
// while a handover waits is refused; a source removed before its
// destination resumes leaves the destination Invalid with chunk 0.
func TestHandover(t *testing.T) {
	for _, store := range []string{"P 8", "N 8", "PO 8"} {
		t.Run(store, func(t *testing.T) {
			r := newRig(t)
			r.memDev("o", 1<<20)
			r.memDev("c", 6*4096)
			r.create("s", "0 2048 snapshot o c "+store)
			r.create("base", "0 2048 snapshot-origin o")
			r.mustWrite("s", []byte("mine"), 4096)
			r.mustWrite("base", []byte("later"), 0)
			if store == "PO 8" {
				for i := int64(2); i < 6; i++ {
					r.write("s", []byte{1}, i*4096)
				}
			}
			st := r.status("s")
			r.mustReload("s", "0 2048 snapshot o c "+store)
			if got := r.status("s"); got != st {
				t.Errorf("status after reload %q, before %q", got, st)
			}
			if got := r.mustRead("s", 4096, 4); string(got) != "mine" {
				t.Errorf("the snapshot's own write after reload: %q", got)
			}
			if got := r.mustRead("s", 0, 5); bytes.Equal(got, []byte("later")) {
				t.Error("the snapshot sees the origin's later write after reload")
			}
		})
	}

	r := newRig(t)
	r.memDev("o", 1<<20)
	r.memDev("c", 1<<20)
	r.create("s1", "0 2048 snapshot o c P 8")
	r.mustWrite("s1", []byte("one"), 0)
	mustCreateEmpty(r, "s2")
	if err := r.mgr.Load("s2", "0 2048 snapshot o c P 8", ""); err != nil {
		t.Fatal(err)
	}
	if got := r.table("s2"); got != "" {
		t.Errorf("s2 has a live table: %q", got)
	}
	if tb := r.dev("s2").FormatTable(stack.StatusTable, true); !strings.Contains(tb, "P 0") {
		t.Errorf("a waiting destination's table %q, want chunk 0", tb)
	}
	err := r.mgr.Resume("s2", stack.Flags{})
	if err == nil || !strings.Contains(err.Error(), "Unable to perform snapshot handover until source is suspended.") {
		t.Fatalf("resume while the source runs: %v", err)
	}
	mustCreateEmpty(r, "s3")
	if err := r.mgr.Load("s3", "0 2048 snapshot o c P 8", ""); err == nil || !strings.Contains(err.Error(), "Snapshot cow pairing for exception table handover failed") {
		t.Errorf("a third load: %v", err)
	}
	if err := r.mgr.Suspend("s1", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	// s2's table went live at the failed resume, as in dm; it is still
	// suspended.
	if err := r.mgr.Resume("s2", stack.Flags{}); err != nil {
		t.Fatalf("resume once the source is suspended: %v", err)
	}
	if got := r.mustRead("s2", 0, 3); string(got) != "one" {
		t.Errorf("s2 reads %q", got)
	}
	if err := r.mgr.Resume("s1", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if got := r.status("s1"); got != "0 2048 snapshot Invalid" {
		t.Errorf("the old source: %q", got)
	}
	if _, err := r.read("s1", 0, 512); !isErrno(err, syscall.EIO) {
		t.Errorf("the old source reads: %v", err)
	}

	// Cancelled: the source goes first.
	r2 := newRig(t)
	r2.memDev("o", 1<<20)
	r2.memDev("c", 1<<20)
	r2.create("a", "0 2048 snapshot o c P 8")
	mustCreateEmpty(r2, "b")
	if err := r2.mgr.Load("b", "0 2048 snapshot o c P 8", ""); err != nil {
		t.Fatal(err)
	}
	if err := r2.mgr.Remove("a", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if err := r2.mgr.Resume("b", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if got, tb := r2.status("b"), r2.table("b"); got != "0 2048 snapshot Invalid" || !strings.HasSuffix(tb, "P 0") {
		t.Errorf("after a cancelled handover: status %q, table %q", got, tb)
	}
}

// mergeRig is an origin o (4 MiB of a pattern) with its snapshot s on COW
// c (P 8), s2 on c2, the origin written through base after both were made,
// and the snapshot written: what s reads is what the merge must leave in
// the origin. The origin is behind a FaultDevice.
type mergeRig struct {
	*rig
	origin *stacktest.FaultDevice
	view   []byte // what s reads before the merge
	view2  []byte // what s2 reads
	// sectors is the devices' size (8192 when 0).
	sectors int64
}

const mergeSize = 4 << 20

func newMergeRig(t *testing.T) *mergeRig {
	r := newRig(t)
	fd, mem := stacktest.NewMemFaultDevice("o", mergeSize)
	mem.WriteAt(bgCtx, fill(3, mergeSize), 0)
	r.add("o", fd)
	r.memDev("c", 8<<20)
	r.memDev("c2", 8<<20)
	m := &mergeRig{rig: r, origin: fd}
	r.create("s", "0 8192 snapshot o c P 8")
	r.create("s2", "0 8192 snapshot o c2 P 16")
	r.create("base", "0 8192 snapshot-origin o")
	for i := int64(0); i < 300; i++ {
		// Every third chunk: runs of one chunk, and some of two.
		off := (i * 3 * 4096) % mergeSize
		r.mustWrite("base", fill(uint64(i), 700), off+100)
		r.mustWrite("s", fill(uint64(i+1000), 300), off+2000)
	}
	m.view, m.view2 = r.mustRead("s", 0, mergeSize), r.mustRead("s2", 0, mergeSize)
	return m
}

// startMerge does what lvconvert --merge does: the origin's device gets a
// snapshot-merge table and the snapshot's an error table; the origin's
// resume hands the exceptions over and starts the merge.
func (m *mergeRig) startMerge() {
	m.t.Helper()
	for _, d := range []string{"base", "s"} {
		if err := m.mgr.Suspend(d, stack.Flags{}); err != nil {
			m.t.Fatal(err)
		}
	}
	n := m.sectors
	if n == 0 {
		n = 8192
	}
	if err := m.mgr.Load("base", fmt.Sprintf("0 %d snapshot-merge o c P 8", n), ""); err != nil {
		m.t.Fatal(err)
	}
	if err := m.mgr.Load("s", fmt.Sprintf("0 %d error", n), ""); err != nil {
		m.t.Fatal(err)
	}
	for _, d := range []string{"base", "s"} {
		if err := m.mgr.Resume(d, stack.Flags{}); err != nil {
			m.t.Fatal(err)
		}
	}
}

// waitMerged waits until the merge has finished: allocated == metadata.
func (m *mergeRig) waitMerged() {
	m.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		f := strings.Fields(m.status("base"))
		if len(f) == 5 {
			used, _, _ := strings.Cut(f[3], "/")
			if used == f[4] {
				return
			}
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("the merge did not finish: %q", m.status("base"))
		}
	}
}

// TestMerge: lvconvert --merge's sequence merges the snapshot into the
// origin: at the end the origin reads what the snapshot read, the status is
// 16/<cow> 16, the COW's store is empty and the other snapshot kept its
// view; writes during the merge land; a second merge on the origin is
// refused.
func TestMerge(t *testing.T) {
	m := newMergeRig(t)
	mustCreateEmpty(m.rig, "other")
	m.startMerge()
	// Writes while merging: to chunks the snapshot copied and to others.
	want := append([]byte(nil), m.view...)
	for _, off := range []int64{3 * 4096, 4096 + 10, 1 << 20} {
		p := fill(uint64(off), 5000)
		m.mustWrite("base", p, off)
		copy(want[off:], p)
	}
	m.waitMerged()
	if got := m.status("base"); got != fmt.Sprintf("0 8192 snapshot-merge 16/%d 16", (8<<20)/512) {
		t.Errorf("status at the end %q", got)
	}
	if got := m.mustRead("base", 0, mergeSize); !bytes.Equal(got, want) {
		t.Errorf("origin after the merge: %s", hexdiff(got, want))
	}
	if got := m.mustRead("s2", 0, mergeSize); !bytes.Equal(got, m.view2) {
		t.Errorf("the other snapshot after the merge: %s", hexdiff(got, m.view2))
	}
	st, err := ReadStore(bytes.NewReader(memBytes(t, m.mems["c"])), 8<<20)
	if err != nil || len(st.Exceptions) != 0 {
		t.Errorf("the merged COW's store: %+v, %v", st, err)
	}
	// A second merge of the origin.
	if err := m.mgr.Load("other", "0 8192 snapshot-merge o c2 P 16", ""); err == nil || !strings.Contains(err.Error(), "A snapshot is already merging.") {
		t.Errorf("a second merge: %v", err)
	}
}

// TestMergeStopsAndResumes: a merge suspended in the middle has merged part
// of the store and goes on at resume; the origin device removed mid-merge
// and loaded fresh with snapshot-merge (a new daemon, a reactivation)
// merges the rest from the COW; the result is the snapshot's view.
func TestMergeStopsAndResumes(t *testing.T) {
	m := newMergeRig(t)
	held := m.origin.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Write), After: 20, Times: 1, Hold: true})
	m.startMerge()
	h := <-held.Held()
	done := make(chan error)
	go func() { done <- m.mgr.Suspend("base", stack.Flags{}) }()
	time.Sleep(20 * time.Millisecond)
	h.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mid := m.status("base")
	f := strings.Fields(mid)
	if used, _, _ := strings.Cut(f[3], "/"); used == f[4] {
		t.Fatalf("the merge finished before the suspend: %q", mid)
	}
	time.Sleep(20 * time.Millisecond)
	if got := m.status("base"); got != mid {
		t.Errorf("the merge went on while suspended: %q then %q", mid, got)
	}
	if err := m.mgr.Resume("base", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	// Suspend again at once and replace the device: a fresh load.
	if err := m.mgr.Remove("base", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if err := m.mgr.Remove("s", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	m.create("base", "0 8192 snapshot-merge o c P 8")
	m.waitMerged()
	if got := m.mustRead("base", 0, mergeSize); !bytes.Equal(got, m.view) {
		t.Errorf("origin after a merge resumed from the COW: %s", hexdiff(got, m.view))
	}
}

// TestMergeFails: a write error on the origin during a merge stops it with
// Merge failed; the chunks not merged still read from the COW, and the
// origin goes on.
func TestMergeFails(t *testing.T) {
	m := newMergeRig(t)
	m.origin.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Write), After: 10, Times: 1, Err: syscall.EIO})
	m.startMerge()
	for deadline := time.Now().Add(10 * time.Second); m.status("base") != "0 8192 snapshot-merge Merge failed"; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("status %q", m.status("base"))
		}
	}
	if got := m.mustRead("base", 0, mergeSize); !bytes.Equal(got, m.view) {
		t.Errorf("after a failed merge: %s", hexdiff(got, m.view))
	}
	m.mustWrite("base", []byte{1}, 0)
}

var _ = errors.Is
