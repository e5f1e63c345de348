package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
	"github.com/dmfuse/dmfuse/targets"
)

// Check is one conformance check of the entry e, run by suite s.
//
// A check takes a testing.TB, so that the suite's own tests can run it on a
// recorder and see it fail on a faulty target.
type Check func(t testing.TB, s Suite, e targets.Entry)

// All holds every check by name, as Run runs them.
var All = map[string]Check{
	"ShortReadAtEnd":       ShortReadAtEnd,
	"SegmentOffsets":       SegmentOffsets,
	"ConcurrentIO":         ConcurrentIO,
	"FlushReachesDevices":  FlushReachesDevices,
	"TableRoundTrip":       TableRoundTrip,
	"EscapedPathRoundTrip": EscapedPathRoundTrip,
	"StatusInfoFormat":     StatusInfoFormat,
}

// Mount serves the devices of m as files in a folder, as dmfuse's fs
// layer does, for as long as the test runs, and returns the folder: the
// device called NAME is the file NAME in it.
type Mount func(t testing.TB, m *stack.Manager) string

// Suite is the conformance suite with its way to the devices.
type Suite struct {
	// Mount, when set, makes every check do the I/O of the device under
	// test through the device's file on a mount (pread, pwrite, fsync),
	// so that what the suite checks in process is checked at the file
	// users open. Tables, status and the devices below are still looked
	// at in process.
	Mount Mount
}

// Run runs every check of All on e as a subtest, in name order. A check
// that e's case declares not applicable is skipped with the declared
// reason; a declaration naming no check of All is an error.
func (s Suite) Run(t *testing.T, e targets.Entry) {
	t.Helper()
	for name := range e.Case.NotApplicable {
		if _, ok := All[name]; !ok {
			t.Errorf("%s: NotApplicable names %q, which is no check of the suite", e.Type.Name, name)
		}
	}
	names := make([]string, 0, len(All))
	for name := range All {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			if why, ok := e.Case.NotApplicable[name]; ok {
				t.Skipf("does not apply to %s: %s", e.Type.Name, why)
			}
			All[name](t, s, e)
		})
	}
}

// RunAll runs the suite on every entry, one subtest per type.
func (s Suite) RunAll(t *testing.T, entries []targets.Entry) {
	t.Helper()
	for _, e := range entries {
		t.Run(e.Type.Name, func(t *testing.T) { s.Run(t, e) })
	}
}

// segSectors is the length of every segment the suite builds; each backing
// device is exactly that long, so that a target handing its device a range
// past its segment fails.
const segSectors = 1024

const segBytes = segSectors * stack.SectorSize

// env is one device of the type under test, over backing devices of one
// segment each.
type env struct {
	t     testing.TB
	typ   *stack.TargetType
	c     targets.Case
	mount Mount
	mgr   *stack.Manager
	dev   *stack.Device
	// io is how the checks do I/O to dev: dev itself, or its file on the
	// Suite's mount.
	io deviceIO
	// segs are the segments, with their devices.
	segs []targets.Segment
	mems []*stacktest.MemDevice // memory backing devices, one per segment (newMemEnv)
	// names are what each segment's line names, unescaped: a memory
	// device's name, a backing file's absolute path, or the device the
	// case built below it.
	names []string
}

const envName = "dut"

// segments is how many segments the suite's tables of typ have: two, or one
// for a singleton type, which must be alone in its table.
func segments(typ *stack.TargetType) int {
	if typ.Singleton {
		return 1
	}
	return 2
}

// newEnv returns an env for e's type with a manager of e's type and the
// types its case uses, on a manual clock, removed with everything it made
// when the test ends.
func newEnv(t testing.TB, s Suite, e targets.Entry, open func(string) (stack.BlockDevice, error)) *env {
	reg, err := stack.NewRegistry(append([]*stack.TargetType{e.Type}, e.Case.Uses...)...)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock.Manual{}
	clk.Set(1e9)
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Clock: clk, Open: open})
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return &env{t: t, typ: e.Type, c: e.Case, mount: s.Mount, mgr: m}
}

