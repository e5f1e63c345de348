package stacktest

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
)

// Data is what a target type, set up by its Case, does with the data of I/O.
type Data int

const (
	// Stores: a write lands on the segment's device at the same offset and
	// reads back (linear, striped, flakey up, dust, delay, multipath).
	Stores Data = iota
	// Zeroes: a read returns zeros, a write succeeds and is dropped
	// (drivers/md/dm-zero.c: zero_map).
	Zeroes
	// Fails: every read and write fails with EIO (drivers/md/dm-target.c:
	// io_err_map kills every bio).
	Fails
)

func (d Data) String() string {
	switch d {
	case Stores:
		return "stores"
	case Zeroes:
		return "zeroes"
	case Fails:
		return "fails"
	}
	return fmt.Sprintf("Data(%d)", int(d))
}

// Case makes one target type usable in the suite.
type Case struct {
	// Params returns the parameters of one segment of the type over the
	// device argument dev (already escaped as table text needs it), mapping
	// byte x of the segment to byte x of dev. A type that takes no device
	// ignores dev.
	Params func(dev string) string
	// Data is what the type does with data.
	Data Data
	// InfoNamesDevices is set for types whose StatusInfo form prints the
	// names of their devices.
	InfoNamesDevices bool
	// NotApplicable names the checks of All that do not apply to the type,
	// each with the reason.
	NotApplicable map[string]string
	// Aux, when not zero, gives every segment's device dev a second device
	// of Aux bytes that Params may name as dev+AuxSuffix: a memory device
	// the suite's Opener resolves, or a file beside the backing file. It is
	// for types whose line names two devices (log-writes: data and log).
	Aux int64
	// Caches is set for types with a volatile write cache (powercut): a
	// completed write need reach the segment's device only at the next
	// flush, so the checks flush the device before they look at the
	// devices below.
	Caches bool

	// mount is the Suite's Mount, which the checks reach their devices
	// through.
	mount Mount
}

// AuxSuffix is what a Case's Params appends to its device argument to name
// the segment's second device (Case.Aux).
const AuxSuffix = ".aux"

// Cases is the suite's table: for each target type dmfuse registers, by
// name, the Case that makes it usable over memory devices.
var Cases = map[string]Case{
	"linear": {Params: func(dev string) string { return dev + " 0" }},
	// One stripe of 8 sectors: the identity mapping, still split at every
	// chunk (MaxIO).
	"striped": {Params: func(dev string) string { return "1 8 " + dev + " 0" }, InfoNamesDevices: true},
	"zero": {Params: func(string) string { return "" }, Data: Zeroes, NotApplicable: map[string]string{
		"SegmentOffsets":       "zero stores nothing, so no offset can be seen",
		"EscapedPathRoundTrip": "zero takes no device",
	}},
	"error": {Params: func(string) string { return "" }, Data: Fails, NotApplicable: map[string]string{
		"SegmentOffsets":       "error fails every I/O, so no offset can be seen",
		"EscapedPathRoundTrip": "error takes no device (its arguments are ignored and not printed)",
	}},
	// A log device per segment; the log itself is not looked at.
	"log-writes": {Params: func(dev string) string { return dev + " " + dev + AuxSuffix }, Aux: 4 << 20},
	// Up 1 s, down 0 s: never down.
	"flakey": {Params: func(dev string) string { return dev + " 0 1 0" }},
	// No bad blocks: dust passes everything until blocks are added and it
	// is enabled.
	"dust": {Params: func(dev string) string { return dev + " 0 512" }, InfoNamesDevices: true},
	// A delay of 0 ms passes I/O straight through.
	"delay": {Params: func(dev string) string { return dev + " 0 0" }},
	// The default cache bound (32 MiB) holds everything the checks write:
	// writes reach the device at flushes and at the suspend of a reload.
	"powercut": {Params: func(dev string) string { return dev + " 0" }, Caches: true},
	// One priority group of one path, round-robin.
	"multipath": {Params: func(dev string) string { return "0 0 1 1 round-robin 0 1 1 " + dev + " 1" }, InfoNamesDevices: true,
		NotApplicable: map[string]string{
			"SegmentOffsets": "multipath is a singleton type: alone in its table, so its segment always starts at sector 0",
		}},
	// A pool with its metadata on the second device: the pool device maps
	// its own I/O onto the data device 1:1.
	"thin-pool": {Params: func(dev string) string { return dev + AuxSuffix + " " + dev + " 128 0" }, Aux: 4 << 20,
		NotApplicable: map[string]string{
			"SegmentOffsets": "thin-pool is a singleton type: alone in its table, so its segment always starts at sector 0",
		}},
	// What a thin line over a pool device dev with device 1 would be.
	"thin": {Params: func(dev string) string { return dev + " 1" }, NotApplicable: map[string]string{
		"ShortReadAtEnd":       thinNeedsPool,
		"SegmentOffsets":       thinNeedsPool,
		"ConcurrentIO":         thinNeedsPool,
		"FlushReachesDevices":  thinNeedsPool,
		"TableRoundTrip":       thinNeedsPool,
		"EscapedPathRoundTrip": thinNeedsPool,
		"StatusInfoFormat":     thinNeedsPool,
	}},
}

