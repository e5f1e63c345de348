package logwrites

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/golden"
	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
	"github.com/dmfuse/dmfuse/stats"
)

// lwBlockDev is a memory device with another logical block size.
type lwBlockDev struct {
	*stacktest.MemDevice
	bs int64
}

func (d lwBlockDev) LogicalBlockSize() int64 { return d.bs }

// newTestLogWrites builds a log-writes target over data and logdev for a
// segment of the data device's size.
func newTestLogWrites(t testing.TB, data, logdev stack.BlockDevice, extra ...string) *logWrites {
	t.Helper()
	c := &stack.Ctor{Len: data.Size() / stack.SectorSize, Context: context.Background(), Open: func(arg string) (stack.BlockDevice, error) {
		for _, d := range []stack.BlockDevice{data, logdev} {
			if d.Name() == arg {
				return d, nil
			}
		}
		return nil, syscall.ENOENT
	}}
	tg, err := Type.New(c, append([]string{data.Name(), logdev.Name()}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	l := tg.(*logWrites)
	t.Cleanup(func() {
		select {
		case <-l.done:
		default:
			l.Close()
		}
	})
	return l
}

// waitLogged waits until the worker has logged (or dropped) every queued
// block.
func (l *logWrites) waitLogged(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.logged.Load() != l.queued.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("log-writes worker still has %d blocks after 10s", l.queued.Load()-l.logged.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

func (l *logWrites) mustStatus(t testing.TB, want string) {
	t.Helper()
	l.waitLogged(t)
	if got := l.Status(stack.StatusInfo); got != want {
		t.Errorf("status %q, want %q", got, want)
	}
}

var lwCtx = context.Background()

func lwWrite(t testing.TB, tg stack.Target, ctx context.Context, off int64, b byte, n int) {
	t.Helper()
	if _, err := tg.WriteAt(ctx, bytes.Repeat([]byte{b}, n), off); err != nil {
		t.Fatalf("write %d bytes at %d: %v", n, off, err)
	}
}

func lwFlush(t testing.TB, tg stack.Target) {
	t.Helper()
	if err := tg.(stack.Flusher).Flush(lwCtx); err != nil {
		t.Fatal(err)
	}
}

func lwMark(t testing.TB, tg stack.Target, name string) {
	t.Helper()
	if _, err := tg.(stack.Messager).Message(lwCtx, []string{"mark", name}); err != nil {
		t.Fatal(err)
	}
}

// lwEntry is an expected log entry.
type lwEntry struct {
	sector, nr, flags uint64
	name              string
	data              []byte
}

// lwImage builds the bytes a log device of size bytes should hold, field
// by field as the on-disk format lays them out, without the package's
// encoder; count < 0 leaves the super unwritten.
func lwImage(s, size int, count int, ents []lwEntry) []byte {
	b := make([]byte, size)
	if count >= 0 {
		copy(b, "rhswfsj\x00")
		binary.LittleEndian.PutUint64(b[8:], 1)
		binary.LittleEndian.PutUint64(b[16:], uint64(count))
		binary.LittleEndian.PutUint32(b[24:], uint32(s))
	}
	pos := s
	for _, e := range ents {
		binary.LittleEndian.PutUint64(b[pos:], e.sector)
		binary.LittleEndian.PutUint64(b[pos+8:], e.nr)
		binary.LittleEndian.PutUint64(b[pos+16:], e.flags)
		binary.LittleEndian.PutUint64(b[pos+24:], uint64(len(e.name)))
		copy(b[pos+32:], e.name)
		pos += s
		if e.flags&4 == 0 {
			copy(b[pos:], e.data)
			pos += int(e.nr) * s
		}
	}
	return b
}

// hexLine formats the 16 bytes of b at off as one line of `hexdump -C`.
func hexLine(b []byte, off int) string {
	var out strings.Builder
	line := b[off:min(off+16, len(b))]
	fmt.Fprintf(&out, "%08x ", off)
	for i := range 16 {
		if i == 8 {
			out.WriteByte(' ')
		}
		if i < len(line) {
			fmt.Fprintf(&out, " %02x", line[i])
		} else {
			out.WriteString("   ")
		}
	}
	out.WriteString("  |")
	for _, c := range line {
		if c < 0x20 || c >= 0x7f {
			c = '.'
		}
		out.WriteByte(c)
	}
	out.WriteString("|")
	return out.String()
}

// hexdumpC prints b as `hexdump -C` does, repeated lines folded into "*".
func hexdumpC(b []byte) string {
	var out strings.Builder
	star := false
	for off := 0; off < len(b); off += 16 {
		if off >= 16 && off+16 <= len(b) && bytes.Equal(b[off:off+16], b[off-16:off]) {
			if !star {
				out.WriteString("*\n")
				star = true
			}
			continue
		}
		star = false
		out.WriteString(hexLine(b, off) + "\n")
	}
	fmt.Fprintf(&out, "%08x\n", len(b))
	return out.String()
}

// checkHexLines checks that each `hexdump -C` line of want shows the bytes
// of b at its offset.
func checkHexLines(t *testing.T, what string, b []byte, want string) {
	t.Helper()
	for _, w := range strings.Split(strings.TrimSpace(want), "\n") {
		var off int
		if _, err := fmt.Sscanf(w, "%x", &off); err != nil {
			t.Fatalf("bad vector line %q", w)
		}
		if got := hexLine(b, off); got != w {
			t.Errorf("%s at %#x:\n got %s\nwant %s", what, off, got, w)
		}
	}
}

func lwCompare(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Errorf("%s: log differs from byte %#x on:\n got %s\nwant %s", what, i, hexLine(got, i&^15), hexLine(want, i&^15))
	}
}

// The dumps below are copied from the on-disk vectors of the log-writes
// format, as `hexdump -C` printed them.
const lwLogADump = `00000000  72 68 73 77 66 73 6a 00  01 00 00 00 00 00 00 00  |rhswfsj.........|
00000010  05 00 00 00 00 00 00 00  00 02 00 00 00 00 00 00  |................|
00000020  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
*
00000200  00 00 00 00 00 00 00 00  01 00 00 00 00 00 00 00  |................|
00000210  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
*
00000400  aa aa aa aa aa aa aa aa  aa aa aa aa aa aa aa aa  |................|
*
00000600  08 00 00 00 00 00 00 00  02 00 00 00 00 00 00 00  |................|
00000610  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
*
00000800  bb bb bb bb bb bb bb bb  bb bb bb bb bb bb bb bb  |................|
*
00000c00  10 00 00 00 00 00 00 00  01 00 00 00 00 00 00 00  |................|
00000c10  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
*
00000e00  cc cc cc cc cc cc cc cc  cc cc cc cc cc cc cc cc  |................|
*
00001000  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
00001010  01 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
00001020  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
*
00001210  08 00 00 00 00 00 00 00  04 00 00 00 00 00 00 00  |................|
00001220  6d 6b 66 73 00 00 00 00  00 00 00 00 00 00 00 00  |mkfs............|
00001230  00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
*
`

const lwLogAEnd = `00001410  08 00 00 00 00 00 00 00  11 00 00 00 00 00 00 00  |................|
00001420  64 6d 2d 6c 6f 67 2d 77  72 69 74 65 73 2d 65 6e  |dm-log-writes-en|
00001430  64 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |d...............|`

const lwLogBLines = `00000000  72 68 73 77 66 73 6a 00  01 00 00 00 00 00 00 00  |rhswfsj.........|
00000010  06 00 00 00 00 00 00 00  00 02 00 00 00 00 00 00  |................|
00000200  00 00 00 00 00 00 00 00  08 00 00 00 00 00 00 00  |................|
00001410  01 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
00001600  08 00 00 00 00 00 00 00  01 00 00 00 00 00 00 00  |................|
00001610  12 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
00001a00  64 00 00 00 00 00 00 00  00 08 00 00 00 00 00 00  |d...............|
00001a10  04 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
00001c10  01 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |................|
00001e10  08 00 00 00 00 00 00 00  05 00 00 00 00 00 00 00  |................|
00001e20  66 73 79 6e 63 00 00 00  00 00 00 00 00 00 00 00  |fsync...........|`

const lwLogCLines = `00000000  72 68 73 77 66 73 6a 00  01 00 00 00 00 00 00 00  |rhswfsj.........|
00000010  02 00 00 00 00 00 00 00  00 10 00 00 00 00 00 00  |................|
00001000  02 00 00 00 00 00 00 00  01 00 00 00 00 00 00 00  |................|
00002000  33 33 33 33 33 33 33 33  33 33 33 33 33 33 33 33  |3333333333333333|
00003010  08 00 00 00 00 00 00 00  11 00 00 00 00 00 00 00  |................|
00003020  64 6d 2d 6c 6f 67 2d 77  72 69 74 65 73 2d 65 6e  |dm-log-writes-en|
00003030  64 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00  |d...............|`

// TestLogWritesLogA drives the target through the bios of the first vector
// (three writes, a flush, a mark, then teardown) and checks status after
// each step and the log's bytes against the vector's dump.
func TestLogWritesLogA(t *testing.T) {
	data, logd := stacktest.NewMemDevice("data", 1<<20), stacktest.NewMemDevice("log", 64<<10)
	l := newTestLogWrites(t, data, logd)
	l.mustStatus(t, "0 0")
	lwWrite(t, l, lwCtx, 0, 0xaa, 512)
	lwWrite(t, l, lwCtx, 8*512, 0xbb, 1024)
	lwWrite(t, l, lwCtx, 16*512, 0xcc, 512)
	l.mustStatus(t, "0 0")
	if !bytes.Equal(logd.Bytes(), make([]byte, 64<<10)) {
		t.Error("the log device was written before any flush or mark")
	}
	lwFlush(t, l)
	l.mustStatus(t, "4 8")
	if !bytes.Equal(logd.Bytes()[:512], make([]byte, 512)) {
		t.Error("the super was written after a flush entry")
	}
	lwMark(t, l, "mkfs")
	l.mustStatus(t, "5 9")

	ents := []lwEntry{
		{sector: 0, nr: 1, data: bytes.Repeat([]byte{0xaa}, 512)},
		{sector: 8, nr: 2, data: bytes.Repeat([]byte{0xbb}, 1024)},
		{sector: 16, nr: 1, data: bytes.Repeat([]byte{0xcc}, 512)},
		{flags: FlagFlush},
		{flags: FlagMark, name: "mkfs"},
	}
	got := logd.Bytes()
	lwCompare(t, "after mark mkfs", got, lwImage(512, 64<<10, 5, ents))
	if d := hexdumpC(got[:0x1400]); d != lwLogADump+"00001400\n" {
		t.Errorf("hexdump -C after mark mkfs:\n%s\nwant:\n%s00001400", d, lwLogADump)
	}
	golden.Check(t, "testdata/logA.golden", []byte(hexdumpC(got[:0x1600])))

	l.Close()
	ents = append(ents, lwEntry{flags: FlagMark, name: EndMark})
	lwCompare(t, "after teardown", logd.Bytes(), lwImage(512, 64<<10, 6, ents))
	checkHexLines(t, "after teardown", logd.Bytes(), lwLogAEnd)
	if got[0x10] != 6 {
		t.Errorf("super count after teardown %d, want 6", got[0x10])
	}
}

// TestLogWritesLogB: a write, a flush, a FUA write (logged at once, super
// rewritten), a discard (header only), a flush, a mark. dmfuse requests
// carry no REQ_META, so the FUA entry's flags are 0x02 where the vector,
// recorded from a REQ_META journal write, has 0x12; every other byte is the
// vector's.
func TestLogWritesLogB(t *testing.T) {
	data, logd := stacktest.NewMemDevice("data", 2<<20), stacktest.NewMemDevice("log", 64<<10)
	l := newTestLogWrites(t, data, logd)
	lwWrite(t, l, lwCtx, 0, 0x11, 4096)
	lwFlush(t, l)
	l.mustStatus(t, "2 10")
	lwWrite(t, l, stack.WithFUA(lwCtx), 8*512, 0x22, 512)
	l.mustStatus(t, "3 12")
	if c := binary.LittleEndian.Uint64(logd.Bytes()[16:]); c != 3 {
		t.Errorf("super count after the FUA write %d, want 3", c)
	}
	if err := l.Discard(lwCtx, 100*512, 2048*512); err != nil {
		t.Fatal(err)
	}
	lwFlush(t, l)
	lwMark(t, l, "fsync")
	l.mustStatus(t, "6 15")

	want := lwImage(512, 64<<10, 6, []lwEntry{
		{sector: 0, nr: 8, data: bytes.Repeat([]byte{0x11}, 4096)},
		{flags: FlagFlush},
		{sector: 8, nr: 1, flags: FlagFUA | FlagMetadata, data: bytes.Repeat([]byte{0x22}, 512)},
		{sector: 100, nr: 2048, flags: FlagDiscard},
		{flags: FlagFlush},
		{flags: FlagMark, name: "fsync"},
	})
	checkHexLines(t, "vector B as built", want, lwLogBLines)
	want[0x1610] = FlagFUA // no REQ_META in dmfuse
	lwCompare(t, "log B", logd.Bytes(), want)
	golden.Check(t, "testdata/logB.golden", []byte(hexdumpC(logd.Bytes()[:0x2000])))
	// The discard reached the data device (a memory device zeroes).
	if !bytes.Equal(data.Bytes()[100*512:2148*512], make([]byte, 2048*512)) {
		t.Error("discard did not reach the data device")
	}
}

// TestLogWritesLogC: a data device with 4096-byte blocks, one write left
// unflushed until teardown.
func TestLogWritesLogC(t *testing.T) {
	data, logd := lwBlockDev{stacktest.NewMemDevice("data", 1<<20), 4096}, stacktest.NewMemDevice("log", 64<<10)
	l := newTestLogWrites(t, data, logd)
	l.mustStatus(t, "0 7")
	lwWrite(t, l, lwCtx, 8192, 0x33, 4096)
	l.mustStatus(t, "0 7")
	l.Close()
	if got := l.Status(stack.StatusInfo); got != "2 31" {
		t.Errorf("status after teardown %q, want \"2 31\"", got)
	}
	want := lwImage(4096, 64<<10, 2, []lwEntry{
		{sector: 2, nr: 1, data: bytes.Repeat([]byte{0x33}, 4096)},
		{flags: FlagMark, name: EndMark},
	})
	checkHexLines(t, "vector C as built", want, lwLogCLines)
	lwCompare(t, "log C", logd.Bytes(), want)
	golden.Check(t, "testdata/logC.golden", []byte(hexdumpC(logd.Bytes()[:0x4000])))
	// With 4096-byte units, I/O must be aligned to them.
	if _, err := l.WriteAt(lwCtx, make([]byte, 512), 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("512-byte write on a 4096-byte log: %v, want EINVAL", err)
	}
}

// lwOps runs I/O on a log-writes target in goroutines, over a data device
// that holds every write and flush until the test releases it, so that the
// test decides the order in which they complete.
type lwOps struct {
	t    *testing.T
	l    *logWrites
	gate *stacktest.Fault
	held map[int64]*stacktest.Held // by byte offset; the flush is -1
	done map[int64]chan error
}

func newLWOps(t *testing.T) *lwOps {
	data, _ := stacktest.NewMemFaultDevice("data", 1<<20)
	gate := data.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Write, ioop.Flush), Hold: true})
	t.Cleanup(gate.Remove)
	return &lwOps{t: t, l: newTestLogWrites(t, data, stacktest.NewMemDevice("log", 1<<20)), gate: gate,
		held: map[int64]*stacktest.Held{}, done: map[int64]chan error{}}
}

