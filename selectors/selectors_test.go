package selectors

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
)

func newSel(t testing.TB, name string, args []string, c clock.Clock) (*Type, Selector) {
	t.Helper()
	typ, ok := Lookup(name)
	if !ok {
		t.Fatalf("Lookup(%q) failed", name)
	}
	s, err := typ.New(args, c)
	if err != nil {
		t.Fatalf("%s.New(%q): %v", name, args, err)
	}
	return typ, s
}

func addPaths(t testing.TB, s Selector, names []string, args ...[]string) []*Path {
	t.Helper()
	ps := make([]*Path, len(names))
	for i, n := range names {
		ps[i] = &Path{Dev: n}
		var a []string
		if i < len(args) {
			a = args[i]
		}
		if err := s.AddPath(ps[i], a); err != nil {
			t.Fatalf("AddPath(%s, %q): %v", n, a, err)
		}
	}
	return ps
}

func pick(s Selector, n int) string {
	var out []string
	for range n {
		p := s.SelectPath(4096)
		if p == nil {
			out = append(out, "-")
			continue
		}
		out = append(out, p.Dev.(string))
	}
	return strings.Join(out, " ")
}

func TestRegistry(t *testing.T) {
	want := []struct {
		name        string
		ver         [3]int
		table, info int
		hr          bool
	}{
		{"historical-service-time", [3]int{0, 1, 1}, 1, 3, true},
		{"queue-length", [3]int{0, 2, 0}, 1, 1, false},
		{"round-robin", [3]int{1, 2, 0}, 1, 0, false},
		{"service-time", [3]int{0, 3, 0}, 2, 2, false},
	}
	got := Types()
	if len(got) != len(want) {
		t.Fatalf("Types() has %d entries, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.name || g.Version != w.ver || g.TableArgs != w.table || g.InfoArgs != w.info || g.HRTimer != w.hr {
			t.Errorf("Types()[%d] = %s %v %d/%d hr=%v, want %s %v %d/%d hr=%v",
				i, g.Name, g.Version, g.TableArgs, g.InfoArgs, g.HRTimer, w.name, w.ver, w.table, w.info, w.hr)
		}
		if l, ok := Lookup(w.name); !ok || l != g {
			t.Errorf("Lookup(%q) disagrees with Types()", w.name)
		}
	}
	for _, bad := range []string{"nosuch", "Round-Robin", "io-affinity", ""} {
		if _, ok := Lookup(bad); ok {
			t.Errorf("Lookup(%q) succeeded", bad)
		}
	}
}

// groupTable and groupStatus render one priority group the way
// drivers/md/dm-mpath.c: multipath_status does, so the selector parts of whole
// multipath status lines can be checked verbatim.
func groupTable(typ *Type, s Selector, ps []*Path) string {
	var b strings.Builder
	b.WriteString(typ.Name + " " + s.Status(nil, StatusTable))
	fmt.Fprintf(&b, "%d %d ", len(ps), typ.TableArgs)
	for _, p := range ps {
		b.WriteString(p.Dev.(string) + " " + s.Status(p, StatusTable))
	}
	return b.String()
}

func groupStatus(typ *Type, s Selector, ps []*Path) string {
	var b strings.Builder
	b.WriteString(s.Status(nil, StatusInfo))
	fmt.Fprintf(&b, "%d %d ", len(ps), typ.InfoArgs)
	for _, p := range ps {
		b.WriteString(p.Dev.(string) + " A 0 " + s.Status(p, StatusInfo))
	}
	return b.String()
}

