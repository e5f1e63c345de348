package crash

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/logwrites"
)

// tEntry is an entry of a test log: a write of Count units at Sector
// filled with byte Fill, a flush, a FUA write, a discard or a mark.
type tEntry struct {
	Sector, Count uint64
	Flags         uint64
	Fill          byte
	Mark          string
}

const tUnit = 512

// buildLog writes a log of the entries in log-writes' format.
func buildLog(ents []tEntry) []byte {
	var b bytes.Buffer
	u := make([]byte, tUnit)
	logwrites.PutSuper(u, logwrites.Super{Magic: logwrites.Magic, Version: logwrites.Version, NrEntries: uint64(len(ents)), SectorSize: tUnit})
	b.Write(u)
	for _, e := range ents {
		h := logwrites.Header{Sector: e.Sector, NrSectors: e.Count, Flags: e.Flags}
		if e.Mark != "" {
			h.DataLen = uint64(len(e.Mark))
		}
		logwrites.PutHeader(u, h, e.Mark)
		b.Write(u)
		if h.HasData() {
			b.Write(bytes.Repeat([]byte{e.Fill}, int(e.Count)*tUnit))
		}
	}
	return b.Bytes()
}

// randomLog draws a small log over a device of dev units.
func randomLog(r *rand.Rand, n int, dev uint64) []tEntry {
	var ents []tEntry
	for i := 0; i < n; i++ {
		switch k := r.IntN(10); {
		case k < 6:
			c := uint64(1 + r.IntN(3))
			s := r.Uint64N(dev - c + 1)
			f := uint64(0)
			if r.IntN(5) == 0 {
				f = logwrites.FlagFUA
			}
			ents = append(ents, tEntry{Sector: s, Count: c, Flags: f, Fill: byte(i + 1)})
		case k < 8:
			ents = append(ents, tEntry{Flags: logwrites.FlagFlush})
		case k < 9:
			c := uint64(1 + r.IntN(2))
			ents = append(ents, tEntry{Sector: r.Uint64N(dev - c + 1), Count: c, Flags: logwrites.FlagDiscard})
		default:
			ents = append(ents, tEntry{Flags: logwrites.FlagMark, Mark: fmt.Sprintf("m%d", i)})
		}
	}
	return ents
}

// bruteStates returns the device images of every crash state at the cut
// after entry cut, computed from the rules directly: writes logged before
// the last flush at or before the cut are kept, FUA writes are kept, any
// subset of the others is lost (reading as the old data).
func bruteStates(ents []tEntry, cut int, dev uint64, base []byte) map[string]bool {
	lastFlush := -1
	for i := 0; i <= cut; i++ {
		if ents[i].Flags&logwrites.FlagFlush != 0 {
			lastFlush = i
		}
	}
	var pending []int
	for i := 0; i <= cut; i++ {
		e := ents[i]
		if e.Count == 0 || e.Flags&logwrites.FlagMark != 0 {
			continue
		}
		if i >= lastFlush && e.Flags&logwrites.FlagFUA == 0 {
			pending = append(pending, i)
		}
	}
	out := map[string]bool{}
	for mask := 0; mask < 1<<len(pending); mask++ {
		img := bytes.Clone(base)
		for i := 0; i <= cut; i++ {
			e := ents[i]
			if e.Count == 0 || e.Flags&logwrites.FlagMark != 0 {
				continue
			}
			if k := slices.Index(pending, i); k >= 0 && mask&(1<<k) != 0 {
				continue
			}
			fill := e.Fill
			if e.Flags&logwrites.FlagDiscard != 0 {
				fill = 0
			}
			copy(img[e.Sector*tUnit:(e.Sector+e.Count)*tUnit], bytes.Repeat([]byte{fill}, int(e.Count)*tUnit))
		}
		out[string(img)] = true
	}
	return out
}

// testRun opens a run over the log with an in-process check.
func testRun(t *testing.T, log []byte, size int64, o Options, inspect func(*Overlay, State) bool) *Run {
	t.Helper()
	rec, err := Scan(bytes.NewReader(log), int64(len(log)))
	if err != nil {
		t.Fatal(err)
	}
	base, err := NewBase(filepath.Join(t.TempDir(), "base"), nil, size, rec, bytes.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { base.Close() })
	return &Run{Rec: rec, Log: bytes.NewReader(log), Base: base, Options: o, Jobs: 2, Inspect: inspect}
}