// submit starts a write of one 4096-byte block (blk) or, for blk < 0, a
// flush, and waits until it has been mapped and reached the data device.
func (o *lwOps) submit(blk int64, fua bool) {
	o.t.Helper()
	ch := make(chan error, 1)
	key := blk * 4096
	if blk < 0 {
		key = -1
		go func() { ch <- o.l.Flush(lwCtx) }()
	} else {
		ctx := lwCtx
		if fua {
			ctx = stack.WithFUA(ctx)
		}
		go func() {
			_, err := o.l.WriteAt(ctx, bytes.Repeat([]byte{byte(blk + 1)}, 4096), key)
			ch <- err
		}()
	}
	o.done[key] = ch
	h := <-o.gate.Held()
	got := h.Off
	if h.Op == ioop.Flush {
		got = -1
	}
	if got != key {
		o.t.Fatalf("I/O %d arrived while waiting for %d", got, key)
	}
	o.held[key] = h
}

// complete releases the I/O of blk (-1: the flush) and waits for it.
func (o *lwOps) complete(blk int64) {
	o.t.Helper()
	key := blk * 4096
	if blk < 0 {
		key = -1
	}
	o.held[key].Release()
	delete(o.held, key)
	if err := <-o.done[key]; err != nil {
		o.t.Fatal(err)
	}
}