func TestSpecVectors(t *testing.T) {
	two := []string{"8:16", "8:32"}
	for _, tc := range []struct {
		name       string
		group      []string
		paths      []string
		per        [][]string
		table, inf string
	}{
		// multipath, round-robin: "round-robin 0 2 1 8:16 1000 8:32 1000"
		{"round-robin", nil, two, [][]string{{"1000"}, {"1000"}},
			"round-robin 0 2 1 8:16 1 8:32 1 ", "0 2 0 8:16 A 0 8:32 A 0 "},
		// multipath extra features: "round-robin 0 1 1 8:16 1"
		{"round-robin", nil, two[:1], [][]string{{"1"}},
			"round-robin 0 1 1 8:16 1 ", "0 1 0 8:16 A 0 "},
		// queue-length, bio mode: "queue-length 0 2 1 8:16 128 8:32 128"
		{"queue-length", nil, two, [][]string{{"128"}, {"128"}},
			"queue-length 0 2 1 8:16 1 8:32 1 ", "0 2 1 8:16 A 0 0 8:32 A 0 0 "},
		// two groups, service-time: "service-time 0 1 2 8:16 1 1" / "... 8:32 1 4"
		{"service-time", nil, two[:1], [][]string{{"1", "1"}},
			"service-time 0 1 2 8:16 1 1 ", "0 1 2 8:16 A 0 0 1 "},
		{"service-time", nil, two[1:], [][]string{{"1", "4"}},
			"service-time 0 1 2 8:32 1 4 ", "0 1 2 8:32 A 0 0 4 "},
		// historical-service-time, defaults: "historical-service-time 0 2 1 8:16 1 8:32 1"
		{"historical-service-time", nil, two, [][]string{{"1"}, {"1"}},
			"historical-service-time 2 972 0 2 1 8:16 0 8:32 0 ",
			"2 972 0 2 3 8:16 A 0 1024 0 0 8:32 A 0 1024 0 0 "},
		// "historical-service-time 2 512 2 2 1 8:16 1 8:32 1"
		{"historical-service-time", []string{"512", "2"}, two, [][]string{{"1"}, {"1"}},
			"historical-service-time 2 512 2 2 1 8:16 0 8:32 0 ",
			"2 512 2 2 3 8:16 A 0 1024 0 0 8:32 A 0 1024 0 0 "},
	} {
		typ, s := newSel(t, tc.name, tc.group, &clock.Manual{})
		ps := addPaths(t, s, tc.paths, tc.per...)
		if got := groupTable(typ, s, ps); got != tc.table {
			t.Errorf("%s table:\n got %q\nwant %q", tc.name, got, tc.table)
		}
		if got := groupStatus(typ, s, ps); got != tc.inf {
			t.Errorf("%s status:\n got %q\nwant %q", tc.name, got, tc.inf)
		}
	}
}

func TestPerPathStatus(t *testing.T) {
	for _, tc := range []struct {
		name        string
		args        []string
		table, info string
	}{
		{"round-robin", nil, "1 ", ""},
		{"round-robin", []string{"0"}, "0 ", ""},
		{"round-robin", []string{"1"}, "1 ", ""},
		{"round-robin", []string{"4294967295"}, "1 ", ""},
		{"queue-length", nil, "1 ", "0 "},
		{"queue-length", []string{"0"}, "0 ", "0 "},
		{"queue-length", []string{"128"}, "1 ", "0 "},
		{"service-time", nil, "1 1 ", "0 1 "},
		{"service-time", []string{"0"}, "0 1 ", "0 1 "},
		{"service-time", []string{"7", "0"}, "1 0 ", "0 0 "},
		{"service-time", []string{"1", "100"}, "1 100 ", "0 100 "},
		{"historical-service-time", nil, "0 ", "1024 0 0 "},
		{"historical-service-time", []string{"77"}, "0 ", "1024 0 0 "},
	} {
		_, s := newSel(t, tc.name, nil, &clock.Manual{})
		p := &Path{Dev: "x"}
		if err := s.AddPath(p, tc.args); err != nil {
			t.Fatalf("%s AddPath(%q): %v", tc.name, tc.args, err)
		}
		if got := s.Status(p, StatusTable); got != tc.table {
			t.Errorf("%s %q: TABLE %q, want %q", tc.name, tc.args, got, tc.table)
		}
		if got := s.Status(p, StatusInfo); got != tc.info {
			t.Errorf("%s %q: INFO %q, want %q", tc.name, tc.args, got, tc.info)
		}
		if got := s.Status(&Path{}, StatusTable); got != "" {
			t.Errorf("%s: status of a foreign path = %q, want empty", tc.name, got)
		}
	}
	_, s := newSel(t, "service-time", nil, nil)
	ps := addPaths(t, s, []string{"a", "b"}, []string{"1", "1"}, []string{"1", "4"})
	tr := s.(IOTracker)
	tr.StartIO(ps[1], 4096)
	tr.StartIO(ps[1], 512)
	if got := s.Status(ps[1], StatusInfo); got != "4608 4 " {
		t.Errorf("service-time INFO after 4608 bytes: %q", got)
	}
	_, q := newSel(t, "queue-length", nil, nil)
	qs := addPaths(t, q, []string{"a"})
	q.(IOTracker).StartIO(qs[0], 1)
	q.(IOTracker).StartIO(qs[0], 1)
	if got := q.Status(qs[0], StatusInfo); got != "2 " {
		t.Errorf("queue-length INFO with 2 in flight: %q", got)
	}
}