// newMemEnv makes a device of nseg segments of e's type, segment i over
// memory device "mem<i>".
func newMemEnv(t testing.TB, s Suite, e targets.Entry, nseg int) *env {
	t.Helper()
	open := stacktest.Opener{}
	ev := newEnv(t, s, e, open.Open)
	for i := range nseg {
		name := fmt.Sprintf("mem%d", i)
		m := stacktest.NewMemDevice(name, segBytes)
		open[name] = m
		ev.mems = append(ev.mems, m)
		seg := targets.Segment{Index: i, Sectors: segSectors, Dev: name}
		if e.Case.Aux > 0 {
			seg.Aux = name + targets.AuxSuffix
			open[seg.Aux] = stacktest.NewMemDevice(seg.Aux, e.Case.Aux)
		}
		ev.add(seg, name)
	}
	ev.create()
	return ev
}

// newFileEnv makes a device of nseg segments of e's type, segment i over a
// backing file whose name holds a space and a backslash.
func newFileEnv(t testing.TB, s Suite, e targets.Entry, nseg int) *env {
	t.Helper()
	ev := newEnv(t, s, e, nil)
	dir := t.TempDir()
	for i := range nseg {
		p := filepath.Join(dir, fmt.Sprintf(`seg %d\back.img`, i))
		for f, size := range map[string]int64{p: segBytes, p + targets.AuxSuffix: e.Case.Aux} {
			if size == 0 {
				continue
			}
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(f, size); err != nil {
				t.Fatal(err)
			}
		}
		seg := targets.Segment{Index: i, Sectors: segSectors, Dev: stack.EscapeArg(p)}
		if e.Case.Aux > 0 {
			seg.Aux = stack.EscapeArg(p + targets.AuxSuffix)
		}
		ev.add(seg, p)
	}
	ev.create()
	return ev
}

// add adds a segment whose backing device is called name, building what
// the case needs below it.
func (e *env) add(seg targets.Segment, name string) {
	e.t.Helper()
	if e.c.Below != nil {
		arg, err := e.c.Below(e.mgr, seg)
		if err != nil {
			e.t.Fatalf("building below segment %d of %s over %s: %v", seg.Index, e.typ.Name, name, err)
		}
		seg.Below, name = arg, arg
	}
	e.segs = append(e.segs, seg)
	e.names = append(e.names, name)
}

// tableText is the table of e's segments.
func (e *env) tableText() string {
	var b strings.Builder
	for i, seg := range e.segs {
		fmt.Fprintf(&b, "%d %d %s %s\n", i*segSectors, segSectors, e.typ.Name, e.c.Params(seg))
	}
	return b.String()
}

func (e *env) create() {
	e.t.Helper()
	text := e.tableText()
	d, err := e.mgr.Create(stack.CreateOptions{Name: envName, Minor: -1, Table: text})
	if err != nil {
		e.t.Fatalf("create %s over %q:\n%s: %v", e.typ.Name, e.names, text, err)
	}
	e.dev, e.io = d, d
	if e.mount != nil {
		e.io = openFileIO(e.t, filepath.Join(e.mount(e.t, e.mgr), envName))
	}
}

// settle flushes a device of a type with a write cache (Case.Caches), so
// that what was written is on the devices below.
func (e *env) settle() {
	e.t.Helper()
	if !e.c.Caches {
		return
	}
	if err := e.io.Flush(context.Background()); err != nil {
		e.t.Fatalf("flush: %v", err)
	}
}

// stored returns what segment i stores at segment offsets: its memory
// device's contents, or, for a case that builds below its lines, what the
// case's Stored reads.
func (e *env) stored(i int) []byte {
	e.t.Helper()
	if e.c.Stored == nil {
		return e.mems[i].Contents()
	}
	p, err := e.c.Stored(e.mgr, e.segs[i], segBytes)
	if err != nil {
		e.t.Fatalf("reading what segment %d stores: %v", i, err)
	}
	return p
}