// entries closes the target and lists the log's entries as "w<blk>",
// "fua<blk>", "flush", "discard<blk>" or "mark:<name>".
func (o *lwOps) entries() string {
	o.t.Helper()
	o.l.Close()
	return lwList(o.t, o.l.logdev.(*stacktest.MemDevice).Bytes())
}

func lwList(t *testing.T, log []byte) string {
	t.Helper()
	r, err := Open(bytes.NewReader(log), int64(len(log)), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for r.More() {
		e, err := r.Next(int(r.SectorSize()))
		if err != nil {
			t.Fatal(err)
		}
		blk := e.Sector * uint64(r.SectorSize()) / 4096
		switch e.Flags {
		case 0:
			out = append(out, fmt.Sprintf("w%d", blk))
		case FlagFUA:
			out = append(out, fmt.Sprintf("fua%d", blk))
		case FlagFlush:
			out = append(out, "flush")
		case FlagDiscard:
			out = append(out, fmt.Sprintf("discard%d", blk))
		case FlagMark:
			out = append(out, "mark:"+e.Mark())
		default:
			out = append(out, fmt.Sprintf("flags%#x", e.Flags))
		}
		if err := r.SkipData(e); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(out, " ")
}

// TestLogWritesOrdering checks the kernel's ordering rules: plain writes in
// completion order at the flush that covers them, writes that complete after
// a flush was submitted wait for the next flush, FUA writes and marks go
// ahead of unflushed writes, teardown logs what is left before the end mark.
func TestLogWritesOrdering(t *testing.T) {
	const end = "mark:" + EndMark
	t.Run("completion order", func(t *testing.T) {
		o := newLWOps(t)
		o.submit(1, false)
		o.submit(2, false)
		o.submit(3, false)
		o.complete(3)
		o.complete(2)
		o.submit(-1, false)
		o.complete(1)
		o.complete(-1)
		if got, want := o.entries(), "w3 w2 flush w1 "+end; got != want {
			t.Errorf("log %q, want %q", got, want)
		}
	})
	t.Run("flush and FUA in flight", func(t *testing.T) {
		o := newLWOps(t)
		o.submit(1, false) // a
		o.submit(2, false) // b
		o.submit(3, false) // c
		o.complete(3)
		o.complete(1)
		o.submit(-1, false)
		o.submit(4, true) // d, FUA
		o.complete(2)
		o.complete(-1)
		o.complete(4)
		if got, want := o.entries(), "w3 w1 flush fua4 w2 "+end; got != want {
			t.Errorf("log %q, want %q", got, want)
		}
	})
	t.Run("FUA ahead of unflushed", func(t *testing.T) {
		o := newLWOps(t)
		o.submit(1, false)
		o.complete(1)
		o.submit(2, true)
		o.complete(2)
		o.l.mustStatus(t, "1 9")
		if got, want := o.entries(), "fua2 w1 "+end; got != want {
			t.Errorf("log %q, want %q", got, want)
		}
	})
	t.Run("mark before unflushed", func(t *testing.T) {
		o := newLWOps(t)
		o.submit(1, false)
		o.complete(1)
		lwMark(t, o.l, "m")
		o.submit(-1, false)
		o.complete(-1)
		if got, want := o.entries(), "mark:m w1 flush "+end; got != want {
			t.Errorf("log %q, want %q", got, want)
		}
	})
	t.Run("discard like a write", func(t *testing.T) {
		o := newLWOps(t)
		o.submit(1, false)
		o.complete(1)
		if err := o.l.Discard(lwCtx, 5*4096, 4096); err != nil {
			t.Fatal(err)
		}
		o.submit(-1, false)
		o.complete(-1)
		if got, want := o.entries(), "w1 discard5 flush "+end; got != want {
			t.Errorf("log %q, want %q", got, want)
		}
	})
	t.Run("teardown", func(t *testing.T) {
		o := newLWOps(t)
		o.submit(1, false)
		o.complete(1)
		if got, want := o.entries(), "w1 "+end; got != want {
			t.Errorf("log %q, want %q", got, want)
		}
	})
}

// TestLogWritesFailedWriteLogged: the target does not look at the result of
// a write; one that failed on the data device is logged all the same.
func TestLogWritesFailedWriteLogged(t *testing.T) {
	logd := stacktest.NewMemDevice("log", 1<<20)
	data, _ := stacktest.NewMemFaultDevice("data", 1<<20)
	data.Fail(ioop.SetOf(ioop.Write), syscall.EIO)
	l := newTestLogWrites(t, data, logd)
	if _, err := l.WriteAt(lwCtx, make([]byte, 512), 16*512); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write to a failing device: %v, want EIO", err)
	}
	l.Close()
	if got, want := lwList(t, logd.Bytes()), "w2 mark:"+EndMark; got != want {
		t.Errorf("log %q, want %q", got, want)
	}
}

// TestLogWritesTableStatusMessages covers the constructor's arguments, the
// table and status strings and the mark message's rules.
func TestLogWritesTableStatusMessages(t *testing.T) {
	data, logd := stacktest.NewMemDevice("data", 1<<20), stacktest.NewMemDevice("log", 1<<20)
	open := func(arg string) (stack.BlockDevice, error) {
		switch arg {
		case "data":
			return data, nil
		case "log":
			return logd, nil
		}
		return nil, syscall.ENOENT
	}
	for _, tc := range []struct {
		args, err string
		errno     syscall.Errno
	}{
		{"", "Invalid argument count", syscall.EINVAL},
		{"data", "Invalid argument count", syscall.EINVAL},
		{"nosuch log", "Device lookup failed: no such file or directory", syscall.ENOENT},
		{"data nosuch", "Log device lookup failed: no such file or directory", syscall.ENOENT},
		{"data mapped", "Log device lookup failed: mapped: no such mapped device", syscall.EINVAL},
	} {
		_, err := Type.New(&stack.Ctor{Len: 2048, Open: func(arg string) (stack.BlockDevice, error) {
			if arg == "mapped" {
				return nil, stack.Errorf("Device lookup failed: mapped: no such mapped device")
			}
			return open(arg)
		}}, stack.SplitArgs(tc.args))
		if err == nil || err.Error() != tc.err || !errors.Is(err, tc.errno) {
			t.Errorf("log-writes %q: %v, want %q (%v)", tc.args, err, tc.err, tc.errno)
		}
	}
	if _, err := Type.New(&stack.Ctor{Len: 4096, Open: open}, []string{"data", "log"}); err == nil || !strings.Contains(err.Error(), "too small for target") {
		t.Errorf("a segment longer than the data device: %v", err)
	}

	l := newTestLogWrites(t, data, logd, "junk") // extra arguments are ignored
	if got := l.Status(stack.StatusTable); got != "data log" {
		t.Errorf("table %q", got)
	}
	l.mustStatus(t, "0 0")
	lwWrite(t, l, lwCtx, 0, 1, 4096)
	lwFlush(t, l)
	l.mustStatus(t, "2 10")
	lwMark(t, l, "a")
	l.mustStatus(t, "3 11")
	if c := binary.LittleEndian.Uint64(logd.Bytes()[16:]); c != 3 {
		t.Errorf("super count %d, want 3", c)
	}

	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"mark"}, "Invalid log-writes message arguments, expect 2 arguments, got 1"},
		{[]string{"mark", "a", "b"}, "Invalid log-writes message arguments, expect 2 arguments, got 3"},
		{[]string{"note", "a"}, "Unrecognised log writes target message received: note"},
		{[]string{"MARK", "b"}, ""},
		{[]string{"Mark", strings.Repeat("x", 600)}, ""},
		{[]string{"mark", "nul\x00cut"}, ""},
	} {
		_, err := l.Message(lwCtx, tc.args)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || err.Error() != tc.err || !errors.Is(err, syscall.EINVAL)) {
			t.Errorf("message %q: %v, want %q", tc.args, err, tc.err)
		}
	}
	l.Close()
	r, err := Open(bytes.NewReader(logd.Bytes()), 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	var marks []string
	var lens []uint64
	for r.More() {
		e, err := r.Next(512)
		if err != nil {
			t.Fatal(err)
		}
		if e.Flags == FlagMark {
			marks = append(marks, e.Mark())
			lens = append(lens, e.DataLen)
		}
		if err := r.SkipData(e); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"a", "b", strings.Repeat("x", 479), "nul", EndMark}
	if fmt.Sprint(marks) != fmt.Sprint(want) || lens[2] != 479 {
		t.Errorf("marks %q (lengths %v), want %q with the long one cut to 479 bytes", marks, lens, want)
	}
}

