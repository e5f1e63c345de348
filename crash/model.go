package crash

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
)

// Mode says which states a cut has.
type Mode int

const (
	// Prefix: every write up to the cut kept, the one state replay-log
	// replays.
	Prefix Mode = iota
	// Subset: any subset of the writes since the last flush lost, whole
	// (CrashMonkey's model).
	Subset
	// Sector: every tear unit of every write since the last flush kept or
	// lost on its own, so that writes tear (FoundationDB's model).
	Sector
)

// modeNames are the modes' names, in Mode order.
var modeNames = []string{"prefix", "subset", "sector"}

// ParseMode reads prefix, subset or sector.
func ParseMode(s string) (Mode, error) {
	if i := slices.Index(modeNames, s); i >= 0 {
		return Mode(i), nil
	}
	return 0, fmt.Errorf("mode %q: want prefix, subset or sector", s)
}

func (m Mode) String() string { return modeNames[m] }

// Fill is what a lost unit reads as after the crash.
type Fill int

const (
	// FillOld: what the unit held before the lost write.
	FillOld Fill = iota
	// FillZero: zeros.
	FillZero
	// FillJunk: bytes drawn from the state's seed.
	FillJunk
)

// fillNames are the fills' names, in Fill order.
var fillNames = []string{"old", "zero", "junk"}

// ParseFill reads old, zero or junk.
func ParseFill(s string) (Fill, error) {
	if i := slices.Index(fillNames, s); i >= 0 {
		return Fill(i), nil
	}
	return 0, fmt.Errorf("fill %q: want old, zero or junk", s)
}

func (f Fill) String() string { return fillNames[f] }

// Loss is one lost item of a state: a whole write, or some of its tear
// units.
type Loss struct {
	// Write is the write's index in Record.Writes.
	Write int
	// Units are the lost tear units, counted from the write's first one,
	// in increasing order; nil loses the whole write.
	Units []uint32
}

// State is one state a crash may leave: every write up to and including
// entry Cut happened; the writes a completed flush covers, and the FUA
// writes, are on the device; of the others, Lost are not (or not all of
// them), and the units they would have written read as Fill says.
type State struct {
	Cut uint64
	// Unit is the tear unit in bytes of the Units of Lost (0: whole writes
	// only).
	Unit int64
	Lost []Loss
	Fill Fill
	// Seed draws the junk of FillJunk.
	Seed uint64
}

// Span returns the range of the writes a state at cut may lose: writes
// [from, to) of rec.Writes are the ones up to the cut, from of them
// durable. FUA writes in the range are durable too.
func (rec *Record) Span(cut uint64) (from, to int) {
	to = sort.Search(len(rec.Writes), func(i int) bool { return rec.Writes[i].Entry > cut })
	return rec.durable(cut), to
}

// Pending returns the writes a crash at cut may lose: those since the last
// completed flush that are not FUA writes, as indexes into rec.Writes.
func (rec *Record) Pending(cut uint64) []int {
	from, to := rec.Span(cut)
	var p []int
	for i := from; i < to; i++ {
		if !rec.Writes[i].FUA() {
			p = append(p, i)
		}
	}
	return p
}

// units returns the tear units write w covers: the first one's number on
// the device and how many.
func (rec *Record) units(w Write, unit int64) (first, n uint64) {
	start, end := w.Sector*uint64(rec.Unit), (w.Sector+w.Count)*uint64(rec.Unit)
	first = start / uint64(unit)
	return first, (end-1)/uint64(unit) - first + 1
}

// maxUnits bounds the tear units told apart at one cut.
const maxUnits = 1 << 16

// item is one thing a state may lose: a write, or one unit of it.
type item struct {
	write int
	unit  int64 // -1: the whole write
}

// items lists what a state at cut may lose in mode m.
func (rec *Record) items(cut uint64, m Mode, unit int64) []item {
	var it []item
	for _, w := range rec.Pending(cut) {
		if m != Sector {
			it = append(it, item{w, -1})
			continue
		}
		_, n := rec.units(rec.Writes[w], unit)
		if n > maxUnits-uint64(len(it)) {
			// Past maxUnits units at one cut (a discard of a whole
			// device), a write is kept or lost as one piece.
			it = append(it, item{w, -1})
			continue
		}
		for u := uint64(0); u < n; u++ {
			it = append(it, item{w, int64(u)})
		}
	}
	return it
}