func image(t *testing.T, o *Overlay) []byte {
	b := make([]byte, o.Size())
	if _, err := o.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestModelAgainstBruteForce: at every cut of random small logs, the
// enumerated subset states are exactly the brute-force ones, each once.
func TestModelAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const dev = 8
	for round := 0; round < 60; round++ {
		ents := randomLog(r, 4+r.IntN(10), dev)
		log := buildLog(ents)
		var lock sync.Mutex
		mu := make(map[string]int)
		run := testRun(t, log, dev*tUnit, Options{Mode: Subset, Limit: 1 << 12}, func(o *Overlay, s State) bool {
			img := image(t, o)
			lock.Lock()
			mu[string(img)]++
			lock.Unlock()
			return true
		})
		for cut := range ents {
			clear(mu)
			results, states, all, err := run.Cut(uint64(cut))
			if err != nil {
				t.Fatal(err)
			}
			if !all {
				t.Fatalf("round %d cut %d: sampled, want enumerated", round, cut)
			}
			want := bruteStates(ents, cut, dev, make([]byte, dev*tUnit))
			ids := map[string]bool{}
			for _, s := range states {
				ids[run.Rec.ID(s)] = true
			}
			if len(ids) != len(results) {
				t.Errorf("round %d cut %d: %d states, %d distinct ids", round, cut, len(results), len(ids))
			}
			got := map[string]bool{}
			for img := range mu {
				got[img] = true
			}
			if len(got) != len(want) {
				t.Errorf("round %d cut %d: %d distinct images, brute force %d (log %v)", round, cut, len(got), len(want), ents)
			}
			for img := range got {
				if !want[img] {
					t.Errorf("round %d cut %d: a state outside the rules", round, cut)
					break
				}
			}
			// Every state is counted: the number of states is 2^pending.
			if uint64(len(states)) != run.Rec.Count(uint64(cut), Subset, 0) {
				t.Errorf("round %d cut %d: %d states, Count says %d", round, cut, len(states), run.Rec.Count(uint64(cut), Subset, 0))
			}
		}
	}
}

// TestPrefixIsReplay: the prefix state at a cut is the log replayed up to it.
func TestPrefixIsReplay(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ents := randomLog(r, 30, 16)
	log := buildLog(ents)
	var img []byte
	run := testRun(t, log, 16*tUnit, Options{Mode: Prefix}, func(o *Overlay, s State) bool { img = image(t, o); return true })
	for cut := range ents {
		if _, _, _, err := run.Cut(uint64(cut)); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 16*tUnit)
		for _, e := range ents[:cut+1] {
			if e.Count != 0 && e.Flags&logwrites.FlagMark == 0 {
				fill := e.Fill
				if e.Flags&logwrites.FlagDiscard != 0 {
					fill = 0
				}
				copy(want[e.Sector*tUnit:], bytes.Repeat([]byte{fill}, int(e.Count)*tUnit))
			}
		}
		if !bytes.Equal(img, want) {
			t.Fatalf("cut %d: the prefix state is not the replay", cut)
		}
	}
}