// pattern returns n random bytes from seed.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	p := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
	return p
}

// write writes p at off through the device and checks the result against
// what the type does with data.
func (e *env) write(p []byte, off int64) {
	e.t.Helper()
	n, err := e.io.WriteAt(context.Background(), p, off)
	e.checkIO("write", n, err, len(p), off)
}

// read reads len(want) bytes at off through the device and compares them
// with want (for a type that fails I/O: checks the EIO).
func (e *env) read(want []byte, off int64) {
	e.t.Helper()
	got := make([]byte, len(want))
	n, err := e.io.ReadAt(context.Background(), got, off)
	if e.checkIO("read", n, err, len(want), off) && !bytes.Equal(got, want) {
		e.t.Errorf("read of %d bytes at %d: data differs from the model at byte %d", len(want), off, firstDiff(got, want))
	}
}

// checkIO checks one I/O's result; it reports whether data should be
// compared.
func (e *env) checkIO(op string, n int, err error, want int, off int64) bool {
	e.t.Helper()
	if e.c.Data == targets.Fails {
		if n != 0 || !errors.Is(err, syscall.EIO) {
			e.t.Errorf("%s of %d bytes at %d: %d, %v; want 0, EIO", op, want, off, n, err)
		}
		return false
	}
	if n != want || err != nil {
		e.t.Errorf("%s of %d bytes at %d: %d, %v; want %d, nil", op, want, off, n, err, want)
		return false
	}
	return true
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// ShortReadAtEnd pins how I/O meets the end of the device, as it does for a
// block device file (block/fops.c: blkdev_read_iter truncates a read at the
// device size and returns 0 at or past it; blkdev_write_iter truncates a
// write and fails one that starts at the end with ENOSPC). A read that
// crosses the end returns the bytes up to the end and no error, and a read
// at or past the end returns 0 bytes and no error: the device file's reader
// sees a short read and then EOF. The part past the end never reaches the
// target (the backing devices end where the segments end and would fail it),
// and nothing is written into the caller's buffer past the end.
func ShortReadAtEnd(t testing.TB, s Suite, en targets.Entry) {
	typ, c := en.Type, en.Case
	e := newMemEnv(t, s, en, segments(typ))
	ctx := context.Background()
	size := e.dev.Size()
	if want := int64(segments(typ)) * segBytes; size != want {
		t.Fatalf("device size %d, want %d", size, want)
	}
	const tail = 4096
	p := pattern(1, 2*tail)
	// A write crossing the end is short.
	n, err := e.io.WriteAt(ctx, p, size-tail)
	e.checkIO("write crossing the end", n, err, tail, size-tail)
	// One at the end has no room.
	if n, err := e.io.WriteAt(ctx, p[:stack.SectorSize], size); n != 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("write at the end: %d, %v; want 0, ENOSPC", n, err)
	}
	want := make([]byte, tail)
	if c.Data == targets.Stores {
		copy(want, p)
	}
	buf := bytes.Repeat([]byte{0xa5}, 2*tail)
	n, err = e.io.ReadAt(ctx, buf, size-tail)
	if e.checkIO("read crossing the end", n, err, tail, size-tail) && !bytes.Equal(buf[:tail], want) {
		t.Errorf("read crossing the end: data differs at byte %d", firstDiff(buf[:tail], want))
	}
	if !bytes.Equal(buf[tail:], bytes.Repeat([]byte{0xa5}, tail)) {
		t.Errorf("read crossing the end wrote into the buffer past the end")
	}
	for _, off := range []int64{size, size + stack.SectorSize} {
		if n, err := e.io.ReadAt(ctx, buf, off); n != 0 || err != nil {
			t.Errorf("read at %d (device size %d): %d, %v; want 0, nil (EOF)", off, size, n, err)
		}
	}
}