// stateOf builds the state that loses the items whose bits are set.
func stateOf(cut uint64, m Mode, unit int64, fill Fill, seed uint64, it []item, lost func(i int) bool) State {
	s := State{Cut: cut, Fill: fill}
	if m == Sector {
		s.Unit = unit
	}
	if fill == FillJunk {
		s.Seed = seed
	}
	for i, x := range it {
		if !lost(i) {
			continue
		}
		if x.unit < 0 {
			s.Lost = append(s.Lost, Loss{Write: x.write})
			continue
		}
		if n := len(s.Lost); n > 0 && s.Lost[n-1].Write == x.write {
			s.Lost[n-1].Units = append(s.Lost[n-1].Units, uint32(x.unit))
		} else {
			s.Lost = append(s.Lost, Loss{Write: x.write, Units: []uint32{uint32(x.unit)}})
		}
	}
	return s
}

// Options choose the states of each cut.
type Options struct {
	Mode Mode
	// Unit is the tear unit in bytes for Sector (a multiple of the log
	// unit or a divisor of it; 0: the log unit).
	Unit int64
	Fill Fill
	// Limit bounds the states of one cut: a cut with at most Limit states
	// has them all enumerated, one with more has Limit of them sampled.
	Limit int
	// Seed seeds the sampling and the junk.
	Seed uint64
	// Clean is the probability that a sampled state loses nothing.
	Clean float64
}

// States returns the states of the cut after entry cut, and whether they
// are all of them (enumerated) or a sample drawn from o.Seed. The same
// record, cut and options give the same states in the same order.
func (rec *Record) States(cut uint64, o Options) (states []State, all bool) {
	unit := o.Unit
	if unit <= 0 {
		unit = rec.Unit
	}
	if o.Mode == Prefix {
		return []State{{Cut: cut}}, true
	}
	it := rec.items(cut, o.Mode, unit)
	junk := func(i uint64) uint64 { return o.Seed ^ cut<<20 ^ i }
	limit := max(o.Limit, 1)
	if len(it) < 63 && uint64(1)<<len(it) <= uint64(limit) {
		for mask := uint64(0); mask < uint64(1)<<len(it); mask++ {
			states = append(states, stateOf(cut, o.Mode, unit, o.Fill, junk(mask), it, func(i int) bool { return mask&(1<<i) != 0 }))
		}
		return states, true
	}
	rng := rand.New(rand.NewPCG(o.Seed, cut))
	seen := map[string]bool{}
	for tries := 0; len(states) < limit && tries < 4*limit; tries++ {
		var lost func(int) bool
		if rng.Float64() < o.Clean {
			lost = func(int) bool { return false }
		} else {
			bitsOf := make([]bool, len(it))
			for i := range bitsOf {
				bitsOf[i] = rng.IntN(2) == 1
			}
			lost = func(i int) bool { return bitsOf[i] }
		}
		s := stateOf(cut, o.Mode, unit, o.Fill, junk(uint64(tries)), it, lost)
		if id := rec.ID(s); !seen[id] {
			seen[id] = true
			states = append(states, s)
		}
	}
	return states, false
}

// Count returns how many states the cut has in mode m (saturating at
// 2^63), for the progress report.
func (rec *Record) Count(cut uint64, m Mode, unit int64) uint64 {
	if m == Prefix {
		return 1
	}
	if unit <= 0 {
		unit = rec.Unit
	}
	n := len(rec.items(cut, m, unit))
	if n >= 63 {
		return 1 << 63
	}
	return 1 << n
}

// ID returns the state's id: it names the cut entry, the tear unit, the
// lost writes by their log entry (with their lost units) and the fill:
//
//	CUT[@UNIT]:LOST:FILL[.SEED]
//
// LOST is "-" for none, else a comma-separated list of ENTRY or
// ENTRY/UNITS, UNITS being dot-separated unit numbers and ranges (0-3.7).
// Parse reads it back against the same log.
func (rec *Record) ID(s State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", s.Cut)
	if s.Unit > 0 {
		fmt.Fprintf(&b, "@%d", s.Unit)
	}
	b.WriteByte(':')
	if len(s.Lost) == 0 {
		b.WriteByte('-')
	}
	for i, l := range s.Lost {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", rec.Writes[l.Write].Entry)
		if l.Units != nil {
			b.WriteByte('/')
			writeRanges(&b, l.Units)
		}
	}
	fmt.Fprintf(&b, ":%s", s.Fill)
	if s.Fill == FillJunk {
		fmt.Fprintf(&b, ".%d", s.Seed)
	}
	return b.String()
}

func writeRanges(b *strings.Builder, u []uint32) {
	for i := 0; i < len(u); {
		j := i
		for j+1 < len(u) && u[j+1] == u[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte('.')
		}
		if j > i {
			fmt.Fprintf(b, "%d-%d", u[i], u[j])
		} else {
			fmt.Fprintf(b, "%d", u[i])
		}
		i = j + 1
	}
}