// thinNeedsPool is why no check of the suite applies to thin.
const thinNeedsPool = "a thin device needs a thin-pool device of the same manager and a create_thin message, which a one-type table over plain devices cannot give; package thin's tests and test/thin_test.go cover it"

// Check is one conformance check of typ, set up as c says.
//
// A check takes a testing.TB, so that the suite's own tests can run it on a
// recorder and see it fail on a faulty target.
type Check func(t testing.TB, typ *stack.TargetType, c Case)

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

// Run runs every check of All on typ as a subtest, in name order, on the
// devices in process. A check that c declares not applicable is skipped
// with the declared reason; a declaration naming no check of All is an
// error.
func Run(t *testing.T, typ *stack.TargetType, c Case) {
	t.Helper()
	Suite{}.Run(t, typ, c)
}

// RunRegistry runs the suite on every type of reg with its Case from Cases,
// one subtest per type, on the devices in process. A registered type that
// Cases does not know fails.
func RunRegistry(t *testing.T, reg *stack.Registry) {
	t.Helper()
	Suite{}.RunRegistry(t, reg)
}

// Missing returns the names of the types of reg that Cases does not know, in
// name order: the types RunRegistry fails for.
func Missing(reg *stack.Registry) []string {
	var out []string
	for _, typ := range reg.Types() {
		if _, ok := Cases[typ.Name]; !ok {
			out = append(out, typ.Name)
		}
	}
	return out
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

// Run runs every check of All on typ as a subtest, in name order. A check
// that c declares not applicable is skipped with the declared reason; a
// declaration naming no check of All is an error.
func (s Suite) Run(t *testing.T, typ *stack.TargetType, c Case) {
	t.Helper()
	c.mount = s.Mount
	for name := range c.NotApplicable {
		if _, ok := All[name]; !ok {
			t.Errorf("%s: NotApplicable names %q, which is no check of the suite", typ.Name, name)
		}
	}
	names := make([]string, 0, len(All))
	for name := range All {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			if why, ok := c.NotApplicable[name]; ok {
				t.Skipf("does not apply to %s: %s", typ.Name, why)
			}
			All[name](t, typ, c)
		})
	}
}