func TestRoundRobinOrder(t *testing.T) {
	_, s := newSel(t, "round-robin", nil, nil)
	ps := addPaths(t, s, []string{"A", "B"})
	if got := pick(s, 4); got != "A B A B" {
		t.Fatalf("order %q, want A B A B", got)
	}
	s.FailPath(ps[0])
	if got := pick(s, 3); got != "B B B" {
		t.Fatalf("after fail A: %q", got)
	}
	if err := s.ReinstatePath(ps[0]); err != nil {
		t.Fatal(err)
	}
	if got := pick(s, 4); got != "A B A B" {
		t.Fatalf("after reinstate A: %q, want A first", got)
	}

	_, s = newSel(t, "round-robin", nil, nil)
	ps = addPaths(t, s, []string{"A", "B", "C"})
	if got := pick(s, 4); got != "A B C A" {
		t.Fatalf("order %q", got)
	}
	// valid list is now B C A; failing C then reinstating it puts C at the head.
	s.FailPath(ps[2])
	if got := pick(s, 2); got != "B A" {
		t.Fatalf("after fail C: %q", got)
	}
	s.ReinstatePath(ps[2])
	if got := pick(s, 4); got != "C B A C" {
		t.Fatalf("after reinstate C: %q, want C B A C", got)
	}
	// Idempotent fail/reinstate, and no path when all failed.
	for _, p := range ps {
		s.FailPath(p)
		s.FailPath(p)
	}
	if p := s.SelectPath(1); p != nil {
		t.Fatalf("all failed: got %v", p.Dev)
	}
	s.ReinstatePath(ps[1])
	s.ReinstatePath(ps[1])
	if got := pick(s, 2); got != "B B" {
		t.Fatalf("only B: %q", got)
	}
	if err := s.ReinstatePath(&Path{}); err == nil {
		t.Error("reinstating a foreign path succeeded")
	}
	if err := s.AddPath(ps[0], nil); err == nil {
		t.Error("adding a path twice succeeded")
	}
}