// Parse reads a state id of this log. An id that does not belong to it (a
// cut past its end, a lost entry that is not a write a crash at the cut
// may lose, a unit outside its write) is an error saying which.
func (rec *Record) Parse(id string) (State, error) {
	var s State
	parts := strings.Split(id, ":")
	if len(parts) != 3 {
		return s, fmt.Errorf("state id %q: want CUT[@UNIT]:LOST:FILL", id)
	}
	cut, unit, hasUnit := strings.Cut(parts[0], "@")
	if _, err := fmt.Sscan(cut, &s.Cut); err != nil || fmt.Sprint(s.Cut) != cut {
		return s, fmt.Errorf("state id %q: cut %q is not an entry number", id, cut)
	}
	if s.Cut >= rec.Entries {
		return s, fmt.Errorf("state id %q: cut at entry %d, but the log has %d entries", id, s.Cut, rec.Entries)
	}
	if hasUnit {
		if _, err := fmt.Sscan(unit, &s.Unit); err != nil || fmt.Sprint(s.Unit) != unit || !validUnit(s.Unit) {
			return s, fmt.Errorf("state id %q: tear unit %q: want a power of two from 512 bytes", id, unit)
		}
	}
	fill, seed, hasSeed := strings.Cut(parts[2], ".")
	f, err := ParseFill(fill)
	if err != nil {
		return s, fmt.Errorf("state id %q: %v", id, err)
	}
	s.Fill = f
	if hasSeed != (f == FillJunk) {
		return s, fmt.Errorf("state id %q: a seed goes with junk, and only with it", id)
	}
	if hasSeed {
		if _, err := fmt.Sscan(seed, &s.Seed); err != nil || fmt.Sprint(s.Seed) != seed {
			return s, fmt.Errorf("state id %q: seed %q is not a number", id, seed)
		}
	}
	from, to := rec.Span(s.Cut)
	if parts[1] == "-" {
		return s, nil
	}
	for _, item := range strings.Split(parts[1], ",") {
		ent, units, torn := strings.Cut(item, "/")
		var e uint64
		if _, err := fmt.Sscan(ent, &e); err != nil || fmt.Sprint(e) != ent {
			return s, fmt.Errorf("state id %q: %q is not an entry number", id, ent)
		}
		w, ok := slices.BinarySearchFunc(rec.Writes, e, func(w Write, e uint64) int { return cmpU64(w.Entry, e) })
		if !ok || w < from || w >= to || rec.Writes[w].FUA() {
			return s, fmt.Errorf("state id %q: entry %d is not a write a crash after entry %d may lose", id, e, s.Cut)
		}
		if n := len(s.Lost); n > 0 && s.Lost[n-1].Write >= w {
			return s, fmt.Errorf("state id %q: lost entries must be in increasing order", id)
		}
		l := Loss{Write: w}
		if torn {
			if s.Unit == 0 {
				return s, fmt.Errorf("state id %q: entry %d has lost units but the id has no @UNIT", id, e)
			}
			_, n := rec.units(rec.Writes[w], s.Unit)
			if l.Units, err = parseRanges(units, uint32(min(n, 1<<32-1))); err != nil {
				return s, fmt.Errorf("state id %q: entry %d: %v", id, e, err)
			}
		}
		s.Lost = append(s.Lost, l)
	}
	return s, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func validUnit(u int64) bool { return u >= 512 && bits.OnesCount64(uint64(u)) == 1 && u <= 1<<20 }

// parseRanges reads dot-separated unit numbers and ranges, increasing,
// each below n.
func parseRanges(s string, n uint32) ([]uint32, error) {
	var out []uint32
	for _, r := range strings.Split(s, ".") {
		a, b, isRange := strings.Cut(r, "-")
		var lo, hi uint32
		if _, err := fmt.Sscan(a, &lo); err != nil || fmt.Sprint(lo) != a {
			return nil, fmt.Errorf("unit %q is not a number", r)
		}
		hi = lo
		if isRange {
			if _, err := fmt.Sscan(b, &hi); err != nil || fmt.Sprint(hi) != b || hi <= lo {
				return nil, fmt.Errorf("units %q: want LOW-HIGH, LOW < HIGH", r)
			}
		}
		if hi >= n {
			return nil, fmt.Errorf("unit %d: the write has %d", hi, n)
		}
		if uint64(len(out))+uint64(hi-lo)+1 > maxUnits {
			return nil, fmt.Errorf("more than %d units", maxUnits)
		}
		if len(out) > 0 && lo <= out[len(out)-1] {
			return nil, fmt.Errorf("units must be in increasing order")
		}
		for u := lo; ; u++ {
			out = append(out, u)
			if u == hi {
				break
			}
		}
	}
	return out, nil
}