// TestLogWritesFullLogDevice: a log device of 8 sectors takes one entry of
// 1+5 sectors; the flush entry would reach the last sector, so logging stops
// for good, later I/O passes through unlogged, and the super is never
// written (no FUA, no mark was logged).
func TestLogWritesFullLogDevice(t *testing.T) {
	data, logd := stacktest.NewMemDevice("data", 1<<20), stacktest.NewMemDevice("log", 8*512)
	l := newTestLogWrites(t, data, logd)
	var logged bytes.Buffer
	l.logger.SetOutput(&logged)
	defer l.logger.SetOutput(os.Stderr)
	lwWrite(t, l, lwCtx, 0, 0x5a, 5*512)
	lwFlush(t, l)
	l.mustStatus(t, "1 7 logging_disabled")
	if !strings.Contains(logged.String(), "Ran out of space on the logdev") {
		t.Errorf("log output %q", logged.String())
	}
	lwWrite(t, l, stack.WithFUA(lwCtx), 4096, 0x77, 512)
	lwMark(t, l, "late")
	lwFlush(t, l)
	l.mustStatus(t, "1 7 logging_disabled")
	if !bytes.Equal(data.Bytes()[4096:4608], bytes.Repeat([]byte{0x77}, 512)) {
		t.Error("a write after logging stopped did not reach the data device")
	}
	l.Close()
	want := lwImage(512, 8*512, -1, []lwEntry{{sector: 0, nr: 5, data: bytes.Repeat([]byte{0x5a}, 5*512)}})
	lwCompare(t, "full log", logd.Bytes(), want)
	if _, err := Open(bytes.NewReader(logd.Bytes()), 8*512, 0); !errors.Is(err, ErrMagic) {
		t.Errorf("reading a log whose super was never written: %v, want ErrMagic", err)
	}
}