func TestQueueLength(t *testing.T) {
	_, s := newSel(t, "queue-length", nil, nil)
	addPaths(t, s, []string{"A", "B", "C"})
	// All idle: ties rotate.
	if got := pick(s, 4); got != "A B C A" {
		t.Fatalf("idle order %q", got)
	}
	_, s = newSel(t, "queue-length", nil, nil)
	tr := s.(IOTracker)
	ps := addPaths(t, s, []string{"A", "B", "C"})
	tr.StartIO(ps[0], 1)
	tr.StartIO(ps[0], 1)
	tr.StartIO(ps[1], 1)
	tr.StartIO(ps[2], 1)
	// A=2 B=1 C=1, list A B C: B (first strictly smallest); list A C B: C; list A B C: B.
	if got := pick(s, 3); got != "B C B" {
		t.Fatalf("loaded order %q, want B C B", got)
	}
	tr.EndIO(ps[0], 1, 0)
	tr.EndIO(ps[0], 1, 0)
	// A=0: stops early at A wherever it is.
	if got := pick(s, 1); got != "A" {
		t.Fatalf("idle A not chosen: %q", got)
	}
	// Reinstate adds at the tail.
	_, s = newSel(t, "queue-length", nil, nil)
	ps = addPaths(t, s, []string{"A", "B", "C"})
	s.FailPath(ps[0])
	s.ReinstatePath(ps[0])
	if got := pick(s, 3); got != "B C A" {
		t.Fatalf("after reinstate A: %q, want B C A", got)
	}
}

func TestServiceTimeWorkedExample(t *testing.T) {
	_, s := newSel(t, "service-time", nil, nil)
	tr := s.(IOTracker)
	ps := addPaths(t, s, []string{"p1", "p2"}, []string{"1", "1"}, []string{"1", "4"})
	tr.StartIO(ps[0], 4096)
	tr.StartIO(ps[1], 8192)
	// st1 = 8192*4 = 32768, st2 = 12288*1 = 12288: p2.
	if p := s.SelectPath(4096); p != ps[1] {
		t.Fatalf("chose %v, want p2", p.Dev)
	}
	if c := stCompare(4096, 8192, 1, 4, 4096); c <= 0 {
		t.Fatalf("stCompare = %d, want > 0 (p2 better)", c)
	}
}

func TestServiceTimeCompare(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sz1, sz2 uint64
		rt1, rt2 uint32
		n        uint64
		want     int32
	}{
		{"equal rt: less loaded", 100, 200, 3, 3, 4096, -100},
		{"equal rt: equal load", 100, 100, 3, 3, 4096, 0},
		{"equal load: higher rt", 100, 100, 1, 4, 4096, 3},
		{"rt 0 loses", 0, 1 << 20, 0, 1, 4096, 1},
		{"rt 0 loses (p2)", 1 << 20, 0, 1, 0, 4096, -1},
		{"both loaded, estimate", 4096, 8192, 1, 4, 4096, 32768 - 12288},
		{"equal estimate: higher rt", 0, 4096, 1, 2, 4096, 1},
		// SIZE_MAX>>7: once either size (plus the I/O) reaches it, both are
		// shifted right by 7 before multiplying. Here the shift flips the
		// answer: unshifted st1-st2 = 2^57+54 (p2 better), shifted
		// (2^50)*2 - (2^50+1) = 2^50-1, whose low 32 bits read as -1.
		{"overflow shift", 1<<57 + 127, 1<<57 + 200, 1, 2, 0, -1},
		// One below the limit: no shift, st1-st2 = (2^57-2)*2 - 10, whose low
		// 32 bits are 2^32-14, read as -14.
		{"just below the shift", stMaxInflightSize - 1, 10, 1, 2, 0, -14},
	} {
		if got := stCompare(tc.sz1, tc.sz2, tc.rt1, tc.rt2, tc.n); got != tc.want {
			t.Errorf("%s: stCompare = %d, want %d", tc.name, got, tc.want)
		}
	}
	// Ties keep the earlier path; the chosen path moves to the tail.
	_, s := newSel(t, "service-time", nil, nil)
	addPaths(t, s, []string{"A", "B", "C"})
	if got := pick(s, 4); got != "A B C A" {
		t.Fatalf("tie order %q", got)
	}
	// A path with rt 0 is used only when nothing else is valid.
	_, s = newSel(t, "service-time", nil, nil)
	ps := addPaths(t, s, []string{"Z", "B"}, []string{"1", "0"}, []string{"1", "1"})
	tr := s.(IOTracker)
	for range 5 {
		p := s.SelectPath(4096)
		if p != ps[1] {
			t.Fatalf("rt 0 path chosen over a loaded rt 1 path")
		}
		tr.StartIO(p, 4096)
	}
	s.FailPath(ps[1])
	if p := s.SelectPath(4096); p != ps[0] {
		t.Fatalf("rt 0 path not used as the last resort")
	}
}