// TestSectorTears: in sector mode each unit of a pending write is kept or
// lost on its own; a unit larger than the log's damages the neighbouring
// sector with zeros or junk, not with old data.
func TestSectorTears(t *testing.T) {
	ents := []tEntry{
		{Sector: 0, Count: 8, Fill: 1}, {Flags: logwrites.FlagFlush},
		{Sector: 2, Count: 2, Fill: 2}, // two 512-byte units
		{Sector: 5, Count: 1, Fill: 3}, // one unit, half of a 1 KiB one
	}
	log := buildLog(ents)
	var lock sync.Mutex
	imgs := map[string]bool{}
	run := testRun(t, log, 8*tUnit, Options{Mode: Sector, Limit: 1 << 10}, func(o *Overlay, s State) bool {
		img := image(t, o)
		lock.Lock()
		imgs[string(img)] = true
		lock.Unlock()
		return true
	})
	_, states, _, err := run.Cut(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 8 || len(imgs) != 8 {
		t.Errorf("512-byte units: %d states, %d images; want 8 (2^3 units)", len(states), len(imgs))
	}
	// 1 KiB units, zero fill: losing entry 3's unit zeroes sector 4 too.
	run.Options = Options{Mode: Sector, Unit: 1024, Fill: FillZero, Limit: 1 << 10}
	var seen bool
	run.Inspect = func(o *Overlay, s State) bool {
		img := image(t, o)
		for _, l := range s.Lost {
			if run.Rec.Writes[l.Write].Entry == 3 {
				lock.Lock()
				seen = true
				lock.Unlock()
				if !bytes.Equal(img[4*tUnit:6*tUnit], make([]byte, 2*tUnit)) {
					t.Errorf("%s: the lost unit's neighbour sector keeps its data", run.Rec.ID(s))
				}
			}
		}
		return true
	}
	if _, _, _, err := run.Cut(3); err != nil {
		t.Fatal(err)
	}
	if !seen {
		t.Error("no state lost entry 3")
	}
}

// TestSamplingDeterministic: a cut with more states than the limit is
// sampled, the same seed giving the same states.
func TestSamplingDeterministic(t *testing.T) {
	var ents []tEntry
	for i := 0; i < 40; i++ {
		ents = append(ents, tEntry{Sector: uint64(i % 16), Count: 1, Fill: byte(i + 1)})
	}
	rec, err := Scan(bytes.NewReader(buildLog(ents)), -1)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(seed uint64) []string {
		st, all := rec.States(39, Options{Mode: Subset, Limit: 50, Seed: seed})
		if all {
			t.Fatal("2^40 states enumerated")
		}
		var out []string
		for _, s := range st {
			out = append(out, rec.ID(s))
		}
		return out
	}
	a, b, c := ids(7), ids(7), ids(8)
	if len(a) != 50 || !slices.Equal(a, b) {
		t.Errorf("seed 7 twice: %d and %d states, equal %v", len(a), len(b), slices.Equal(a, b))
	}
	if slices.Equal(a, c) {
		t.Error("seeds 7 and 8 drew the same states")
	}
	// With Clean 1 every sample is the clean state, once.
	st, _ := rec.States(39, Options{Mode: Subset, Limit: 50, Seed: 1, Clean: 1})
	if len(st) != 1 || len(st[0].Lost) != 0 {
		t.Errorf("clean 1: %d states", len(st))
	}
}

// TestIDRoundTrip: ids of every mode read back as the same state, and ids
// that do not belong to the log are refused.
func TestIDRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ents := randomLog(r, 40, 64)
	ents = append(ents, tEntry{Sector: 10, Count: 20, Fill: 9})
	rec, err := Scan(bytes.NewReader(buildLog(ents)), -1)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for cut := range ents {
		for _, o := range []Options{{Mode: Subset, Limit: 64}, {Mode: Sector, Limit: 64, Fill: FillJunk, Seed: 3}, {Mode: Sector, Unit: 4096, Limit: 16, Fill: FillZero}} {
			states, _ := rec.States(uint64(cut), o)
			for _, s := range states {
				id := rec.ID(s)
				back, err := rec.Parse(id)
				if err != nil {
					t.Fatalf("%s: %v", id, err)
				}
				if rec.ID(back) != id || fmt.Sprint(back) != fmt.Sprint(s) {
					t.Fatalf("%s read back as %s (%v, want %v)", id, rec.ID(back), back, s)
				}
				n++
			}
		}
	}
	if n < 100 {
		t.Errorf("only %d ids tried", n)
	}
	last := uint64(len(ents) - 1)
	for _, bad := range []string{
		"", "1", "x:-:old", fmt.Sprintf("%d:-:old", len(ents)), "0:-:new", "0:-:junk", "0:-:old.3",
		fmt.Sprintf("%d:999:old", last), fmt.Sprintf("%d@1000:-:old", last),
		fmt.Sprintf("%d:%d/0:old", last, last), fmt.Sprintf("%d@512:%d/40:old", last, last),
		fmt.Sprintf("%d@512:%d/3-1:old", last, last), fmt.Sprintf("%d@512:%d/0-99999999:old", last, last),
	} {
		if _, err := rec.Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestShrinkFindsPlanted: a check that fails when two given writes are
// both lost shrinks, from a state losing many, to exactly those two.
func TestShrinkFindsPlanted(t *testing.T) {
	var ents []tEntry
	ents = append(ents, tEntry{Sector: 0, Count: 32, Fill: 0xee}, tEntry{Flags: logwrites.FlagFlush})
	for i := 0; i < 24; i++ {
		ents = append(ents, tEntry{Sector: uint64(i), Count: 1, Fill: byte(i + 1)})
	}
	log := buildLog(ents)
	checks := 0
	run := testRun(t, log, 32*tUnit, Options{Mode: Subset}, func(o *Overlay, s State) bool {
		checks++
		img := image(t, o)
		// Sectors 5 and 17 both still hold the old data.
		return !(img[5*tUnit] == 0xee && img[17*tUnit] == 0xee)
	})
	cut := uint64(len(ents) - 1)
	if err := run.Base.Advance(1); err != nil {
		t.Fatal(err)
	}
	var all State
	all.Cut = cut
	for _, w := range run.Rec.Pending(cut) {
		all.Lost = append(all.Lost, Loss{Write: w})
	}
	failed := run.CheckState(all)
	if failed.OK {
		t.Fatal("the state losing every write passes")
	}
	min, res := run.Shrink(all, failed)
	if res.OK {
		t.Fatal("the shrunk state passes")
	}
	want := fmt.Sprintf("%d:%d,%d:old", cut, 2+5, 2+17)
	if got := run.Rec.ID(min); got != want {
		t.Errorf("shrunk to %s, want %s", got, want)
	}
	if checks > 120 {
		t.Errorf("%d checks to shrink 24 writes", checks)
	}
	d := run.Rec.Describe(min)
	if len(d) != 2 || !strings.Contains(d[0], "entry 7: write of units 5+1") {
		t.Errorf("described as %q", d)
	}
}

// TestScanRefusesBadLogs: a truncated log or a bad entry is reported with
// its entry.
func TestScanRefusesBadLogs(t *testing.T) {
	log := buildLog([]tEntry{{Sector: 0, Count: 2, Fill: 1}, {Flags: logwrites.FlagFlush}, {Sector: 4, Count: 2, Fill: 2}})
	if _, err := Scan(bytes.NewReader(log[:len(log)-100]), int64(len(log)-100)); err == nil || !strings.Contains(err.Error(), "log entry 2") {
		t.Errorf("truncated: %v", err)
	}
	bad := bytes.Clone(log)
	binary.LittleEndian.PutUint64(bad[tUnit+3*tUnit+16:], 0) // entry 1's flags: nothing
	if _, err := Scan(bytes.NewReader(bad), int64(len(bad))); err == nil || !strings.Contains(err.Error(), "log entry 1") {
		t.Errorf("bad entry: %v", err)
	}
	bad = bytes.Clone(log)
	bad[0] ^= 1
	if _, err := Scan(bytes.NewReader(bad), int64(len(bad))); err == nil {
		t.Error("bad magic accepted")
	}
}

// TestServeStates: a state's file reads as its overlay, takes writes that
// do not reach the base, and a new file shows a new state.
func TestServeStates(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		if os.Getenv("DMFUSE_REQUIRE_FUSE") != "" {
			t.Fatal("/dev/fuse is missing")
		}
		t.Skip("no /dev/fuse")
	}
	log := buildLog([]tEntry{{Sector: 0, Count: 4, Fill: 1}, {Flags: logwrites.FlagFlush}, {Sector: 1, Count: 1, Fill: 2}})
	run := testRun(t, log, 4*tUnit, Options{Mode: Subset}, nil)
	srv, err := Serve(filepath.Join(t.TempDir(), "states"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	run.Server = srv
	if err := run.Base.Advance(1); err != nil {
		t.Fatal(err)
	}
	kept := srv.Add(NewOverlay(run.Rec, State{Cut: 2}, run.Base.File(), run.Log, 4*tUnit))
	lost := srv.Add(NewOverlay(run.Rec, State{Cut: 2, Lost: []Loss{{Write: 1}}}, run.Base.File(), run.Log, 4*tUnit))
	a, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(lost)
	if err != nil {
		t.Fatal(err)
	}
	if a[tUnit] != 2 || b[tUnit] != 1 || len(a) != 4*tUnit {
		t.Errorf("kept reads %d, lost reads %d at sector 1 (%d bytes)", a[tUnit], b[tUnit], len(a))
	}
	if err := os.WriteFile(lost, bytes.Repeat([]byte{9}, 4*tUnit), 0); err != nil {
		t.Fatal(err)
	}
	if c, _ := os.ReadFile(lost); c[0] != 9 {
		t.Error("a write to a state's file did not stay")
	}
	if c, _ := os.ReadFile(kept); c[0] != 1 {
		t.Error("a write to one state's file reached another")
	}
}

// TestOverlayReadAtEnd: a read crossing the end of a state's device reads
// what is there and says io.EOF, as io.ReaderAt asks; one past the end
// reads nothing.
func TestOverlayReadAtEnd(t *testing.T) {
	log := buildLog([]tEntry{{Sector: 0, Count: 4, Fill: 1}, {Flags: logwrites.FlagFlush}})
	run := testRun(t, log, 4*tUnit, Options{Mode: Subset}, nil)
	if err := run.Base.Advance(1); err != nil {
		t.Fatal(err)
	}
	o := NewOverlay(run.Rec, State{Cut: 1}, run.Base.File(), run.Log, 4*tUnit)
	p := make([]byte, 2*tUnit)
	if n, err := o.ReadAt(p, 3*tUnit); n != tUnit || err != io.EOF || p[0] != 1 {
		t.Errorf("read across the end: %d, %v, first byte %d; want %d, EOF, 1", n, err, p[0], tUnit)
	}
	if n, err := o.ReadAt(p, 4*tUnit); n != 0 || err != io.EOF {
		t.Errorf("read at the end: %d, %v", n, err)
	}
}

// TestCuts: a flush cut is the crash while the flush is in flight, so the
// writes since the previous flush may be lost there; FUA, every-N and mark
// cuts are at their entries; --from skips what precedes a mark.
func TestCuts(t *testing.T) {
	ents := []tEntry{
		{Sector: 0, Count: 1, Fill: 1}, {Flags: logwrites.FlagFlush}, // 0, 1
		{Flags: logwrites.FlagMark, Mark: "go"},                        // 2
		{Sector: 1, Count: 1, Fill: 2}, {Sector: 2, Count: 1, Fill: 3}, // 3, 4
		{Sector: 3, Count: 1, Flags: logwrites.FlagFUA, Fill: 4},     // 5
		{Sector: 4, Count: 1, Fill: 5}, {Flags: logwrites.FlagFlush}, // 6, 7
	}
	rec, err := Scan(bytes.NewReader(buildLog(ents)), -1)
	if err != nil {
		t.Fatal(err)
	}
	c := Cuts{Flush: true, FUA: true, Every: 2, Marks: []string{"go"}}
	got, err := c.Entries(rec, Subset)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{0, 2, 3, 5, 6}; !slices.Equal(got, want) {
		t.Errorf("cuts %v, want %v", got, want)
	}
	c.From = "go"
	if got, _ = c.Entries(rec, Prefix); !slices.Equal(got, []uint64{3, 5, 7}) {
		t.Errorf("prefix cuts from the mark: %v", got)
	}
	// Before the last flush: writes 3, 4 and 6 may be lost, the FUA write
	// 5 may not.
	if n := rec.Count(6, Subset, 0); n != 8 {
		t.Errorf("%d states before the last flush, want 8", n)
	}
	if n := rec.Count(7, Subset, 0); n != 1 {
		t.Errorf("%d states after the last flush, want 1", n)
	}
	c.From = "nosuch"
	if _, err := c.Entries(rec, Subset); err == nil {
		t.Error("a missing --from mark accepted")
	}
	var bad Cuts
	for _, s := range []string{"every:0", "every:x", "mark:", "fsync"} {
		if bad.ParseCut(s) == nil {
			t.Errorf("--at %s accepted", s)
		}
	}
}

// TestCheckerTimeout: a check that hangs is killed with its process group
// after the timeout and counts as a failure, its output kept; the state's
// file, id and cut reach it in the environment.
func TestCheckerTimeout(t *testing.T) {
	t0 := time.Now()
	r := Checker{Command: `echo "checking $DMFUSE_CRASH_DEV $DMFUSE_CRASH_STATE $DMFUSE_CRASH_CUT"; sleep 30 & wait`, Timeout: 300 * time.Millisecond}.run("/dev/x", "7:-:old", 7)
	if r.OK || r.Status != -1 || !strings.Contains(r.Output, "checking /dev/x 7:-:old 7") || !strings.Contains(r.Output, "killed after 300ms") {
		t.Errorf("a hung check: %+v", r)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("the hung check took %v to end", d)
	}
	r = Checker{Command: "exit 3"}.run("/dev/x", "7:-:old", 7)
	if r.OK || r.Status != 3 {
		t.Errorf("exit 3: %+v", r)
	}
	if r = (Checker{Command: "true"}).run("/dev/x", "7:-:old", 7); !r.OK || r.Output != "" {
		t.Errorf("true: %+v", r)
	}
}