// TestLogWritesMemoryLimit: past the cap on data held for the log, a write
// fails at map time with EIO (not counted) and logging stops, as when the
// kernel cannot allocate its copy; later writes pass through.
func TestLogWritesMemoryLimit(t *testing.T) {
	old := logWritesMemLimit
	logWritesMemLimit = 3 * 4608
	defer func() { logWritesMemLimit = old }()
	d, l := lwDevice(t, stacktest.NewMemDevice("data", 1<<20), stacktest.NewMemDevice("log", 1<<20))
	l.logger.SetOutput(&bytes.Buffer{})
	defer l.logger.SetOutput(os.Stderr)
	for i := range 3 {
		lwWrite(t, l, lwCtx, int64(i)*4096, 1, 4096)
	}
	before := d.Disk().Snapshot().IOs[stats.GroupWrite]
	if _, err := d.WriteAt(lwCtx, make([]byte, 4096), 3*4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write past the memory cap: %v, want EIO", err)
	}
	if got := d.Disk().Snapshot().IOs[stats.GroupWrite]; got != before {
		t.Errorf("a write killed at map time was accounted: %d writes counted, want %d", got, before)
	}
	l.mustStatus(t, "0 0 logging_disabled")
	lwWrite(t, l, lwCtx, 3*4096, 2, 4096)
	if l.held.Load() != 3*4608 {
		t.Errorf("held %d bytes, want the three unflushed writes (%d)", l.held.Load(), 3*4608)
	}
	l.Close()
	if l.held.Load() != 0 {
		t.Errorf("held %d bytes after teardown", l.held.Load())
	}
	md, _ := lwDevice(t, stacktest.NewMemDevice("d2", 1<<20), stacktest.NewMemDevice("l2", 1<<20))
	if _, err := md.WriteAt(lwCtx, make([]byte, 100), 512); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("misaligned write: %v, want EINVAL", err)
	}
	if got := md.Disk().Snapshot().IOs[stats.GroupWrite]; got != 0 {
		t.Errorf("a misaligned write killed at map time was accounted: %d writes counted", got)
	}
}