func TestConstructorErrors(t *testing.T) {
	for _, tc := range []struct {
		name        string
		group, per  []string
		arg, kernel string
	}{
		{"historical-service-time", []string{"1024"}, nil, "base_weight", "path selector constructor failed"},
		{"historical-service-time", []string{"99999"}, nil, "base_weight", "path selector constructor failed"},
		{"historical-service-time", []string{"-1"}, nil, "base_weight", "path selector constructor failed"},
		{"historical-service-time", []string{"972", "x"}, nil, "threshold_multiplier", "path selector constructor failed"},
		{"historical-service-time", []string{"1", "2", "3"}, nil, "", "path selector constructor failed"},
		{"historical-service-time", nil, []string{"1", "2"}, "", "historical-service-time ps: incorrect number of arguments"},
		{"historical-service-time", nil, []string{"1x"}, "repeat_count", "historical-service-time ps: invalid repeat count"},
		{"round-robin", nil, []string{"1", "2"}, "", "round-robin ps: incorrect number of arguments"},
		{"round-robin", nil, []string{"+1"}, "repeat_count", "round-robin ps: invalid repeat count"},
		{"queue-length", nil, []string{"1", "2"}, "", "queue-length ps: incorrect number of arguments"},
		{"queue-length", nil, []string{"0x10"}, "repeat_count", "queue-length ps: invalid repeat count"},
		{"service-time", nil, []string{"1", "2", "3"}, "", "service-time ps: incorrect number of arguments"},
		{"service-time", nil, []string{"", "1"}, "repeat_count", "service-time ps: invalid repeat count"},
		{"service-time", nil, []string{"1", "101"}, "relative_throughput", "service-time ps: invalid relative_throughput value"},
		{"service-time", nil, []string{"1", "1 "}, "relative_throughput", "service-time ps: invalid relative_throughput value"},
	} {
		typ, _ := Lookup(tc.name)
		var err error
		s, cerr := typ.New(tc.group, nil)
		if tc.per == nil {
			err = cerr
		} else {
			if cerr != nil {
				t.Fatal(cerr)
			}
			p := &Path{}
			err = s.AddPath(p, tc.per)
			if err != nil && p.pi != nil {
				t.Errorf("%s %q: failed AddPath bound the path", tc.name, tc.per)
			}
		}
		var ae *ArgError
		if !errors.As(err, &ae) {
			t.Errorf("%s %q/%q: err = %v, want *ArgError", tc.name, tc.group, tc.per, err)
			continue
		}
		if ae.Kernel != tc.kernel || ae.Arg != tc.arg || ae.Selector != tc.name {
			t.Errorf("%s %q/%q: got %+v, want arg %q kernel %q", tc.name, tc.group, tc.per, ae, tc.arg, tc.kernel)
		}
		if !strings.HasPrefix(err.Error(), tc.kernel) || !strings.Contains(err.Error(), tc.arg) {
			t.Errorf("%s: message %q does not start with the kernel text or name the arg", tc.name, err)
		}
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s: %v is not EINVAL", tc.name, err)
		}
	}
	t.Logf("e.g. %v", func() error { _, err := newHST([]string{"1024"}, nil); return err }())
	t.Logf("e.g. %v", func() error {
		_, s := newSel(t, "round-robin", nil, nil)
		return s.AddPath(&Path{}, []string{"1", "2"})
	}())
	// Group args are ignored by the other selectors.
	for _, n := range []string{"round-robin", "queue-length", "service-time"} {
		newSel(t, n, []string{"whatever", "1", "2", "3"}, nil)
	}
}