// SegmentOffsets pins that a target sees offsets relative to the start of
// its own segment (include/linux/device-mapper.h: dm_target_offset is the
// bio's sector minus ti->begin; drivers/md/dm-linear.c: linear_map_sector
// adds the device offset to that). Over a table of two segments of the type,
// each over a memory device as long as the segment, a write at byte x of the
// second segment must land at byte x of the second device: a target that
// used device offsets would miss it or run past the device's end. The writes
// have varied sizes and some cross the boundary between the segments, which
// the table splits (dm.c: __split_and_process_bio, max_io_len).
func SegmentOffsets(t testing.TB, s Suite, en targets.Entry) {
	if en.Case.Data != targets.Stores {
		t.Fatalf("SegmentOffsets needs a type that stores data; declare it in NotApplicable for %s (%v)", en.Type.Name, en.Case.Data)
	}
	e := newMemEnv(t, s, en, 2)
	size := e.dev.Size()
	model := pattern(2, int(size))
	// Sector-aligned writes of 1 to 24 sectors, covering the device; the
	// sizes make several of them cross the segment boundary and the
	// targets' chunk and block boundaries.
	for off, i := int64(0), 0; off < size && !t.Failed(); i++ {
		n := min(int64(1+(i*7)%24)*stack.SectorSize, size-off)
		e.write(model[off:off+n], off)
		off += n
	}
	// A write across the boundary again, unaligned to any chunk.
	b := int64(segBytes - 3*stack.SectorSize)
	copy(model[b:b+7*stack.SectorSize], pattern(3, 7*stack.SectorSize))
	e.write(model[b:b+7*stack.SectorSize], b)
	if t.Failed() {
		return
	}
	e.settle()
	for i := range e.segs {
		seg := model[int64(i)*segBytes : int64(i+1)*segBytes]
		if got := e.stored(i); !bytes.Equal(got, seg) {
			t.Errorf("segment %d: its device holds other data than was written at the segment's offsets (first difference at segment byte %d)", i, firstDiff(got, seg))
		}
	}
	e.read(model, 0)
}