// RunRegistry runs the suite on every type of reg with its Case from Cases,
// one subtest per type. A registered type that Cases does not know fails.
func (s Suite) RunRegistry(t *testing.T, reg *stack.Registry) {
	t.Helper()
	for _, typ := range reg.Types() {
		t.Run(typ.Name, func(t *testing.T) {
			c, ok := Cases[typ.Name]
			if !ok {
				t.Fatalf("target type %s has no entry in stacktest.Cases: add the table line that makes it usable over memory devices", typ.Name)
			}
			s.Run(t, typ, c)
		})
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
	t   testing.TB
	typ *stack.TargetType
	c   Case
	mgr *stack.Manager
	dev *stack.Device
	// io is how the checks do I/O to dev: dev itself, or its file on the
	// Suite's mount.
	io   deviceIO
	mems []*MemDevice // memory backing devices, one per segment (newMemEnv)
	// names are what each segment's device prints as: a memory device's
	// name or a backing file's absolute path.
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

// newManager returns a manager for typ alone on a manual clock, removed with
// everything it made when the test ends.
func newManager(t testing.TB, typ *stack.TargetType, open func(string) (stack.BlockDevice, error)) *stack.Manager {
	reg, err := stack.NewRegistry(typ)
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
	return m
}

// tableText is a table of one segment per device argument.
func tableText(typ *stack.TargetType, c Case, args []string) string {
	var b strings.Builder
	for i, a := range args {
		fmt.Fprintf(&b, "%d %d %s %s\n", i*segSectors, segSectors, typ.Name, c.Params(stack.EscapeArg(a)))
	}
	return b.String()
}

// newMemEnv makes a device of nseg segments of typ, segment i over memory
// device "mem<i>".
func newMemEnv(t testing.TB, typ *stack.TargetType, c Case, nseg int) *env {
	t.Helper()
	e := &env{t: t, typ: typ, c: c}
	open := Opener{}
	for i := range nseg {
		name := fmt.Sprintf("mem%d", i)
		m := NewMemDevice(name, segBytes)
		open[name] = m
		e.mems = append(e.mems, m)
		e.names = append(e.names, name)
		if c.Aux > 0 {
			open[name+AuxSuffix] = NewMemDevice(name+AuxSuffix, c.Aux)
		}
	}
	e.mgr = newManager(t, typ, open.Open)
	e.create()
	return e
}

// newFileEnv makes a device of nseg segments of typ, segment i over a
// backing file whose name holds a space and a backslash.
func newFileEnv(t testing.TB, typ *stack.TargetType, c Case, nseg int) *env {
	t.Helper()
	e := &env{t: t, typ: typ, c: c, mgr: newManager(t, typ, nil)}
	dir := t.TempDir()
	for i := range nseg {
		p := filepath.Join(dir, fmt.Sprintf(`seg %d\back.img`, i))
		for f, size := range map[string]int64{p: segBytes, p + AuxSuffix: c.Aux} {
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
		e.names = append(e.names, p)
	}
	e.create()
	return e
}

func (e *env) create() {
	e.t.Helper()
	text := tableText(e.typ, e.c, e.names)
	d, err := e.mgr.Create(stack.CreateOptions{Name: envName, Minor: -1, Table: text})
	if err != nil {
		e.t.Fatalf("create %s over %q:\n%s: %v", e.typ.Name, e.names, text, err)
	}
	e.dev, e.io = d, d
	if e.c.mount != nil {
		e.io = openFileIO(e.t, filepath.Join(e.c.mount(e.t, e.mgr), envName))
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
	if e.c.Data == Fails {
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
func ShortReadAtEnd(t testing.TB, typ *stack.TargetType, c Case) {
	e := newMemEnv(t, typ, c, segments(typ))
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
	if c.Data == Stores {
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
func SegmentOffsets(t testing.TB, typ *stack.TargetType, c Case) {
	if c.Data != Stores {
		t.Fatalf("SegmentOffsets needs a type that stores data; declare it in NotApplicable for %s (%v)", typ.Name, c.Data)
	}
	e := newMemEnv(t, typ, c, 2)
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
	for i, m := range e.mems {
		seg := model[int64(i)*segBytes : int64(i+1)*segBytes]
		if got := m.Contents(); !bytes.Equal(got, seg) {
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
func ConcurrentIO(t testing.TB, typ *stack.TargetType, c Case) {
	e := newMemEnv(t, typ, c, segments(typ))
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
					if c.Data == Stores {
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
	if c.Data == Stores {
		e.settle()
		for i, m := range e.mems {
			seg := model[int64(i)*segBytes : int64(i+1)*segBytes]
			if got := m.Contents(); !bytes.Equal(got, seg) {
				t.Errorf("backing device %d differs from the model at byte %d", i, firstDiff(got, seg))
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
func FlushReachesDevices(t testing.TB, typ *stack.TargetType, c Case) {
	e := newMemEnv(t, typ, c, segments(typ))
	opened := e.dev.Live().Devices()
	before := make([]int, len(e.mems))
	for i, m := range e.mems {
		before[i] = m.Flushes()
	}
	if err := e.io.Flush(context.Background()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	for i, m := range e.mems {
		if !slices.Contains(opened, stack.BlockDevice(m)) {
			if c.Data == Stores {
				t.Errorf("the table did not open %s, which segment %d's line names", m.Name(), i)
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
func TableRoundTrip(t testing.TB, typ *stack.TargetType, c Case) {
	e := newMemEnv(t, typ, c, segments(typ))
	e.roundTrip()
}

// EscapedPathRoundTrip pins that device paths that need escaping survive the
// round trip: a backing file whose name holds a space and a backslash is
// given to the table escaped (drivers/md/dm-table.c: dm_split_args, where a
// backslash escapes the next character); the TABLE form must print it so
// that splitting gives the path back as one argument, and the printed table
// must load again over the same file.
func EscapedPathRoundTrip(t testing.TB, typ *stack.TargetType, c Case) {
	e := newFileEnv(t, typ, c, segments(typ))
	e.roundTrip()
}

// roundTrip writes a pattern, reloads the device with the table it prints,
// and checks the text and the data.
func (e *env) roundTrip() {
	t := e.t
	t.Helper()
	size := e.dev.Size()
	model := make([]byte, size)
	if e.c.Data == Stores {
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
	e.checkNames(text, stack.StatusTable, e.c.Data == Stores)
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
func StatusInfoFormat(t testing.TB, typ *stack.TargetType, c Case) {
	e := newFileEnv(t, typ, c, segments(typ))
	size := e.dev.Size()
	p := pattern(5, 8192)
	e.write(p, size-8192)
	if c.Data != Stores {
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