// lwDevice creates a device of one log-writes segment over data and logd
// through a manager, and returns it with its target.
func lwDevice(t *testing.T, data, logd *stacktest.MemDevice) (*stack.Device, *logWrites) {
	t.Helper()
	reg, err := stack.NewRegistry(Type)
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Clock: &clock.Manual{},
		Open: stacktest.Opener{data.Name(): data, logd.Name(): logd}.Open})
	t.Cleanup(func() { m.Close() })
	d, err := m.Create(stack.CreateOptions{Name: "lw-" + data.Name(), Minor: -1,
		Table: fmt.Sprintf("0 %d log-writes %s %s", data.Size()/stack.SectorSize, data.Name(), logd.Name())})
	if err != nil {
		t.Fatal(err)
	}
	var l *logWrites
	d.Live().Targets(func(_, _ int64, _ *stack.TargetType, tg stack.Target) { l = tg.(*logWrites) })
	return d, l
}

// lwReplay applies the log's entries onto dst up to and including the first
// mark named upTo, as replay-log --end-mark does (discards zero).
func lwReplay(t *testing.T, log, dst []byte, upTo string) {
	t.Helper()
	r, err := Open(bytes.NewReader(log), int64(len(log)), 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	s := r.SectorSize()
	for r.More() {
		e, err := r.Next(int(s))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case e.Flags&FlagMark != 0 && e.Mark() == upTo:
			return
		case e.Flags&FlagDiscard != 0:
			clear(dst[int64(e.Sector)*s : int64(e.Sector+e.NrSectors)*s])
		default:
			base := int64(e.Sector) * s
			if err := r.Data(e, func(chunk []byte, off int64) error {
				copy(dst[base+off:], chunk)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Fatalf("mark %q not in the log", upTo)
}

// TestLogWritesRoundTrip records concurrent writers (plain, FUA, discards,
// writes of zeros, flushes one at a time, each writer on its own blocks) with a mark after each
// round, then replays the log up to each mark and compares the result with
// the data device as it was at that mark.
func TestLogWritesRoundTrip(t *testing.T) {
	const size, jobs = 4 << 20, 4
	data, logd := stacktest.NewMemDevice("data", size), stacktest.NewMemDevice("log", 64<<20)
	l := newTestLogWrites(t, data, logd)
	snaps := map[string][]byte{}
	var names []string
	rng := rand.New(rand.NewPCG(7, 11))
	// Flushes do not overlap: a flush logs what it took over when it
	// completes, so with two in flight a writer's later write, covered by
	// the flush that completes first, can be logged ahead of its earlier
	// one held by the other (as in the kernel), and a replay of the two
	// overlapping would differ from the device.
	var flushMu sync.Mutex
	for round := range 10 {
		var wg sync.WaitGroup
		for j := range jobs {
			seed := rng.Uint64()
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, uint64(j)))
				var key [32]byte
				binary.LittleEndian.PutUint64(key[:], seed)
				fill := rand.NewChaCha8(key)
				span := int64(size / jobs)
				base := int64(j) * span
				buf := make([]byte, 64<<10)
				for range 60 {
					off := base + r.Int64N(span/512-128)*512
					n := int64(1+r.IntN(128)) * 512
					switch op := r.IntN(20); {
					case op < 12 || op == 13:
						fill.Read(buf[:n])
						ctx := lwCtx
						if op == 13 {
							// A FUA write is logged ahead of writes still
							// unflushed: one that overwrote them would
							// replay older than the device. Write it as a
							// journal commit, PREFLUSH|FUA.
							flushMu.Lock()
							if err := l.Flush(lwCtx); err != nil {
								t.Error(err)
							}
							if _, err := l.WriteAt(stack.WithFUA(ctx), buf[:n], off); err != nil {
								t.Error(err)
							}
							flushMu.Unlock()
							break
						}
						if _, err := l.WriteAt(ctx, buf[:n], off); err != nil {
							t.Error(err)
						}
					case op < 15:
						if err := l.Discard(lwCtx, off, n); err != nil {
							t.Error(err)
						}
					case op < 17: // write-zeroes, as the device writes it for a table without
						if _, err := l.WriteAt(lwCtx, make([]byte, n), off); err != nil {
							t.Error(err)
						}
					default:
						flushMu.Lock()
						if err := l.Flush(lwCtx); err != nil {
							t.Error(err)
						}
						flushMu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		lwFlush(t, l)
		name := fmt.Sprintf("round%d", round)
		snaps[name] = bytes.Clone(data.Bytes())
		names = append(names, name)
		lwMark(t, l, name)
	}
	l.Close()
	if l.Status(stack.StatusInfo) == "" || strings.Contains(l.Status(stack.StatusInfo), "disabled") {
		t.Fatalf("status %q", l.Status(stack.StatusInfo))
	}
	for _, name := range names {
		got := make([]byte, size)
		lwReplay(t, logd.Bytes(), got, name)
		if !bytes.Equal(got, snaps[name]) {
			i := 0
			for got[i] == snaps[name][i] {
				i++
			}
			t.Errorf("replay up to %s differs from the device at that mark from byte %d (%#x vs %#x)", name, i, got[i], snaps[name][i])
		}
	}
}

// TestLogWritesStacked builds log-writes over another mapped device and a
// log file through a manager: the FUA mark passes through the lower
// device's table, both devices are held, and removing the device completes
// the log.
func TestLogWritesStacked(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"data.img", "log.img"} {
		if err := os.WriteFile(filepath.Join(dir, n), make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := stack.NewRegistry(stack.Linear, stack.Flakey, Type)
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg})
	defer m.Close()
	mk := func(name, table string) *stack.Device {
		d, err := m.Create(stack.CreateOptions{Name: name, Minor: -1, Table: table, Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	mk("lower", "0 2048 flakey ./data.img 0 1000 0")
	mk("logdev", "0 2048 linear ./log.img 0")
	lw := mk("lw", "0 2048 log-writes lower logdev")
	if err := m.Remove("lower", stack.Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("removing the data device under log-writes: %v, want EBUSY", err)
	}
	if err := m.Remove("logdev", stack.Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("removing the log device under log-writes: %v, want EBUSY", err)
	}
	if _, err := lw.WriteAt(stack.WithFUA(context.Background()), bytes.Repeat([]byte{9}, 4096), 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := lw.WriteAt(context.Background(), bytes.Repeat([]byte{8}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := lw.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Message(context.Background(), "lw", 0, []string{"mark", "done"}); err != nil {
		t.Fatal(err)
	}
	var table string
	lw.WithTables(func(live, _ *stack.Table) { table = live.Format(stack.StatusTable) })
	// By number, as the kernel prints the devices of a table.
	if table != "0 2048 log-writes 240:0 240:1\n" {
		t.Errorf("table %q", table)
	}
	if err := m.Remove("lw", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(filepath.Join(dir, "log.img"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lwList(t, log), "fua1 w0 flush mark:done mark:"+EndMark; got != want {
		t.Errorf("log %q, want %q", got, want)
	}
}

// FuzzLogWrites builds a log-writes target from a parameter string and
// drives it with a sequence of operations and messages taken from the
// input: it must never panic, teardown must complete, and the log it leaves
// must read back with as many entries as status reported.
func FuzzLogWrites(f *testing.F) {
	f.Add("data log", []byte{0, 1, 2, 3, 4, 5}, "mark a")
	f.Add("data log junk", []byte{3, 3, 0, 9, 200}, "MARK \\ x")
	f.Add("data", []byte{}, "mark")
	f.Add("log data", []byte{1, 1, 1, 1, 2}, "note x")
	f.Add("data small", []byte{0, 0, 0, 2, 2, 2}, "mark 123456789")
	f.Fuzz(func(t *testing.T, params string, ops []byte, msg string) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		devs := map[string]*stacktest.MemDevice{"data": stacktest.NewMemDevice("data", 64<<10), "log": stacktest.NewMemDevice("log", 256<<10), "small": stacktest.NewMemDevice("small", 4096)}
		c := &stack.Ctor{Len: 128, Context: lwCtx, Open: func(arg string) (stack.BlockDevice, error) {
			if d, ok := devs[arg]; ok {
				return d, nil
			}
			return nil, syscall.ENOENT
		}}
		tg, err := Type.New(c, stack.SplitArgs(params))
		if err != nil {
			return
		}
		l := tg.(*logWrites)
		l.logger.SetOutput(io.Discard)
		for i, op := range ops {
			off := int64(op>>3) * 512 % (64 << 10)
			n := min(int64(1+op%4)*512, 64<<10-off)
			switch op % 8 {
			case 0:
				l.WriteAt(lwCtx, make([]byte, n), off)
			case 1:
				l.WriteAt(stack.WithFUA(lwCtx), make([]byte, n), off)
			case 2:
				l.Flush(lwCtx)
			case 3:
				l.Discard(lwCtx, off, n)
			case 4:
				l.Discard(lwCtx, off+int64(i%2), n)
			case 5:
				l.WriteAt(lwCtx, make([]byte, 100), off+int64(i%3)) // misaligned
			default:
				l.Message(lwCtx, stack.SplitArgs(msg))
			}
		}
		l.Close()
		st := l.Status(stack.StatusInfo)
		var entries uint64
		fmt.Sscanf(st, "%d", &entries)
		logd := l.logdev.(*stacktest.MemDevice).Bytes()
		r, err := Open(bytes.NewReader(logd), int64(len(logd)), 0)
		if err != nil {
			if !errors.Is(err, ErrMagic) && entries > 0 {
				t.Fatalf("status %q, log unreadable: %v", st, err)
			}
			return
		}
		if !strings.Contains(st, "disabled") && r.Super().NrEntries != entries {
			t.Fatalf("status %q, super counts %d", st, r.Super().NrEntries)
		}
		for r.More() {
			e, err := r.Next(int(r.SectorSize()))
			if err != nil {
				t.Fatalf("status %q: entry %d: %v", st, r.Index(), err)
			}
			if err := r.SkipData(e); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// BenchmarkLogWritesWrite is the map-time cost of a 4 KiB write through the
// target (copy, queueing, the worker's log write), with a flush every
// flushEvery writes (0: none until teardown), against the data device alone.
func BenchmarkLogWritesWrite(b *testing.B) {
	for _, tc := range []struct {
		name       string
		flushEvery int
		log        bool
	}{{"device", 0, false}, {"noflush", 0, true}, {"flush32", 32, true}} {
		b.Run(tc.name, func(b *testing.B) {
			data := stacktest.NewMemDevice("data", 64<<20)
			var tg interface {
				WriteAt(context.Context, []byte, int64) (int, error)
				Flush(context.Context) error
			} = data
			var l *logWrites
			if tc.log {
				l = newTestLogWrites(b, data, lwNullDev{1 << 40})
				tg = l
			}
			buf := make([]byte, 4096)
			b.SetBytes(4096)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := tg.WriteAt(lwCtx, buf, int64(i%16384)*4096); err != nil {
					b.Fatal(err)
				}
				if tc.flushEvery > 0 && i%tc.flushEvery == tc.flushEvery-1 {
					tg.Flush(lwCtx)
				}
			}
			if l != nil {
				l.Close()
			}
		})
	}
}

// lwNullDev is a log device that drops what it is given.
type lwNullDev struct{ size int64 }

func (lwNullDev) ReadAt(context.Context, []byte, int64) (int, error)        { return 0, syscall.EIO }
func (lwNullDev) WriteAt(_ context.Context, p []byte, _ int64) (int, error) { return len(p), nil }
func (lwNullDev) Flush(context.Context) error                               { return nil }
func (lwNullDev) Discard(context.Context, int64, int64) error               { return nil }
func (lwNullDev) WriteZeroes(context.Context, int64, int64) error           { return nil }
func (d lwNullDev) Size() int64                                             { return d.size }
func (lwNullDev) Name() string                                              { return "null" }

// TestTablesGolden builds the log-writes lines of testdata/tables.in and
// compares their table and status output, or the error, with
// testdata/tables.golden.
func TestTablesGolden(t *testing.T) {
	reg, err := stack.NewRegistry(Type)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.CheckTables(t, reg, "testdata")
}

// TestLogWritesMemory: the copies held until a flush are accounted in the
// daemon's memory plan as they grow, given back as the worker logs them,
// and all of it at Close.
func TestLogWritesMemory(t *testing.T) {
	data, logd := stacktest.NewMemDevice("data", 64<<20), stacktest.NewMemDevice("log", 80<<20)
	var accounted atomic.Int64
	c := &stack.Ctor{Len: data.Size() / stack.SectorSize, Context: context.Background(), Memory: func(n int64) { accounted.Add(n) },
		Open: func(arg string) (stack.BlockDevice, error) {
			return map[string]stack.BlockDevice{"data": data, "log": logd}[arg], nil
		}}
	tg, err := Type.New(c, []string{"data", "log"})
	if err != nil {
		t.Fatal(err)
	}
	l := tg.(*logWrites)
	buf := make([]byte, 1<<20)
	for i := range 48 {
		if _, err := l.WriteAt(context.Background(), buf, int64(i)<<20); err != nil {
			t.Fatal(err)
		}
		if held, acc := l.held.Load(), accounted.Load(); acc < held {
			t.Fatalf("after %d MiB: %d bytes held, %d accounted", i+1, held, acc)
		}
	}
	if acc := accounted.Load(); acc > l.held.Load()+2*memStep {
		t.Errorf("%d bytes accounted for %d held", acc, l.held.Load())
	}
	lwFlush(t, l)
	l.waitLogged(t)
	if acc := accounted.Load(); acc > 2*memStep {
		t.Errorf("after the flush was logged: %d bytes still accounted", acc)
	}
	l.Close()
	if acc := accounted.Load(); acc != 0 {
		t.Errorf("after Close: %d bytes accounted", acc)
	}
}