// ConcurrentIO pins that a target's I/O functions run concurrently (dm maps
// each bio on the CPU that submits it, taking no lock of its own around a
// target's map) and that concurrent I/O to disjoint ranges each lands whole:
// dm orders nothing between bios in flight, so each goroutine keeps to 4 KiB
// blocks of its own, and every read is compared with a byte-slice model of
// the device (for zero: all zeros; for error: every I/O fails with EIO).
// Flushes run alongside and must succeed. At the end the whole device, and
// for a type that stores data each backing device, equal the model. Run it
// with -race.
func ConcurrentIO(t testing.TB, s Suite, en targets.Entry) {
	typ, c := en.Type, en.Case
	e := newMemEnv(t, s, en, segments(typ))
	const (
		workers = 8
		block   = 4096
		ops     = 300
	)
	size := e.dev.Size()
	model := make([]byte, size)
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			nblocks := int(size/block-int64(w)+workers-1) / workers
			for i := range ops {
				if t.Failed() {
					return
				}
				blk := int64(w+workers*rng.IntN(nblocks)) * block
				s0 := rng.IntN(block / stack.SectorSize)
				ns := 1 + rng.IntN(block/stack.SectorSize-s0)
				off, n := blk+int64(s0)*stack.SectorSize, int64(ns)*stack.SectorSize
				switch op := rng.IntN(10); {
				case op < 5:
					p := pattern(uint64(w)<<32|uint64(i), int(n))
					if c.Data == targets.Stores {
						copy(model[off:off+n], p)
					}
					e.write(p, off)
				case op < 9:
					e.read(model[off:off+n], off)
				default:
					if err := e.io.Flush(ctx); err != nil {
						t.Errorf("flush: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	e.read(model, 0)
	if c.Data == targets.Stores {
		e.settle()
		for i := range e.segs {
			seg := model[int64(i)*segBytes : int64(i+1)*segBytes]
			if got := e.stored(i); !bytes.Equal(got, seg) {
				t.Errorf("segment %d: what its device stores differs from the model at byte %d", i, firstDiff(got, seg))
			}
		}
	}
}

// FlushReachesDevices pins that a flush of the device reaches every device
// the table opened (drivers/md/dm.c: __send_empty_flush sends an empty
// REQ_PREFLUSH bio to every target, num_flush_bios of them, and the targets
// pass it to their devices) and succeeds; a table whose targets opened no
// device (zero, error: dm sets no num_flush_bios for them) completes the
// flush with success.
func FlushReachesDevices(t testing.TB, s Suite, en targets.Entry) {
	typ, c := en.Type, en.Case
	e := newMemEnv(t, s, en, segments(typ))
	opened := e.dev.Live().Devices()
	before := make([]int, len(e.mems))
	for i, m := range e.mems {
		before[i] = m.Flushes()
	}
	if err := e.io.Flush(context.Background()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	for i, m := range e.mems {
		// The device the line names: the segment's memory device, or what
		// the case built below it, over the memory device.
		if !slices.ContainsFunc(opened, func(d stack.BlockDevice) bool { return d.Name() == e.names[i] }) {
			if c.Data == targets.Stores {
				t.Errorf("the table did not open %s, which segment %d's line names", e.names[i], i)
			}
			continue
		}
		if m.Flushes() == before[i] {
			t.Errorf("the flush did not reach %s (segment %d's device)", m.Name(), i)
		}
	}
}

// TableRoundTrip pins that the TABLE form of a target's status is input its
// constructor accepts and that builds the same mapping: `dmsetup table`
// prints it (drivers/md/dm-ioctl.c: retrieve_status with STATUSTYPE_TABLE)
// and dmsetup and lvm load it back. The table text the device prints is
// loaded into the same device and resumed; the device must print the same
// text again and read back the data written before. Reading the text as a
// table must give each target's TABLE status whole (no '#' that starts a
// comment, no line break).
func TableRoundTrip(t testing.TB, s Suite, en targets.Entry) {
	e := newMemEnv(t, s, en, segments(en.Type))
	e.roundTrip()
}

// EscapedPathRoundTrip pins that device paths that need escaping survive the
// round trip: a backing file whose name holds a space and a backslash is
// given to the table escaped (drivers/md/dm-table.c: dm_split_args, where a
// backslash escapes the next character); the TABLE form must print it so
// that splitting gives the path back as one argument, and the printed table
// must load again over the same file.
func EscapedPathRoundTrip(t testing.TB, s Suite, en targets.Entry) {
	e := newFileEnv(t, s, en, segments(en.Type))
	e.roundTrip()
}

// roundTrip writes a pattern, reloads the device with the table it prints,
// and checks the text and the data.
func (e *env) roundTrip() {
	t := e.t
	t.Helper()
	size := e.dev.Size()
	model := make([]byte, size)
	if e.c.Data == targets.Stores {
		model = pattern(4, int(size))
	}
	e.write(pattern(4, int(size)), 0)
	text := e.dev.FormatTable(stack.StatusTable, false)
	lines, err := stack.ParseTable(text)
	if err != nil {
		t.Fatalf("table output does not parse as a table: %v\n%s", err, text)
	}
	i := 0
	e.dev.Live().Targets(func(start, n int64, ty *stack.TargetType, tg stack.Target) {
		st := tg.Status(stack.StatusTable)
		if i >= len(lines) || lines[i].Start != uint64(start) || lines[i].Len != uint64(n) || lines[i].Type != ty.Name || lines[i].Params != strings.Trim(st, " \t\r\v\f") {
			t.Errorf("table output line %d does not read back as target %d (%d %d %s %q):\n%s", i+1, i, start, n, ty.Name, st, text)
		}
		i++
	})
	if len(lines) != i {
		t.Errorf("table output has %d lines for %d targets:\n%s", len(lines), i, text)
	}
	e.checkNames(text, stack.StatusTable, e.c.Data == targets.Stores)
	if err := e.mgr.Load(envName, text, ""); err != nil {
		t.Fatalf("the printed table does not load again: %v\n%s", err, text)
	}
	if err := e.mgr.Resume(envName, stack.Flags{}); err != nil {
		t.Fatalf("resume with the printed table: %v", err)
	}
	if again := e.dev.FormatTable(stack.StatusTable, false); again != text {
		t.Errorf("the round trip changed the table:\n%s\nto\n%s", text, again)
	}
	e.read(model, 0)
}

// checkNames checks that each line of out (table or status text, one line
// per segment) gives segment i's device name back as one argument when
// split with SplitArgs, if the line is to name it (must), and that no line
// names a device in pieces.
func (e *env) checkNames(out string, st stack.StatusType, must bool) {
	t := e.t
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, name := range e.names {
		if i >= len(lines) {
			t.Errorf("output has %d lines for %d segments:\n%s", len(lines), len(e.names), out)
			return
		}
		_, params, _ := strings.Cut(lines[i], e.typ.Name+" ")
		fields := stack.SplitArgs(params)
		if slices.Contains(fields, name) {
			continue
		}
		if must {
			t.Errorf("%s line %d does not give the device name %q back as one argument: %q splits into %q", kind(st), i+1, name, params, fields)
			continue
		}
		// A line that names no device must not hold a piece of the name
		// either.
		if first, _, _ := strings.Cut(name, " "); strings.Contains(params, first) {
			t.Errorf("%s line %d names device %q in pieces: %q splits into %q", kind(st), i+1, name, params, fields)
		}
	}
}

func kind(st stack.StatusType) string {
	if st == stack.StatusTable {
		return "table"
	}
	return "status"
}

// StatusInfoFormat pins the shape of the INFO status (`dmsetup status`,
// drivers/md/dm-ioctl.c: retrieve_status with STATUSTYPE_INFO): one line per
// target, "<start> <len> <type> <status>" with the table's start, length and
// type, and a status that the tools reading it can split into arguments
// with SplitArgs (dm_split_args): no line break or other control character
// inside it, and a device name it prints (Case.InfoNamesDevices) escaped so
// that it comes back as one argument. It runs over backing files whose
// names hold a space and a backslash, after some I/O.
func StatusInfoFormat(t testing.TB, s Suite, en targets.Entry) {
	typ, c := en.Type, en.Case
	e := newFileEnv(t, s, en, segments(typ))
	size := e.dev.Size()
	p := pattern(5, 8192)
	e.write(p, size-8192)
	if c.Data != targets.Stores {
		p = make([]byte, len(p))
	}
	e.read(p, size-8192)
	if err := e.io.Flush(context.Background()); err != nil {
		t.Errorf("flush: %v", err)
	}
	out := e.dev.FormatTable(stack.StatusInfo, false)
	if !strings.HasSuffix(out, "\n") {
		t.Fatalf("status output %q does not end in a line break", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	i := 0
	e.dev.Live().Targets(func(start, n int64, ty *stack.TargetType, tg stack.Target) {
		defer func() { i++ }()
		if i >= len(lines) {
			return
		}
		prefix := fmt.Sprintf("%d %d %s ", start, n, ty.Name)
		status, ok := strings.CutPrefix(lines[i], prefix)
		if !ok {
			t.Errorf("status line %d %q does not start with %q", i+1, lines[i], prefix)
			return
		}
		if j := strings.IndexFunc(status, func(r rune) bool { return r < ' ' || r == 0x7f }); j >= 0 {
			t.Errorf("status line %d holds control character %q: %q", i+1, status[j], status)
		}
		if status != tg.Status(stack.StatusInfo) {
			t.Errorf("status line %d %q is not the target's INFO status %q", i+1, status, tg.Status(stack.StatusInfo))
		}
	})
	if len(lines) != i {
		t.Errorf("status output has %d lines for %d targets:\n%s", len(lines), i, out)
	}
	e.checkNames(out, stack.StatusInfo, c.InfoNamesDevices)
}
