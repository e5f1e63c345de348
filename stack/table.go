package stack

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// maxTargets is the most lines one table may have (DM_MAX_TARGETS).
const maxTargets = 1 << 20

// Line is one parsed table line: `<start> <len> <type> <params>`.
type Line struct {
	// N is the 1-based line number in the table text.
	N          int
	Start, Len uint64 // sectors
	Type       string
	// Params is the parameter string after the type, with any `#` comment cut.
	Params string
}

// TableError is a failure to parse or build one line of a table. It prints
// as "line N: TYPE: reason", the parts that apply.
type TableError struct {
	Line   int
	Target string
	Err    error
}

func (e *TableError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Target != "" {
		b.WriteString(e.Target)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *TableError) Unwrap() error { return e.Err }

// ParseTable reads table text as dmsetup does (lvm2's dmsetup.c: _parse_line):
// each line is trimmed, empty lines and lines starting with `#` are skipped,
// the first three fields are start, length and type, and the rest of the line,
// cut at any `#`, is the parameter string. It checks only the syntax; Build
// checks the rest.
func ParseTable(text string) ([]Line, error) {
	var lines []Line
	for i, raw := range strings.Split(text, "\n") {
		s := strings.TrimSpace(raw)
		if s == "" || s[0] == '#' {
			continue
		}
		f1, rest := cutField(s)
		f2, rest := cutField(rest)
		f3, rest := cutField(rest)
		if f3 == "" {
			return nil, &TableError{Line: i + 1, Err: Errorf("Invalid format on line %d", i+1)}
		}
		start, err1 := strconv.ParseUint(f1, 10, 64)
		n, err2 := strconv.ParseUint(f2, 10, 64)
		if err1 != nil || err2 != nil {
			return nil, &TableError{Line: i + 1, Err: Errorf("Invalid format on line %d", i+1)}
		}
		if j := strings.IndexByte(rest, '#'); j >= 0 {
			rest = rest[:j]
		}
		lines = append(lines, Line{N: i + 1, Start: start, Len: n, Type: f3,
			Params: strings.TrimRight(rest, " \t\r\v\f")})
	}
	return lines, nil
}

// cutField returns the first whitespace-separated field of s and the rest
// after the whitespace that follows it.
func cutField(s string) (field, rest string) {
	s = strings.TrimLeft(s, " \t\r\v\f")
	i := strings.IndexAny(s, " \t\r\v\f")
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimLeft(s[i:], " \t\r\v\f")
}

// segment is one live target of a table; offsets in bytes.
type segment struct {
	start, end int64 // bytes, [start, end)
	line       Line
	typ        *TargetType
	target     Target
	maxIO      int64
	atMap      bool // MapAccounter
}

// Table is a constructed, immutable table: its targets in order and the
// devices they opened. Once live it is shared by concurrent I/O.
type Table struct {
	segs     []segment
	size     int64 // bytes
	readOnly bool
	devs     []BlockDevice // opened through Ctor.Open, closed with the table
	deps     []*Device     // mapped devices among devs
	limits   Limits        // whether the whole table takes discards and write-zeroes
}

// BuildOptions carries what constructors need besides the text.
type BuildOptions struct {
	Registry *Registry
	ReadOnly bool
	Clock    Clock
	Context  context.Context
	// Open resolves a device argument; Build records what it returns and
	// closes it with the table (if it implements io.Closer).
	Open func(arg string) (BlockDevice, error)
	// Previous is the device's current live table, if any (immutable-type
	// rule on reload).
	Previous *Table
	// Event raises a table event on the device being built for.
	Event func()
	// Memory is passed to the constructors as Ctor.Memory.
	Memory func(n int64)
	// Device is the mapped device the table is built for, passed to the
	// constructors as Ctor.Device; nil outside a Manager.
	Device *Device
	// Shared is passed to the constructors as Ctor.Shared.
	Shared *SharedSet
}

// Build checks lines as drivers/md/dm-table.c: dm_table_add_target and
// drivers/md/dm-ioctl.c: table_load do, in the kernel's order, and constructs
// every target. On any error it destroys what it built and returns a
// *TableError naming the line.
func Build(lines []Line, o BuildOptions) (t *Table, err error) {
	if len(lines) == 0 {
		return nil, &TableError{Err: Errorf("no targets specified")}
	}
	if len(lines) > maxTargets {
		return nil, &TableError{Err: &ArgError{Reason: "too many targets", Errno: syscall.EOVERFLOW}}
	}
	t = &Table{readOnly: o.ReadOnly}
	defer func() {
		if err != nil {
			t.Close()
			t = nil
		}
	}()
	var next uint64
	var immutable *TargetType
	t.limits = Limits{Discard: true, WriteZeroes: true}
	for _, l := range lines {
		fail := func(e error) error { return &TableError{Line: l.N, Target: l.Type, Err: e} }
		if l.Len == 0 {
			return t, fail(Errorf("zero-length target"))
		}
		if l.Start+l.Len < l.Start || l.Start+l.Len > maxSectors {
			return t, fail(Errorf("too large device"))
		}
		typ, ok := o.Registry.Lookup(l.Type)
		if !ok {
			return t, fail(Errorf("unknown target type"))
		}
		if typ.Singleton && len(lines) > 1 {
			return t, fail(Errorf("singleton target type must appear alone in table"))
		}
		if immutable != nil && typ != immutable || typ.Immutable && len(t.segs) > 0 && t.segs[0].typ != typ {
			return t, fail(Errorf("immutable target type cannot be mixed with other target types"))
		}
		if typ.Immutable {
			immutable = typ
		}
		if l.Start != next {
			return t, fail(Errorf("Gap in table"))
		}
		// The devices this line opens, like the kernel's iterate_devices.
		var lineDevs []BlockDevice
		ctor := &Ctor{Begin: int64(l.Start), Len: int64(l.Len), ReadOnly: o.ReadOnly, Clock: o.Clock, Context: o.Context, Event: o.Event, Memory: o.Memory, Shared: o.Shared, Device: o.Device,
			Open: func(arg string) (BlockDevice, error) {
				d, err := o.Open(arg)
				if err != nil {
					return nil, err
				}
				t.devs = append(t.devs, d)
				lineDevs = append(lineDevs, d)
				if md, ok := d.(interface{ mapped() *Device }); ok {
					t.deps = append(t.deps, md.mapped())
				}
				return d, nil
			}}
		tg, err := typ.New(ctor, SplitArgs(l.Params))
		if err != nil {
			return t, fail(err)
		}
		lim := targetLimits(tg, lineDevs)
		t.limits.Discard = t.limits.Discard && lim.Discard
		t.limits.WriteZeroes = t.limits.WriteZeroes && lim.WriteZeroes
		seg := segment{start: int64(l.Start) * SectorSize, end: int64(l.Start+l.Len) * SectorSize, line: l, typ: typ, target: tg}
		if m, ok := tg.(MaxIOer); ok {
			seg.maxIO = m.MaxIO()
		}
		_, seg.atMap = tg.(MapAccounter)
		t.segs = append(t.segs, seg)
		next = l.Start + l.Len
	}
	if p := o.Previous; p != nil && len(p.segs) > 0 && p.segs[0].typ.Immutable {
		if pt := p.segs[0].typ; !(len(t.segs) > 0 && (t.segs[0].typ == pt || t.segs[0].typ.Wildcard)) {
			return t, &TableError{Line: t.segs[0].line.N, Target: t.segs[0].line.Type, Err: Errorf("can't replace immutable target type %s", pt.Name)}
		}
	}
	t.size = int64(next) * SectorSize
	return t, nil
}

// targetLimits decides whether one target takes discards and write-zeroes,
// given the devices it opened, as drivers/md/dm-table.c:
// dm_table_supports_discards and dm_table_supports_write_zeroes do for each
// target: the target must take the operation (num_discard_bios,
// num_write_zeroes_bios) and every device it uses must take it too, except
// that a DiscardOwner takes discards whatever its devices (dm's
// discards_supported).
func targetLimits(tg Target, devs []BlockDevice) (lim Limits) {
	_, lim.Discard = tg.(Discarder)
	_, owner := tg.(DiscardOwner)
	_, lim.WriteZeroes = tg.(ZeroWriter)
	for _, d := range devs {
		dl := LimitsOf(d)
		lim.Discard = lim.Discard && (owner || dl.Discard)
		lim.WriteZeroes = lim.WriteZeroes && dl.WriteZeroes
	}
	return lim
}

// Size is the table's length in bytes.
func (t *Table) Size() int64 { return t.size }

// Limits says whether the table takes discards and write-zeroes: only if
// every target and the devices it uses do.
func (t *Table) Limits() Limits { return t.limits }

// Sectors is the table's length in sectors.
func (t *Table) Sectors() int64 { return t.size / SectorSize }

// NumTargets is the number of lines.
func (t *Table) NumTargets() int { return len(t.segs) }

// ReadOnly reports whether the table was built for a read-only device.
func (t *Table) ReadOnly() bool { return t.readOnly }

// Devices returns every device the table opened, in the order the targets
// opened them (dm_table_get_devices).
func (t *Table) Devices() []BlockDevice { return t.devs }

// Targets calls f for each target with its start and length in sectors and
// its type.
func (t *Table) Targets(f func(start, n int64, typ *TargetType, tg Target)) {
	for i := range t.segs {
		s := &t.segs[i]
		f(s.start/SectorSize, (s.end-s.start)/SectorSize, s.typ, s.target)
	}
}

// Format prints the table as `dmfuse table` (StatusTable) or `dmfuse status`
// (StatusInfo, or StatusInfoNoFlush for `status --noflush`) do: one line per
// target, `<start> <len> <type> <params>\n`.
func (t *Table) Format(st StatusType) string {
	var b strings.Builder
	for i := range t.segs {
		s := &t.segs[i]
		fmt.Fprintf(&b, "%d %d %s %s\n", s.start/SectorSize, (s.end-s.start)/SectorSize, s.typ.Name, targetStatus(s.target, st))
	}
	return b.String()
}

// TargetLine is one line of a table's TABLE or INFO text.
type TargetLine struct {
	// Start and Len are the target's segment in sectors.
	Start, Len int64
	// Type is the target type's name and Params its status of the
	// requested type.
	Type, Params string
}

// Lines returns the table's lines with each target's status of type st, as
// Format prints them.
func (t *Table) Lines(st StatusType) []TargetLine {
	out := make([]TargetLine, len(t.segs))
	for i := range t.segs {
		s := &t.segs[i]
		out[i] = TargetLine{Start: s.start / SectorSize, Len: (s.end - s.start) / SectorSize, Type: s.typ.Name, Params: targetStatus(s.target, st)}
	}
	return out
}

// targetStatus is tg's status of type st; StatusInfoNoFlush goes to a
// NoFlushStatuser's StatusNoFlush and is StatusInfo for any other target.
func targetStatus(tg Target, st StatusType) string {
	if st != StatusInfoNoFlush {
		return tg.Status(st)
	}
	if n, ok := tg.(NoFlushStatuser); ok {
		return n.StatusNoFlush()
	}
	return tg.Status(StatusInfo)
}

// Close destroys every target and closes the devices the table opened.
func (t *Table) Close() error {
	var first error
	for i := range t.segs {
		if err := t.segs[i].target.Close(); err != nil && first == nil {
			first = err
		}
	}
	for _, d := range t.devs {
		if c, ok := d.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	t.segs, t.devs = nil, nil
	return first
}

// find returns the index of the segment holding byte off (off < size).
func (t *Table) find(off int64) int {
	if len(t.segs) == 1 {
		return 0
	}
	return sort.Search(len(t.segs), func(i int) bool { return t.segs[i].end > off })
}

// TargetAt returns the target covering sector, for message routing.
func (t *Table) TargetAt(sector int64) (Target, *TargetType, error) {
	if sector < 0 || sector >= t.Sectors() {
		return nil, nil, Errorf("Target message sector outside device")
	}
	s := &t.segs[t.find(sector*SectorSize)]
	return s.target, s.typ, nil
}

// ErrNoMessages is the answer of a target that takes no messages.
var ErrNoMessages = Errorf("Target type does not support messages")
