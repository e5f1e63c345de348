package powercut_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/internal/hints"
	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/logwrites"
	"github.com/dmfuse/dmfuse/multipath"
	"github.com/dmfuse/dmfuse/powercut"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

const pcSector = stack.SectorSize

// pcRecDev is a memory device behind a stacktest.FaultDevice whose hook
// records, in order, every request that reaches it: "w OFF LEN", "w+fua OFF
// LEN", "d OFF LEN", "z OFF LEN" (bytes) and "flush".
type pcRecDev struct {
	*stacktest.FaultDevice
	mem *stacktest.MemDevice
	mu  sync.Mutex
	log []string
}

func newPCRecDev(name string, sectors int64) *pcRecDev {
	f, mem := stacktest.NewMemFaultDevice(name, sectors*pcSector)
	d := &pcRecDev{FaultDevice: f, mem: mem}
	f.Inject(stacktest.Rule{Ops: ioop.All &^ ioop.SetOf(ioop.Read), Hook: func(ctx context.Context, op ioop.Op, off, n int64) {
		var s string
		switch op {
		case ioop.Write:
			s = fmt.Sprintf("w %d %d", off, n)
			if stack.FUA(ctx) {
				s = fmt.Sprintf("w+fua %d %d", off, n)
			}
		case ioop.Discard:
			s = fmt.Sprintf("d %d %d", off, n)
		case ioop.Zeroes:
			s = fmt.Sprintf("z %d %d", off, n)
		case ioop.Flush:
			s = "flush"
		}
		d.mu.Lock()
		d.log = append(d.log, s)
		d.mu.Unlock()
	}})
	return d
}

// Bytes returns the contents of the memory device.
func (d *pcRecDev) Bytes() []byte { return d.mem.Bytes() }

// take returns the log and empties it.
func (d *pcRecDev) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.log
	d.log = nil
	return l
}

// pcCtor returns a Ctor for a segment of length sectors whose Open resolves
// the names of devs.
func pcCtor(length int64, devs ...stack.BlockDevice) *stack.Ctor {
	return &stack.Ctor{
		Len: length, Context: context.Background(),
		Open: func(arg string) (stack.BlockDevice, error) {
			for _, d := range devs {
				if d.Name() == arg {
					return d, nil
				}
			}
			return nil, stack.Errorf("Device lookup failed")
		},
	}
}

// pcTarget is a powercut target and what the tests call on it.
type pcTarget struct {
	stack.Target
	t testing.TB
}

// newPC builds a powercut target over dev (whole device) from params after
// "<dev> <offset>".
func newPC(t testing.TB, dev stack.BlockDevice, extra string) pcTarget {
	t.Helper()
	tg, err := powercut.Type.New(pcCtor(dev.Size()/pcSector, dev), stack.SplitArgs(stack.EscapeArg(dev.Name())+" 0 "+extra))
	if err != nil {
		t.Fatalf("powercut %q: %v", extra, err)
	}
	t.Cleanup(func() { tg.Close() })
	return pcTarget{tg, t}
}

func (p pcTarget) msg(words ...string) string {
	p.t.Helper()
	out, err := p.Target.(stack.Messager).Message(context.Background(), words)
	if err != nil {
		p.t.Fatalf("message %q: %v", words, err)
	}
	return out
}

func (p pcTarget) write(b []byte, off int64) {
	p.t.Helper()
	if n, err := p.WriteAt(context.Background(), b, off); err != nil || n != len(b) {
		p.t.Fatalf("write %d bytes at %d: %d, %v", len(b), off, n, err)
	}
}

// settle waits until the destager is idle: what it wrote back is on the
// device.
func (p pcTarget) settle() { powercut.Settle(p.Target) }

func (p pcTarget) fua(b []byte, off int64) {
	p.t.Helper()
	if n, err := p.WriteAt(stack.WithFUA(context.Background()), b, off); err != nil || n != len(b) {
		p.t.Fatalf("FUA write %d bytes at %d: %d, %v", len(b), off, n, err)
	}
}

func (p pcTarget) read(off, n int64) []byte {
	p.t.Helper()
	b := make([]byte, n)
	if k, err := p.ReadAt(context.Background(), b, off); err != nil || k != len(b) {
		p.t.Fatalf("read %d bytes at %d: %d, %v", n, off, k, err)
	}
	return b
}

func (p pcTarget) flush() {
	p.t.Helper()
	if err := p.Target.(stack.Flusher).Flush(context.Background()); err != nil {
		p.t.Fatalf("flush: %v", err)
	}
}

// fill returns n bytes of c.
func fill(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }

// TestPowercutReadsCachedWrites: writes of any size and alignment are cached
// (the device is untouched) and read back at once, over the device's data.
func TestPowercutReadsCachedWrites(t *testing.T) {
	dev := newPCRecDev("mem", 4096)
	for i := range dev.Bytes() {
		dev.Bytes()[i] = byte(i * 7)
	}
	orig := bytes.Clone(dev.Bytes())
	pc := newPC(t, dev, "")
	want := bytes.Clone(orig)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		n := 1 + rng.IntN(40000)
		off := rng.Int64N(int64(len(want) - n))
		b := make([]byte, n)
		for k := range b {
			b[k] = byte(rng.Uint32())
		}
		pc.write(b, off)
		copy(want[off:], b)
		ro, rn := rng.Int64N(int64(len(want))-1), int64(1+rng.IntN(100000))
		rn = min(rn, int64(len(want))-ro)
		if got := pc.read(ro, rn); !bytes.Equal(got, want[ro:ro+rn]) {
			t.Fatalf("after write %d: read [%d,+%d) differs from what was written at byte %d", i, ro, rn, firstDiffPC(got, want[ro:ro+rn]))
		}
	}
	if !bytes.Equal(dev.Bytes(), orig) {
		t.Fatalf("the device changed before any flush: %v", dev.take())
	}
	if got := pc.read(0, int64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("a read of the whole device differs from what was written")
	}
	pc.flush()
	if !bytes.Equal(dev.Bytes(), want) {
		t.Fatalf("after the flush the device differs at byte %d", firstDiffPC(dev.Bytes(), want))
	}
	if got := pc.read(0, int64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("after the flush a read differs from what was written")
	}
}

func firstDiffPC(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestPowercutFlushOrder: a flush writes the cached writes back in the
// order they arrived (so that a later overlapping write wins), then flushes
// the device; a second flush writes nothing.
func TestPowercutFlushOrder(t *testing.T) {
	dev := newPCRecDev("mem", 64)
	pc := newPC(t, dev, "")
	pc.write(fill('a', 8192), 0)
	pc.write(fill('b', 8192), 4096)
	pc.write(fill('c', 4096), 0)
	pc.write(fill('d', 100), 10000)
	if l := dev.take(); len(l) != 0 {
		t.Fatalf("cached writes reached the device: %v", l)
	}
	pc.flush()
	want := []string{"w 0 8192", "w 4096 8192", "w 0 4096", "w 10000 100", "flush"}
	if l := dev.take(); strings.Join(l, ",") != strings.Join(want, ",") {
		t.Fatalf("the flush sent %v, want %v", l, want)
	}
	img := append(append(append(fill('c', 4096), fill('b', 5904)...), fill('d', 100)...), fill('b', 2188)...)
	if !bytes.Equal(dev.Bytes()[:12288], img) {
		t.Errorf("device after the flush differs at byte %d", firstDiffPC(dev.Bytes(), img))
	}
	pc.flush()
	if l := dev.take(); strings.Join(l, ",") != "flush" {
		t.Errorf("a flush of an empty cache sent %v, want only the device flush", l)
	}
	if got, want := pc.Status(stack.StatusInfo), "up cached 0 0 flushes 2 fua 0 destaged 4 around 0 cuts 0 last_cut none seed -"; got != want {
		t.Errorf("status %q, want %q", got, want)
	}
}

// TestPowercutFUA: a FUA write reaches the device, marked, before it
// completes; the older cached writes it overlaps neither show over it nor
// land on it later, whatever becomes of them.
func TestPowercutFUA(t *testing.T) {
	for _, then := range []string{"flush", "power_cut", "power_cut random 1", "power_cut torn 2"} {
		t.Run(then, func(t *testing.T) {
			dev := newPCRecDev("mem", 64)
			pc := newPC(t, dev, "")
			pc.write(fill('x', 4096), 0)
			pc.write(fill('y', 4096), 0) // both older than the FUA write, both overlapping it
			pc.write(fill('z', 512), 8192)
			pc.fua(fill('f', 4096), 2048)
			if l := dev.take(); strings.Join(l, ",") != "w+fua 2048 4096" {
				t.Fatalf("the FUA write sent %v, want only itself, marked", l)
			}
			if !bytes.Equal(dev.Bytes()[2048:6144], fill('f', 4096)) {
				t.Fatal("the FUA write is not on the device when it completes")
			}
			want := append(fill('y', 2048), fill('f', 4096)...)
			if got := pc.read(0, 6144); !bytes.Equal(got, want) {
				t.Fatalf("read after the FUA write differs at byte %d", firstDiffPC(got, want))
			}
			if then == "flush" {
				pc.flush()
			} else {
				pc.msg(strings.Fields(then)...)
			}
			if !bytes.Equal(dev.Bytes()[2048:6144], fill('f', 4096)) {
				t.Errorf("after %s an older cached write landed on the FUA write's data: %v", then, dev.take())
			}
			for _, l := range dev.take() {
				if f := strings.Fields(l); f[0] == "w" && f[1] != "8192" {
					if off, _ := strconv.Atoi(f[1]); off != 0 || f[2] != "2048" {
						t.Errorf("after %s a write-back %q touches the FUA write's range", then, l)
					}
				}
			}
			if then == "flush" && !bytes.Equal(dev.Bytes()[:2048], fill('y', 2048)) {
				t.Error("the flush did not write back the part of the older writes outside the FUA write")
			}
		})
	}
}

// TestPowercutBound: past cache_sectors, the oldest cached writes are
// written back by the destager; a write larger than the cache is written
// through after all of them.
func TestPowercutBound(t *testing.T) {
	dev := newPCRecDev("mem", 256)
	pc := newPC(t, dev, "2 cache_sectors 16")
	pc.write(fill('a', 8*pcSector), 0)
	pc.write(fill('b', 8*pcSector), 8*pcSector)
	if l := dev.take(); len(l) != 0 {
		t.Fatalf("within the bound the device got %v", l)
	}
	pc.write(fill('c', 4*pcSector), 16*pcSector)
	pc.settle()
	if l := dev.take(); strings.Join(l, ",") != "w 0 4096" {
		t.Fatalf("4 sectors over the bound the device got %v, want the oldest write", l)
	}
	pc.write(fill('d', 10*pcSector), 32*pcSector)
	pc.settle()
	if l := dev.take(); strings.Join(l, ",") != "w 4096 4096" {
		t.Fatalf("6 sectors over the bound the device got %v, want the oldest write", l)
	}
	if got, want := pc.Status(stack.StatusInfo), "up cached 2 14 flushes 0 fua 0 destaged 2 around 0 cuts 0 last_cut none seed -"; got != want {
		t.Errorf("status %q, want %q", got, want)
	}
	pc.write(fill('e', 17*pcSector), 64*pcSector)
	if l := dev.take(); strings.Join(l, ",") != "w 8192 2048,w 16384 5120,w 32768 8704" {
		t.Fatalf("a write larger than the cache sent %v, want the cached writes, then itself", l)
	}
	if got := pc.msg("dirty"); got != "no cached writes" {
		t.Errorf("dirty after a write-through: %q", got)
	}
	// A discard larger than the cache is written through too.
	pc.write(fill('f', pcSector), 0)
	if err := pc.Target.(stack.Discarder).Discard(context.Background(), 100*pcSector, 20*pcSector); err != nil {
		t.Fatal(err)
	}
	if l := dev.take(); strings.Join(l, ",") != "w 0 512,d 51200 10240" {
		t.Fatalf("a discard larger than the cache sent %v", l)
	}

	// Past the bound the cache destages in a batch, down to 7/8 of it.
	devB := newPCRecDev("memb", 64)
	pcB := newPC(t, devB, "2 cache_sectors 16")
	for i := range 16 {
		pcB.write(fill(byte(i), pcSector), int64(i)*pcSector)
	}
	if l := devB.take(); len(l) != 0 {
		t.Fatalf("16 sectors in a 16-sector cache sent %v", l)
	}
	pcB.write(fill(16, pcSector), 16*pcSector)
	pcB.settle()
	if l := devB.take(); strings.Join(l, ",") != "w 0 512,w 512 512,w 1024 512" {
		t.Fatalf("the 17th sector sent %v, want the three oldest (down to 14 sectors)", l)
	}

	// cache_sectors 0: a disk without a volatile cache.
	dev0 := newPCRecDev("mem0", 64)
	pc0 := newPC(t, dev0, "2 cache_sectors 0")
	pc0.write(fill('g', 100), 3)
	if l := dev0.take(); strings.Join(l, ",") != "w 3 100" {
		t.Fatalf("cache_sectors 0: the write sent %v", l)
	}
	if out := pc0.msg("power_cut"); out != "power_cut: 0 cached writes lost (0 sectors)" {
		t.Errorf("cut without a cache: %q", out)
	}
}

// pcWorkload fills a fresh cache with n writes of 1 to 16 sectors, each at
// its own 16-sector slot and filled with its own byte, over a device of
// zeros, and returns the target and the device.
func pcWorkload(t *testing.T, n int) (pcTarget, *pcRecDev) {
	dev := newPCRecDev("mem", int64(16*n))
	pc := newPC(t, dev, "")
	for i := range n {
		pc.write(fill(byte(i+1), (1+i%16)*pcSector), int64(i)*16*pcSector)
	}
	dev.take()
	return pc, dev
}

// pcSurvivors checks what a cut of pcWorkload's cache left on dev and
// returns, per write, how many of its sectors survived.
func pcSurvivors(t *testing.T, dev *pcRecDev, n int, torn bool) []int {
	t.Helper()
	out := make([]int, n)
	for i := range n {
		slot := dev.Bytes()[i*16*pcSector : (i+1)*16*pcSector]
		size := 1 + i%16
		k := 0
		for k < size && bytes.Equal(slot[k*pcSector:(k+1)*pcSector], fill(byte(i+1), pcSector)) {
			k++
		}
		if bytes.ContainsFunc(slot[k*pcSector:], func(r rune) bool { return r != 0 }) {
			t.Fatalf("write %d: the device holds neither its data nor zeros after sector %d", i, k)
		}
		if !torn && k != 0 && k != size {
			t.Fatalf("write %d survived with %d of its %d sectors in a cut that does not tear", i, k, size)
		}
		out[i] = k
	}
	return out
}

// TestPowercutCutModes: power_cut loses every cached write; random and torn
// keep a subset drawn from the seed (torn keeping a prefix of each
// survivor's sectors): the same seed gives the same result, another seed
// another, and a cut without a seed reports the one it drew.
func TestPowercutCutModes(t *testing.T) {
	const n = 64
	pc, dev := pcWorkload(t, n)
	if out := pc.msg("power_cut"); !strings.HasPrefix(out, "power_cut: 64 cached writes lost") {
		t.Errorf("plain cut: %q", out)
	}
	if !bytes.Equal(dev.Bytes(), make([]byte, len(dev.Bytes()))) {
		t.Error("a plain cut left cached data on the device")
	}
	if got := pc.Status(stack.StatusInfo); !strings.HasPrefix(got, "down cached 0 0 ") || !strings.HasSuffix(got, "cuts 1 last_cut all seed -") {
		t.Errorf("status after a plain cut: %q", got)
	}

	for _, mode := range []string{"random", "torn"} {
		cut := func(seed string) ([]int, string) {
			pc, dev := pcWorkload(t, n)
			out := pc.msg("power_cut", mode, seed)
			return pcSurvivors(t, dev, n, mode == "torn"), out
		}
		a, outA := cut("42")
		b, _ := cut("42")
		c, _ := cut("43")
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("%s: seed 42 twice gave %v and %v", mode, a, b)
		}
		if fmt.Sprint(a) == fmt.Sprint(c) {
			t.Errorf("%s: seeds 42 and 43 gave the same survivors %v", mode, a)
		}
		survived, partial := 0, 0
		for i, k := range a {
			if k > 0 {
				survived++
			}
			if k > 0 && k < 1+i%16 {
				partial++
			}
		}
		if survived < 16 || survived > 48 {
			t.Errorf("%s: %d of %d writes survived, far from half", mode, survived, n)
		}
		if mode == "torn" && partial == 0 {
			t.Errorf("torn: no survivor was torn: %v", a)
		}
		wantOut := fmt.Sprintf("power_cut %s seed 42: %d of %d cached writes survived", mode, survived, n)
		if mode == "torn" {
			wantOut += fmt.Sprintf(", %d of them torn", partial)
		}
		if outA != wantOut {
			t.Errorf("%s: reply %q, want %q", mode, outA, wantOut)
		}

		pc, dev := pcWorkload(t, n)
		out := pc.msg("power_cut", mode)
		m := regexp.MustCompile(`^power_cut ` + mode + ` seed (\d+): `).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s without a seed: reply %q names no seed", mode, out)
		}
		if got := pc.Status(stack.StatusInfo); !strings.HasSuffix(got, "last_cut "+mode+" seed "+m[1]) {
			t.Errorf("%s: status %q does not show seed %s", mode, got, m[1])
		}
		d, _ := cut(m[1])
		if got := pcSurvivors(t, dev, n, mode == "torn"); fmt.Sprint(got) != fmt.Sprint(d) {
			t.Errorf("%s: the reported seed %s does not replay the cut: %v, then %v", mode, m[1], got, d)
		}
	}
}

// TestPowercutCutOptions: the modes of dmfuse crash at a live cut. sector
// keeps or loses each tear unit on its own (the same seed the same way);
// fill=zero and fill=junk put zeros or junk, not the device's old data,
// where units are lost, a 4 KiB unit also over the sectors of it a short
// write did not cover; clean=1 loses nothing.
func TestPowercutCutOptions(t *testing.T) {
	const n = 64
	cut := func(words ...string) ([]byte, string) {
		pc, dev := pcWorkload(t, n)
		out := pc.msg(append([]string{"power_cut"}, words...)...)
		return bytes.Clone(dev.Bytes()), out
	}
	a, outA := cut("sector", "9")
	b, _ := cut("sector", "9")
	c, _ := cut("sector", "10")
	if !bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Errorf("sector: seed 9 twice equal %v, seeds 9 and 10 differ %v", bytes.Equal(a, b), !bytes.Equal(a, c))
	}
	// Sector by sector, each write's sectors are its data or zeros, in any
	// pattern: some write keeps a later sector and loses an earlier one.
	holey := false
	for i := range n {
		size := 1 + i%16
		slot := a[i*16*pcSector : (i+1)*16*pcSector]
		var lostBefore bool
		for k := range size {
			sec := slot[k*pcSector : (k+1)*pcSector]
			switch {
			case bytes.Equal(sec, fill(byte(i+1), pcSector)):
				holey = holey || lostBefore
			case bytes.Equal(sec, make([]byte, pcSector)):
				lostBefore = true
			default:
				t.Fatalf("sector: write %d sector %d holds neither its data nor zeros", i, k)
			}
		}
	}
	if !holey {
		t.Error("sector: no write kept a sector after losing one")
	}
	if !regexp.MustCompile(`^power_cut sector seed 9: \d+ of 64 cached writes survived, \d+ of them torn$`).MatchString(outA) {
		t.Errorf("sector reply %q", outA)
	}

	// Junk where whole writes are lost: neither the data nor zeros.
	j, outJ := cut("subset", "3", "fill=junk")
	junk := 0
	for i := range n {
		sec := j[i*16*pcSector : i*16*pcSector+pcSector]
		if !bytes.Equal(sec, fill(byte(i+1), pcSector)) {
			if bytes.Equal(sec, make([]byte, pcSector)) {
				t.Fatalf("fill=junk: lost write %d reads as zeros", i)
			}
			junk++
		}
	}
	if junk < 16 || !strings.HasPrefix(outJ, "power_cut subset fill junk clean 0 seed 3: ") {
		t.Errorf("fill=junk: %d writes lost; reply %q", junk, outJ)
	}
	if j2, _ := cut("subset", "3", "fill=junk"); !bytes.Equal(j, j2) {
		t.Error("fill=junk: the same seed drew other junk")
	}

	// A 4 KiB unit lost with fill=zero zeroes all of it: write 0 (one
	// sector at 0) lost damages sectors 1 to 7 of its slot too, which held
	// data of its own here.
	dev := newPCRecDev("mem", 16*pcSector)
	copy(dev.Bytes(), bytes.Repeat([]byte{0xaa}, 16*pcSector))
	pc := newPC(t, dev, "")
	pc.write(fill(1, pcSector), 0)
	dev.take()
	for seed := 0; ; seed++ {
		if seed == 64 {
			t.Fatal("unit=4096: no seed of 64 lost the write")
		}
		out := pc.msg("power_cut", "sector", fmt.Sprint(seed), "unit=4096", "fill=zero")
		if strings.Contains(out, ": 0 of 1 ") {
			if !bytes.Equal(dev.Bytes()[:8*pcSector], make([]byte, 8*pcSector)) || dev.Bytes()[8*pcSector] != 0xaa {
				t.Errorf("unit=4096 fill=zero: the lost unit is not all zeros, or more was zeroed")
			}
			break
		}
		pc.msg("power_on")
		pc.write(fill(1, pcSector), 0)
	}

	// clean=1: nothing is lost.
	pcK, devK := pcWorkload(t, n)
	outK := pcK.msg("power_cut", "sector", "5", "clean=1")
	if got := pcSurvivors(t, devK, n, false); slices.Contains(got, 0) || !strings.Contains(outK, "64 of 64 cached writes survived, 0 of them torn") {
		t.Errorf("clean=1: survivors %v, reply %q", got, outK)
	}
}

// TestPowercutDown: after a cut every I/O fails with EIO until power_on,
// which brings back what survived; the power messages refuse a state they
// are already in.
func TestPowercutDown(t *testing.T) {
	dev := newPCRecDev("mem", 64)
	pc := newPC(t, dev, "")
	pc.write(fill('s', 4096), 0)
	pc.flush()
	pc.write(fill('u', 4096), 4096)
	pc.msg("power_cut")
	ctx := context.Background()
	buf := make([]byte, 512)
	checks := map[string]error{}
	_, checks["read"] = pc.ReadAt(ctx, buf, 0)
	_, checks["write"] = pc.WriteAt(ctx, buf, 0)
	_, checks["FUA write"] = pc.WriteAt(stack.WithFUA(ctx), buf, 0)
	_, checks["empty write"] = pc.WriteAt(ctx, nil, 0)
	checks["flush"] = pc.Target.(stack.Flusher).Flush(ctx)
	checks["discard"] = pc.Target.(stack.Discarder).Discard(ctx, 0, 512)
	checks["write-zeroes"] = pc.Target.(stack.ZeroWriter).WriteZeroes(ctx, 0, 512)
	for op, err := range checks {
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s while down: %v, want EIO", op, err)
		}
	}
	if _, err := pc.Target.(stack.Messager).Message(ctx, []string{"power_cut"}); err == nil {
		t.Error("a second power_cut while down succeeded")
	}
	if l := dev.take(); strings.Join(l, ",") != "w 0 4096,flush" {
		t.Errorf("the device got %v; want only the flushed write and the flush", l)
	}
	pc.msg("POWER_ON")
	if _, err := pc.Target.(stack.Messager).Message(ctx, []string{"power_on"}); err == nil {
		t.Error("power_on while on succeeded")
	}
	if got := pc.read(0, 8192); !bytes.Equal(got, append(fill('s', 4096), make([]byte, 4096)...)) {
		t.Error("after power_on the device does not read back the flushed write and nothing else")
	}
	pc.write(fill('n', 512), 0)
	if got := pc.read(0, 512); !bytes.Equal(got, fill('n', 512)) {
		t.Error("writes after power_on are not cached")
	}
}

// TestPowercutDiscardAndZeroes: discards and write-zeroes are cached like
// writes, in order with them, and read as zeros.
func TestPowercutDiscardAndZeroes(t *testing.T) {
	dev := newPCRecDev("mem", 64)
	copy(dev.Bytes(), fill('o', len(dev.Bytes())))
	pc := newPC(t, dev, "")
	ctx := context.Background()
	pc.write(fill('w', 8192), 0)
	if err := pc.Target.(stack.Discarder).Discard(ctx, 1024, 2048); err != nil {
		t.Fatal(err)
	}
	if err := pc.Target.(stack.ZeroWriter).WriteZeroes(ctx, 6000, 4000); err != nil {
		t.Fatal(err)
	}
	pc.write(fill('v', 512), 1536)
	want := bytes.Join([][]byte{fill('w', 1024), make([]byte, 512), fill('v', 512), make([]byte, 1024),
		fill('w', 2928), make([]byte, 4000), fill('o', 22768)}, nil)
	if got := pc.read(0, 32768); !bytes.Equal(got, want) {
		t.Fatalf("read differs at byte %d", firstDiffPC(got, want))
	}
	if got := pc.msg("dirty"); got != "0+16 write\n2+4 discard\n11+9 zeroes\n3+1 write\n" {
		t.Errorf("dirty: %q", got)
	}
	if l := dev.take(); len(l) != 0 {
		t.Fatalf("the device got %v before any flush", l)
	}
	pc.flush()
	if l := dev.take(); strings.Join(l, ",") != "w 0 8192,d 1024 2048,z 6000 4000,w 1536 512,flush" {
		t.Errorf("the flush sent %v", l)
	}
	if !bytes.Equal(dev.Bytes()[:32768], want) {
		t.Errorf("device after the flush differs at byte %d", firstDiffPC(dev.Bytes(), want))
	}
}

// TestPowercutTable: constructor errors, and the table form, which builds
// the same target again (device names escaped).
func TestPowercutTable(t *testing.T) {
	dev := stacktest.NewMemDevice("/dev/my disk", 1024*pcSector)
	for _, c := range []struct{ args, err string }{
		{"", "Invalid argument count"},
		{`/dev/my\ disk`, "Invalid argument count"},
		{`/dev/my\ disk x`, "Invalid device sector"},
		{`/dev/nope 0`, "Device lookup failed"},
		{`/dev/my\ disk 1`, "too small for target"},
		{`/dev/my\ disk 0 1`, "Invalid number of feature args"},
		{`/dev/my\ disk 0 3 cache_sectors 1 2`, "Invalid number of feature args"},
		{`/dev/my\ disk 0 2 cache_sector 1`, "Unrecognised powercut feature"},
		{`/dev/my\ disk 0 1 cache_sectors`, "requires a parameter"},
		{`/dev/my\ disk 0 2 cache_sectors -1`, "Invalid cache_sectors"},
		{`/dev/my\ disk 0 2 cache_sectors 4294967296`, "Invalid cache_sectors"},
		{`/dev/my\ disk 0 2 cache_sectors 1 x`, "Too many arguments"},
	} {
		_, err := powercut.Type.New(pcCtor(1024, dev), stack.SplitArgs(c.args))
		if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: %v, want %q (EINVAL)", c.args, err, c.err)
		}
	}
	for args, table := range map[string]string{
		`/dev/my\ disk 0`:                       `/dev/my\ disk 0`,
		`/dev/my\ disk 0 0`:                     `/dev/my\ disk 0`,
		`/dev/my\ disk 0 2 CACHE_SECTORS +08`:   `/dev/my\ disk 0 2 cache_sectors 8`,
		`/dev/my\ disk 0 2 cache_sectors 0`:     `/dev/my\ disk 0 2 cache_sectors 0`,
		`/dev/my\ disk 0 2 cache_sectors 65536`: `/dev/my\ disk 0 2 cache_sectors 65536`,
	} {
		tg, err := powercut.Type.New(pcCtor(1024, dev), stack.SplitArgs(args))
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		got := tg.Status(stack.StatusTable)
		if got != table {
			t.Errorf("%q: table %q, want %q", args, got, table)
		}
		again, err := powercut.Type.New(pcCtor(1024, dev), stack.SplitArgs(got))
		if err != nil || again.Status(stack.StatusTable) != got {
			t.Errorf("table %q does not build the same target again: %v", got, err)
		}
	}
}

// TestPowercutBadMessages: bad messages are refused with EINVAL and a
// reason, and change nothing.
func TestPowercutBadMessages(t *testing.T) {
	dev := newPCRecDev("mem", 64)
	pc := newPC(t, dev, "")
	pc.write(fill('a', 4096), 0)
	before, dirty := pc.Status(stack.StatusInfo), pc.msg("dirty")
	for _, words := range [][]string{
		{}, {"power"}, {"power_cut", "half"}, {"power_cut", "random", "x"}, {"power_cut", "random", "-1"},
		{"power_cut", "torn", "18446744073709551616"}, {"power_cut", "random", "1", "2"}, {"power_cut", "all"},
		{"power_on"}, {"power_on", "now"}, {"dirty", "all"},
		{"power_cut", "sector", "1", "unit=1000"}, {"power_cut", "sector", "unit=256"}, {"power_cut", "subset", "unit=4096"},
		{"power_cut", "sector", "fill=ones"}, {"power_cut", "subset", "clean=2"}, {"power_cut", "subset", "clean=x"},
		{"power_cut", "sector", "1", "speed=9"}, {"power_cut", "sector", "1", "fill=zero", "2"},
	} {
		_, err := pc.Target.(stack.Messager).Message(context.Background(), words)
		if err == nil || !errors.Is(err, syscall.EINVAL) || err.Error() == "" {
			t.Errorf("message %q: %v, want an EINVAL with a reason", words, err)
		}
	}
	if after := pc.Status(stack.StatusInfo); after != before {
		t.Errorf("status changed from %q to %q", before, after)
	}
	if pc.msg("dirty") != dirty || len(dev.take()) != 0 {
		t.Error("a refused message changed the cache or reached the device")
	}
}

// TestPowercutConcurrent runs writes, reads, flushes, FUA writes, discards
// and write-zeroes from several goroutines over a small cache (so that
// destaging runs concurrently too), with status and dirty asked meanwhile;
// each goroutine reads its own region back after every operation. At the
// end a flush must leave the device equal to the model.
func TestPowercutConcurrent(t *testing.T) {
	const workers, region = 4, 32 << 10
	dev := newPCRecDev("mem", workers*region/pcSector)
	pc := newPC(t, dev, "2 cache_sectors 256")
	want := make([]byte, workers*region)
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			if err := pcWorker(pc, w, want[w*region:(w+1)*region], int64(w*region)); err != nil {
				errs <- err
			}
		})
	}
	stop := make(chan struct{})
	var obs sync.WaitGroup
	obs.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			pc.Status(stack.StatusInfo)
			if _, err := pc.Target.(stack.Messager).Message(context.Background(), []string{"dirty"}); err != nil {
				errs <- err
				return
			}
			dev.take()
		}
	})
	wg.Wait()
	close(stop)
	obs.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	pc.flush()
	if !bytes.Equal(dev.Bytes(), want) {
		t.Fatalf("after the last flush the device differs from the model at byte %d", firstDiffPC(dev.Bytes(), want))
	}
}

// pcWorker does random I/O on its region [base, base+len(mine)) of pc,
// keeping mine equal to what it wrote, and reads the region back after each
// operation.
func pcWorker(pc pcTarget, w int, mine []byte, base int64) error {
	rng := rand.New(rand.NewPCG(uint64(w), 9))
	ctx := context.Background()
	got := make([]byte, len(mine))
	for i := range 400 {
		n := 1 + rng.IntN(9000)
		off := rng.Int64N(int64(len(mine) - n))
		b := fill(byte(rng.Uint32()|1), n)
		var err error
		switch r := rng.IntN(20); {
		case r == 0:
			err = pc.Target.(stack.Flusher).Flush(ctx)
		case r == 1:
			_, err = pc.WriteAt(stack.WithFUA(ctx), b, base+off)
			copy(mine[off:], b)
		case r == 2:
			err = pc.Target.(stack.Discarder).Discard(ctx, base+off, int64(n))
			clear(mine[off : off+int64(n)])
		case r == 3:
			err = pc.Target.(stack.ZeroWriter).WriteZeroes(ctx, base+off, int64(n))
			clear(mine[off : off+int64(n)])
		default:
			_, err = pc.WriteAt(ctx, b, base+off)
			copy(mine[off:], b)
		}
		if err != nil {
			return fmt.Errorf("worker %d op %d: %v", w, i, err)
		}
		if _, err := pc.ReadAt(ctx, got, base); err != nil {
			return fmt.Errorf("worker %d op %d: read: %v", w, i, err)
		}
		if !bytes.Equal(got, mine) {
			return fmt.Errorf("worker %d op %d: read differs at byte %d of its region", w, i, firstDiffPC(got, mine))
		}
	}
	return nil
}

// TestPowercutConcurrentCut cuts the power while writers and flushers run:
// no sector of the device is older than what the writer's last successful
// flush covered (each sector carries the number of the write that wrote
// it), and after power_on reads agree with the device.
func TestPowercutConcurrentCut(t *testing.T) {
	const workers, region = 4, 32 << 10
	gen := func(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
	for _, mode := range [][]string{{"power_cut"}, {"power_cut", "random", "7"}, {"power_cut", "torn", "8"}} {
		dev := newPCRecDev("mem", workers*region/pcSector)
		pc := newPC(t, dev, "")
		durable := make([][]byte, workers) // each worker's region as of its last successful flush
		var wg sync.WaitGroup
		started := make(chan struct{}, workers)
		for w := range workers {
			durable[w] = make([]byte, region)
			wg.Go(func() {
				ctx := context.Background()
				mine := make([]byte, region)
				b := fill(byte(w+1), 4096)
				for i := 1; ; i++ {
					for s := 0; s < len(b); s += pcSector {
						binary.LittleEndian.PutUint64(b[s:], uint64(i))
					}
					off := int64(i*4096) % region
					if _, err := pc.WriteAt(ctx, b, int64(w*region)+off); err != nil {
						return
					}
					copy(mine[off:], b)
					if i%4 == 0 {
						if pc.Target.(stack.Flusher).Flush(ctx) != nil {
							return
						}
						copy(durable[w], mine)
						if i == 4 {
							started <- struct{}{}
						}
					}
				}
			})
		}
		for range workers {
			<-started
		}
		pc.msg(mode...)
		wg.Wait()
		for w := range workers {
			got := dev.Bytes()[w*region : (w+1)*region]
			for s := 0; s < region; s += pcSector {
				g, d := gen(got[s:]), gen(durable[w][s:])
				if g < d {
					t.Fatalf("%v: worker %d sector %d holds write %d, older than the flushed write %d", mode, w, s/pcSector, g, d)
				}
				if g != 0 && !bytes.Equal(got[s+8:s+pcSector], fill(byte(w+1), pcSector-8)) {
					t.Fatalf("%v: worker %d sector %d holds foreign data", mode, w, s/pcSector)
				}
			}
		}
		pc.msg("power_on")
		if got := pc.read(0, workers*region); !bytes.Equal(got, dev.Bytes()) {
			t.Fatalf("%v: after power_on reads differ from the device", mode)
		}
	}
}

// TestPowercutConcurrentOverlap runs writes, FUA writes, discards, reads
// and flushes from several goroutines over one range of several index
// chunks, each request of up to 300 KiB at any offset, so that requests
// overlap each other (half of them about one chunk boundary) and cross
// chunk (and lock stripe) boundaries, over a
// cache small enough to destage all the time. Whatever order overlapping
// requests took, the cache must have taken it everywhere: after the
// workers stop, what reads return must be what a flush leaves on the
// device.
func TestPowercutConcurrentOverlap(t *testing.T) {
	const workers, size = 8, 5 << 20
	dev := newPCRecDev("mem", size/pcSector)
	pc := newPC(t, dev, "2 cache_sectors 2048")
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			ctx := context.Background()
			got := make([]byte, 300<<10)
			for i := range 1000 {
				n := 1 + rng.IntN(300<<10)
				off := rng.Int64N(size - int64(n))
				if rng.IntN(2) == 0 {
					// Most overlaps: small requests about a chunk boundary.
					n = 1 + rng.IntN(16<<10)
					off = 2<<20 - 16<<10 + rng.Int64N(16<<10)
				}
				var err error
				switch r := rng.IntN(40); {
				case r == 0:
					err = pc.Target.(stack.Flusher).Flush(ctx)
				case r < 3:
					_, err = pc.WriteAt(stack.WithFUA(ctx), fill(byte(w<<6|i&63), n), off)
				case r < 5:
					err = pc.Target.(stack.Discarder).Discard(ctx, off, int64(n))
				case r < 12:
					_, err = pc.ReadAt(ctx, got[:n], off)
				default:
					_, err = pc.WriteAt(ctx, fill(byte(w<<6|i&63), n), off)
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d op %d: %v", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	before := pc.read(0, size)
	pc.flush()
	if !bytes.Equal(dev.Bytes(), before) {
		t.Fatalf("a flush changed what reads return, first at byte %d", firstDiffPC(dev.Bytes(), before))
	}
	if got := pc.read(0, size); !bytes.Equal(got, before) {
		t.Fatalf("after the flush reads differ from before it, first at byte %d", firstDiffPC(got, before))
	}
}

// pcTargetDev presents a target as a BlockDevice, so that a target test can
// stack one target on another without a Manager.
type pcTargetDev struct {
	stack.Target
	name string
	size int64
}

func (d pcTargetDev) Flush(ctx context.Context) error {
	if f, ok := d.Target.(stack.Flusher); ok {
		return f.Flush(ctx)
	}
	return nil
}

func (d pcTargetDev) Discard(ctx context.Context, off, n int64) error {
	return d.Target.(stack.Discarder).Discard(ctx, off, n)
}

func (d pcTargetDev) WriteZeroes(ctx context.Context, off, n int64) error {
	return d.Target.(stack.ZeroWriter).WriteZeroes(ctx, off, n)
}

func (d pcTargetDev) Size() int64  { return d.size }
func (d pcTargetDev) Name() string { return d.name }

// TestPowercutOverDelay stacks powercut over a delay target over a memory
// device: cached writes stay above the delay, FUA writes and flushes go
// through it (the FUA mark too), and a cut leaves the memory device as the
// flushes left it.
func TestPowercutOverDelay(t *testing.T) {
	mem := newPCRecDev("mem", 256)
	dl, err := delay.Type.New(pcCtor(256, mem), stack.SplitArgs("mem 0 1"))
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	pc := newPC(t, pcTargetDev{dl, "slow", mem.Size()}, "")
	pc.write(fill('a', 4096), 0)
	pc.write(fill('b', 4096), 8192)
	if l := mem.take(); len(l) != 0 {
		t.Fatalf("cached writes went through the delay: %v", l)
	}
	pc.fua(fill('f', 1024), 16384)
	if l := mem.take(); strings.Join(l, ",") != "w+fua 16384 1024" {
		t.Fatalf("the FUA write reached the memory device as %v", l)
	}
	pc.flush()
	if l := mem.take(); strings.Join(l, ",") != "w 0 4096,w 8192 4096,flush" {
		t.Fatalf("the flush reached the memory device as %v", l)
	}
	pc.write(fill('c', 4096), 0)
	pc.msg("power_cut")
	if !bytes.Equal(mem.Bytes()[:4096], fill('a', 4096)) || !bytes.Equal(mem.Bytes()[16384:17408], fill('f', 1024)) {
		t.Error("the memory device does not hold what the flush and the FUA write made durable")
	}
	if l := mem.take(); len(l) != 0 {
		t.Errorf("the cut sent %v to the memory device", l)
	}
}

// pcFileDir returns a folder on tmpfs when there is one, else a temporary
// folder.
func pcFileDir(t *testing.T) string {
	if dir, err := os.MkdirTemp("/dev/shm", "dmfuse-powercut-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

// TestPowercutUnderMultipath builds, through a Manager, a multipath device
// over a powercut device over a delay device over a backing file: I/O through
// the multipath device is cached by powercut, a FUA write reaches the file
// at once, a flush reaches it, a cut fails the path, and after power_on and
// reinstate_path the multipath device reads what survived.
func TestPowercutUnderMultipath(t *testing.T) {
	dir := pcFileDir(t)
	img := filepath.Join(dir, "img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := stack.NewRegistry(stack.Linear, multipath.Type, powercut.Type, delay.Type)
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg})
	defer m.Close()
	for _, c := range []struct{ name, table string }{
		{"slow", "0 2048 delay " + img + " 0 0 " + img + " 0 1"},
		{"pc", "0 2048 powercut slow 0"},
		{"mp", "0 2048 multipath 0 0 1 1 round-robin 0 1 1 pc 1"},
	} {
		if _, err := m.Create(stack.CreateOptions{Name: c.name, Minor: -1, Table: c.table}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	mp := m.Lookup("mp")
	ctx := context.Background()
	onFile := func(off, n int64) []byte {
		b, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		return b[off : off+n]
	}
	if _, err := mp.WriteAt(ctx, fill('w', 8192), 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8192)
	if _, err := mp.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, fill('w', 8192)) {
		t.Fatalf("read through mp: %v", err)
	}
	if !bytes.Equal(onFile(0, 8192), make([]byte, 8192)) {
		t.Fatal("a cached write reached the file")
	}
	if _, err := mp.WriteAt(stack.WithFUA(ctx), fill('f', 4096), 65536); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onFile(65536, 4096), fill('f', 4096)) {
		t.Fatal("a FUA write through mp is not on the file when it completes")
	}
	if err := mp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onFile(0, 8192), fill('w', 8192)) {
		t.Fatal("a flush through mp did not reach the file")
	}
	if _, err := mp.WriteAt(ctx, fill('u', 4096), 0); err != nil {
		t.Fatal(err)
	}
	if out, err := m.Message(ctx, "pc", 0, []string{"power_cut"}); err != nil || out != "power_cut: 1 cached writes lost (8 sectors)" {
		t.Fatalf("power_cut: %q, %v", out, err)
	}
	if _, err := mp.ReadAt(ctx, got, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read through mp after the cut: %v, want EIO", err)
	}
	if st := mp.FormatTable(stack.StatusInfo, false); !strings.Contains(st, m.Lookup("pc").DevNo()+" F 1") {
		t.Errorf("the path did not fail: %q", st)
	}
	if st := m.Lookup("pc").FormatTable(stack.StatusInfo, false); st != "0 2048 powercut down cached 0 0 flushes 1 fua 1 destaged 1 around 0 cuts 1 last_cut all seed -\n" {
		t.Errorf("pc status: %q", st)
	}
	if _, err := m.Message(ctx, "pc", 0, []string{"power_on"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Message(ctx, "mp", 0, []string{"reinstate_path", "pc"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mp.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, fill('w', 8192)) {
		t.Fatalf("after power_on mp reads %v, want the flushed data", err)
	}
	if tb := m.Lookup("pc").FormatTable(stack.StatusTable, false); tb != "0 2048 powercut "+m.Lookup("slow").DevNo()+" 0\n" {
		t.Errorf("pc table: %q", tb)
	}
}

// pcRaceBuild reports whether the test binary was built with -race, under
// which sync.Pool drops items on purpose.
func pcRaceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// TestPowercutAllocs: once warm, caching writes, reading them and writing
// them back allocates nothing but what a pool refills.
func TestPowercutAllocs(t *testing.T) {
	if pcRaceBuild() {
		t.Skip("sync.Pool drops items under -race")
	}
	dev := stacktest.NewMemDevice("mem", 2048*pcSector)
	pc := newPC(t, dev, "")
	ctx := context.Background()
	b := fill('a', 4096)
	r := make([]byte, 8192)
	cycle := func() {
		for i := range int64(16) {
			pc.WriteAt(ctx, b, i*12288)
		}
		pc.ReadAt(ctx, r, 4096)
		pc.Target.(stack.Flusher).Flush(ctx)
	}
	cycle()
	if a := testing.AllocsPerRun(200, cycle); a > 0.5 {
		t.Errorf("%.1f allocations per 16 writes, a read and a flush; want none", a)
	}
	// Past the bound: destages.
	small := newPC(t, dev, "2 cache_sectors 64")
	destage := func() {
		for i := range int64(64) {
			small.WriteAt(ctx, b, (i%48)*4096)
		}
	}
	destage()
	if a := testing.AllocsPerRun(100, destage); a > 0.5 {
		t.Errorf("%.1f allocations per 64 writes through a 64-sector cache; want none", a)
	}
}

// FuzzPowercut builds a powercut target from arbitrary parameters and sends
// it arbitrary messages: no panic; every failure is an EINVAL with a reason;
// a refused message changes neither status nor cache; the table form builds
// the same target again.
func FuzzPowercut(f *testing.F) {
	for _, s := range [][2]string{
		{"0", "power_cut"}, {"0 2 cache_sectors 8", "power_cut random 1"}, {"0 0", "power_cut torn"},
		{"0 2 cache_sectors 0", "power_on"}, {"1", "dirty"}, {"0 2 CACHE_SECTORS 1", "power_cut torn 18446744073709551615"},
		{"0 1 cache_sectors", "power_cut random x"}, {"0 2 cache_sectors 8 x", "POWER_CUT RANDOM +5"},
		{"0 4 cache_sectors 1 cache_sectors 2", "power_cut all"}, {"x", "power_on now"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, params, msg string) {
		dev := stacktest.NewMemDevice("mem", 64*pcSector)
		tg, err := powercut.Type.New(pcCtor(32, dev), stack.SplitArgs("mem "+params))
		if err != nil {
			if !errors.Is(err, syscall.EINVAL) || err.Error() == "" {
				t.Fatalf("%q: %v, want EINVAL with a reason", params, err)
			}
			return
		}
		defer tg.Close()
		table := tg.Status(stack.StatusTable)
		again, err := powercut.Type.New(pcCtor(32, dev), stack.SplitArgs(table))
		if err != nil || again.Status(stack.StatusTable) != table {
			t.Fatalf("%q: table %q does not build the same target: %v", params, table, err)
		}
		again.Close()
		ctx := context.Background()
		tg.WriteAt(ctx, fill('a', 3000), 100)
		tg.(stack.Discarder).Discard(ctx, 5000, 700)
		mg := tg.(stack.Messager)
		before, _ := mg.Message(ctx, []string{"dirty"})
		status := tg.Status(stack.StatusInfo)
		if _, err := mg.Message(ctx, stack.SplitArgs(msg)); err != nil {
			if !errors.Is(err, syscall.EINVAL) || err.Error() == "" {
				t.Fatalf("message %q: %v, want EINVAL with a reason", msg, err)
			}
			if after, _ := mg.Message(ctx, []string{"dirty"}); after != before || tg.Status(stack.StatusInfo) != status {
				t.Fatalf("refused message %q changed the target", msg)
			}
		}
	})
}

// pcBenchTarget is a linear or powercut target (name) over the whole of a
// memory device of size bytes, closed when b ends.
func pcBenchTarget(b *testing.B, name string, size int64) stack.Target {
	dev := stacktest.NewMemDevice("mem", size)
	tg, err := map[string]*stack.TargetType{"linear": stack.Linear, "powercut": powercut.Type}[name].New(
		pcCtor(dev.Size()/pcSector, dev), []string{"mem", "0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tg.Close() })
	return tg
}

// BenchmarkPowercutWrite measures a 4 KiB write into the cache, with a
// flush every 32 writes (as fio --fsync=32), from all Ps, over a memory
// device; linear over the same device is the baseline.
func BenchmarkPowercutWrite(b *testing.B) {
	for _, name := range []string{"linear", "powercut"} {
		b.Run(name, func(b *testing.B) {
			tg := pcBenchTarget(b, name, 64<<20)
			b.ReportAllocs()
			b.SetBytes(4096)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				buf := make([]byte, 4096)
				for i := int64(7); pb.Next(); i += 7919 {
					if _, err := tg.WriteAt(ctx, buf, (i%16384)*4096); err != nil {
						b.Error(err)
						return
					}
					if i%32 == 0 {
						tg.(stack.Flusher).Flush(ctx)
					}
				}
			})
		})
	}
}

// TestPowercutDeviceErrors: a write-back that fails keeps the entries it did
// not write in the cache (still read back, written by the next flush); a
// flush reports its own, and a failed write-back of the destager goes to the
// first write that needs room after it, the write that set it to work
// having gone on.
func TestPowercutDeviceErrors(t *testing.T) {
	dev, mem := stacktest.NewMemFaultDevice("mem", 64*pcSector)
	pc := newPC(t, dev, "2 cache_sectors 16")
	ctx := context.Background()
	pc.write(fill('a', 8*pcSector), 0)
	pc.write(fill('b', 8*pcSector), 8*pcSector)
	fail := dev.Fail(ioop.SetOf(ioop.Write), syscall.EIO)
	if err := pc.Target.(stack.Flusher).Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush with a failing device: %v, want EIO", err)
	}
	if _, err := pc.WriteAt(ctx, fill('c', pcSector), 16*pcSector); err != nil {
		t.Fatalf("a write that sets the destager to work on a failing device: %v, want it cached", err)
	}
	pc.settle()
	if _, err := pc.WriteAt(ctx, fill('d', pcSector), 17*pcSector); !errors.Is(err, syscall.EIO) {
		t.Fatalf("the write after the destager failed: %v, want EIO", err)
	}
	if got := pc.msg("dirty"); got != "0+8 write\n8+8 write\n16+1 write\n17+1 write\n" {
		t.Fatalf("dirty after failed write-backs: %q", got)
	}
	if got := pc.read(0, 18*pcSector); !bytes.Equal(got, append(append(fill('a', 4096), fill('b', 4096)...), append(fill('c', 512), fill('d', 512)...)...)) {
		t.Fatal("cached data does not read back after failed write-backs")
	}
	fail.Remove()
	pc.flush()
	if !bytes.Equal(mem.Bytes()[:18*pcSector], pc.read(0, 18*pcSector)) || pc.msg("dirty") != "no cached writes" {
		t.Fatal("the flush after the device recovered did not write the cache back")
	}

	// A failed write-back of the destager that a flush has made good since
	// is not reported.
	fail = dev.Fail(ioop.SetOf(ioop.Write), syscall.EIO)
	pc.write(fill('e', 16*pcSector), 0)
	pc.write(fill('e', pcSector), 16*pcSector)
	pc.settle()
	fail.Remove()
	pc.flush()
	pc.write(fill('f', 16*pcSector), 0)
	if _, err := pc.WriteAt(ctx, fill('g', pcSector), 16*pcSector); err != nil {
		t.Fatalf("a write that needs room after a flush wrote back what the destager could not: %v", err)
	}
}

// TestPowercutReadRetries: a read that goes to the device while write-backs
// change what the cache holds tries again, and after three tries holds
// write-backs off; it returns the newest data either way.
func TestPowercutReadRetries(t *testing.T) {
	dev, _ := stacktest.NewMemFaultDevice("mem", 64*pcSector)
	pc := newPC(t, dev, "")
	reads := 0
	dev.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Read), Hook: func(context.Context, ioop.Op, int64, int64) {
		// The first three device reads each see a write-back happen
		// under them; later ones (the read then holds write-backs off)
		// must not flush.
		if reads++; reads <= 3 {
			pc.write(fill(byte('0'+reads), pcSector), int64(reads)*pcSector)
			pc.flush()
			pc.write(fill('n', pcSector), 10*pcSector)
		}
	}})
	pc.write(fill('x', pcSector), 0)
	got := pc.read(0, 12*pcSector)
	want := bytes.Join([][]byte{fill('x', pcSector), fill('1', pcSector), fill('2', pcSector), fill('3', pcSector),
		make([]byte, 6*pcSector), fill('n', pcSector), make([]byte, pcSector)}, nil)
	if reads != 4 || !bytes.Equal(got, want) {
		t.Fatalf("%d device reads; read differs at byte %d", reads, firstDiffPC(got, want))
	}
}

// TestPowercutOverFlakey stacks powercut over flakey targets that are down
// for good: cached writes never reach flakey and read back from the cache;
// over error_writes the flush that writes them back fails with EIO and
// keeps them cached; over drop_writes the flush succeeds and flakey drops
// them, so the memory device never sees them.
func TestPowercutOverFlakey(t *testing.T) {
	for _, c := range []struct {
		feature string
		flush   error
		dirty   string
	}{
		{"error_writes", syscall.EIO, "0+8 write\n"},
		{"drop_writes", nil, "no cached writes"},
	} {
		t.Run(c.feature, func(t *testing.T) {
			mem := newPCRecDev("mem", 256)
			fl, err := stack.Flakey.New(pcCtor(256, mem), stack.SplitArgs("mem 0 0 1 1 "+c.feature))
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			pc := newPC(t, pcTargetDev{fl, "fl", mem.Size()}, "")
			pc.write(fill('a', 4096), 0)
			got := make([]byte, 4096)
			if _, err := pc.ReadAt(context.Background(), got, 0); err != nil || !bytes.Equal(got, fill('a', 4096)) {
				t.Fatalf("read of a cached write over a down flakey: %v", err)
			}
			if err := pc.Target.(stack.Flusher).Flush(context.Background()); !errors.Is(err, c.flush) || (c.flush == nil) != (err == nil) {
				t.Fatalf("flush: %v, want %v", err, c.flush)
			}
			if d := pc.msg("dirty"); d != c.dirty {
				t.Errorf("dirty after the flush: %q, want %q", d, c.dirty)
			}
			if l := mem.take(); len(l) != 0 {
				t.Errorf("the memory device under a down flakey got %v", l)
			}
			if !bytes.Equal(mem.Bytes()[:4096], make([]byte, 4096)) {
				t.Error("the memory device under a down flakey changed")
			}
		})
	}
}

// pcLogEntries lists the entries of the log-writes log in file path:
// "<sector>+<sectors> <flags>".
func pcLogEntries(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	r, err := logwrites.Open(f, st.Size(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for r.More() {
		e, err := r.Next(0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d+%d %s", e.Sector, e.NrSectors, logwrites.FlagNames(e.Flags)))
		if err := r.SkipData(e); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// pcLogStack creates, through a Manager, devices over the files img and
// log of 1 MiB each (in a new folder) from tables in which IMG and LOG
// stand for their paths, in order.
func pcLogStack(t *testing.T, tables ...[2]string) (m *stack.Manager, img, logImg string) {
	dir := pcFileDir(t)
	img, logImg = filepath.Join(dir, "img"), filepath.Join(dir, "log")
	for _, f := range []string{img, logImg} {
		if err := os.WriteFile(f, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := stack.NewRegistry(logwrites.Type, powercut.Type)
	if err != nil {
		t.Fatal(err)
	}
	m = stack.NewManager(stack.ManagerOptions{Registry: reg})
	t.Cleanup(func() { m.Close() })
	for _, c := range tables {
		table := strings.NewReplacer("IMG", img, "LOG", logImg).Replace(c[1])
		if _, err := m.Create(stack.CreateOptions{Name: c[0], Minor: -1, Table: table}); err != nil {
			t.Fatalf("%s: %v", c[0], err)
		}
	}
	return m, img, logImg
}

// pcLogWorkload writes through dev: a cached write at 0, a FUA write at
// 64 KiB, a flush, a write at 8 KiB that no flush covers; then cuts pc's
// power and removes the devices, top first.
func pcLogWorkload(t *testing.T, m *stack.Manager, dev string, remove ...string) {
	t.Helper()
	d := m.Lookup(dev)
	ctx := context.Background()
	if _, err := d.WriteAt(ctx, fill('a', 4096), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WriteAt(stack.WithFUA(ctx), fill('f', 4096), 65536); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WriteAt(ctx, fill('u', 4096), 8192); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Message(ctx, "pc", 0, []string{"power_cut"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range remove {
		if err := m.Remove(name, stack.Flags{}); err != nil {
			t.Fatal(err)
		}
	}
}

// pcCheckDurable checks that img holds the flushed and the FUA write, and
// not the write no flush covered.
func pcCheckDurable(t *testing.T, img string) {
	t.Helper()
	data, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[:4096], fill('a', 4096)) || !bytes.Equal(data[65536:69632], fill('f', 4096)) ||
		!bytes.Equal(data[8192:12288], make([]byte, 4096)) {
		t.Error("the data file does not hold what the flush and the FUA write made durable (and only that)")
	}
}

// TestPowercutOverLogWrites: powercut over log-writes over a file. The log
// records what reached the disk: the FUA write at once, the cached write
// only when the flush wrote it back (before the flush), and nothing of the
// write the cut lost.
func TestPowercutOverLogWrites(t *testing.T) {
	m, img, logImg := pcLogStack(t, [2]string{"lw", "0 2048 log-writes IMG LOG"}, [2]string{"pc", "0 2048 powercut lw 0"})
	pcLogWorkload(t, m, "pc", "pc", "lw")
	want := []string{"128+8 FUA", "0+8 NONE", "0+0 FLUSH", "0+0 MARK"}
	if got := pcLogEntries(t, logImg); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("log entries %q, want %q", got, want)
	}
	pcCheckDurable(t, img)
}

// TestPowercutUnderLogWrites: log-writes over powercut over a file. The log
// records what the file system sent, the write the cut lost too; the file
// holds only what powercut made durable.
func TestPowercutUnderLogWrites(t *testing.T) {
	dir := pcFileDir(t)
	logImg := filepath.Join(dir, "log2")
	if err := os.WriteFile(logImg, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	m, img, _ := pcLogStack(t, [2]string{"pc", "0 2048 powercut IMG 0"}, [2]string{"lw", "0 2048 log-writes pc " + logImg})
	pcLogWorkload(t, m, "lw")
	if st := m.Lookup("pc").FormatTable(stack.StatusInfo, false); st != "0 2048 powercut down cached 0 0 flushes 1 fua 1 destaged 1 around 0 cuts 1 last_cut all seed -\n" {
		t.Errorf("pc status: %q", st)
	}
	if _, err := m.Message(context.Background(), "pc", 0, []string{"power_on"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lw", "pc"} {
		if err := m.Remove(name, stack.Flags{}); err != nil {
			t.Fatal(err)
		}
	}
	// log-writes logs a FUA write at once and plain writes at the next
	// flush (or its removal).
	want := []string{"128+8 FUA", "0+8 NONE", "0+0 FLUSH", "16+8 NONE", "0+0 MARK"}
	if got := pcLogEntries(t, logImg); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("log entries %q, want %q", got, want)
	}
	pcCheckDurable(t, img)
}

// TestPowercutDestageOrder: a destage writes entries that overlap in the
// order they arrived, so that the device ends with the newest data.
func TestPowercutDestageOrder(t *testing.T) {
	for round := range 50 {
		dev := newPCRecDev("mem", 128)
		pc := newPC(t, dev, "2 cache_sectors 64")
		// Writes 0-7 go to sector 0, the others each to its own sector;
		// the 65th crosses the bound and destages down to 56 sectors:
		// writes 0-8.
		for i := range 65 {
			off := int64(i) * pcSector
			if i < 8 {
				off = 0
			}
			pc.write(fill(byte(i+1), pcSector), off)
		}
		pc.settle()
		n := 0
		for _, l := range dev.take() {
			if strings.HasPrefix(l, "w 0 ") {
				n++
			}
		}
		if n != 8 {
			t.Fatalf("round %d: %d writes to sector 0 reached the device, want 8", round, n)
		}
		if got := dev.Bytes()[0]; got != 8 {
			t.Fatalf("round %d: sector 0 holds write %d after the destage, want 8 (the newest): overlapping writes were reordered", round, got)
		}
	}
}

// TestPowercutMemory: a powercut target accounts twice its cache bound in
// the daemon's memory plan (Ctor.Memory) while it lives and gives it back
// in Close; a Manager passes its Memory hook to the tables it builds; a
// target without the hook accounts nothing.
func TestPowercutMemory(t *testing.T) {
	var held int64
	ctor := func(sectors int64, dev stack.BlockDevice) *stack.Ctor {
		c := pcCtor(sectors, dev)
		c.Memory = func(n int64) { held += n }
		return c
	}
	dev := stacktest.NewMemDevice("mem", 64*pcSector)
	a, err := powercut.Type.New(ctor(64, dev), []string{"mem", "0"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := powercut.Type.New(ctor(64, dev), stack.SplitArgs("mem 0 2 cache_sectors 2048"))
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(2 * (32<<20 + 1<<20)); held != want {
		t.Errorf("a 32 MiB and a 1 MiB cache account %d bytes, want %d (twice the bounds)", held, want)
	}
	if _, err := powercut.Type.New(ctor(64, dev), stack.SplitArgs("mem 0 2 cache_sectors x")); err == nil {
		t.Fatal("a bad table built")
	}
	a.Close()
	b.Close()
	if held != 0 {
		t.Errorf("after Close (and a constructor that failed) %d bytes are still accounted", held)
	}
	c, err := powercut.Type.New(pcCtor(64, dev), []string{"mem", "0"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	dir := pcFileDir(t)
	img := filepath.Join(dir, "img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := stack.NewRegistry(powercut.Type)
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Memory: func(n int64) { held += n }})
	defer m.Close()
	if _, err := m.Create(stack.CreateOptions{Name: "pc", Minor: -1, Table: "0 2048 powercut " + img + " 0 2 cache_sectors 1024"}); err != nil {
		t.Fatal(err)
	}
	if held != 1<<20 {
		t.Errorf("a device over a 512 KiB cache accounts %d bytes through its Manager, want %d", held, 1<<20)
	}
	if err := m.Remove("pc", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("after the device was removed %d bytes are still accounted", held)
	}
}

// BenchmarkPowercutFull measures a 4 KiB write at a random offset of a
// 256 MiB memory device, from all Ps, without flushes: past the first 8192
// writes the default 32 MiB cache is full and every write destages its
// share of the oldest entries. linear over the same device is the baseline.
func BenchmarkPowercutFull(b *testing.B) {
	for _, name := range []string{"linear", "powercut"} {
		b.Run(name, func(b *testing.B) {
			tg := pcBenchTarget(b, name, 256<<20)
			ctx := context.Background()
			buf := make([]byte, 4096)
			for i := range int64(16384) { // fill the cache
				tg.WriteAt(ctx, buf, (i*7919%65536)*4096)
			}
			b.ReportAllocs()
			b.SetBytes(4096)
			b.ResetTimer()
			var seed atomic.Uint64
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 4096)
				r := seed.Add(0x9e3779b97f4a7c15)
				for pb.Next() {
					r ^= r << 13
					r ^= r >> 7
					r ^= r << 17
					if _, err := tg.WriteAt(ctx, buf, int64(r%65536)*4096); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// pcWaiter counts the calls of hints.Waiting on its requests.
type pcWaiter struct{ n atomic.Int32 }

func (w *pcWaiter) Waiting() { w.n.Add(1) }

// TestPowercutWaiting: the requests that write back a lot (a flush of more
// than 1024 entries, the write that destages 4 MiB), and those that wait
// for such a write-back, tell their transport that they wait; cached
// writes, and a flush of a few entries, do not.
func TestPowercutWaiting(t *testing.T) {
	dev, _ := stacktest.NewMemFaultDevice("mem", 64<<20)
	pc := newPC(t, dev, "")
	var w pcWaiter
	ctx := hints.WithWaiter(context.Background(), &w)
	flush := pc.Target.(stack.Flusher).Flush
	writes := func(ctx context.Context, n int) {
		t.Helper()
		b := fill(1, 4096)
		for i := range n {
			if _, err := pc.WriteAt(ctx, b, int64(i)*4096); err != nil {
				t.Fatal(err)
			}
		}
	}
	calls := func(what string, want int32) {
		t.Helper()
		if n := w.n.Swap(0); n != want {
			t.Fatalf("%s: %d calls of Waiting, want %d", what, n, want)
		}
	}
	writes(ctx, 4)
	if err := flush(ctx); err != nil {
		t.Fatal(err)
	}
	calls("4 cached writes and a flush of them", 0)
	writes(ctx, 1100)
	calls("1100 cached writes", 0)
	if err := flush(ctx); err != nil {
		t.Fatal(err)
	}
	calls("a flush of 1100 entries", 1)

	// A FUA write that finds a long write-back under way.
	writes(context.Background(), 1100)
	gate := dev.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Write), Hold: true, Times: 1})
	errs := make(chan error, 2)
	go func() { errs <- flush(context.Background()) }()
	held := <-gate.Held()
	go func() {
		_, err := pc.WriteAt(stack.WithFUA(ctx), fill(2, 4096), 0)
		errs <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); w.n.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			held.Release()
			t.Fatal("a FUA write behind a flush of 1100 entries did not call Waiting")
		}
	}
	held.Release()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	calls("a FUA write behind a flush of 1100 entries", 1)

	writes(ctx, 65536*pcSector/4096+1)
	pc.settle()
	calls("writes into the whole cache and one more (the destager writes back, beside them)", 0)
}

// TestPowercutWriteAround: while a destage is under way and the cache holds
// more than 9/8 of its bound, a write that overlaps no cached entry goes
// straight to the device (status counts it under around, not among the
// cached entries), and one that overlaps a cached entry waits for room in the
// cache; at the end a flush leaves every write on the device.
func TestPowercutWriteAround(t *testing.T) {
	dev, mem := stacktest.NewMemFaultDevice("mem", 4<<20)
	pc := newPC(t, dev, "2 cache_sectors 256")
	want := make([]byte, 4<<20)
	write := func(b []byte, off int64) {
		t.Helper()
		pc.write(b, off)
		copy(want[off:], b)
	}
	for i := range 32 {
		write(fill(byte(i+1), 4096), int64(i)*4096)
	}
	gate := dev.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Write), Hold: true, Times: 1})
	var wg sync.WaitGroup
	b := fill(0xd0, 4096)
	copy(want[128<<10:], b)
	wg.Go(func() { pc.WriteAt(context.Background(), b, 128<<10) }) // crosses the bound: destages
	held := <-gate.Held()
	for i := range 3 {
		write(fill(byte(0x40+i), 4096), 1<<20+int64(i)*4096)
	}
	small := fill(0xe0, 512)
	copy(want[2<<20:], small)
	wg.Go(func() { pc.WriteAt(context.Background(), small, 2<<20) }) // past 9/8: waits for room
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(pc.Status(stack.StatusInfo), "cached 37 289 "); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			held.Release()
			t.Fatalf("the cache did not reach 289 sectors: %s", pc.Status(stack.StatusInfo))
		}
	}
	around := fill(0xa0, 4096)
	write(around, 3<<20)
	if got := mem.Bytes()[3<<20 : 3<<20+4096]; !bytes.Equal(got, around) {
		held.Release()
		t.Fatal("a write that overlaps no cached entry, past 9/8 of the bound, did not reach the device at once")
	}
	if st := pc.Status(stack.StatusInfo); !strings.Contains(st, "cached 37 289 ") || !strings.Contains(st, " around 1 ") {
		held.Release()
		t.Fatalf("status %q after a write around the cache: want it not cached, and counted", st)
	}
	over := fill(0xb0, 4096)
	copy(want[4096:], over)
	var w pcWaiter
	wg.Go(func() { pc.WriteAt(hints.WithWaiter(context.Background(), &w), over, 4096) }) // overlaps a cached entry: waits
	for deadline := time.Now().Add(10 * time.Second); w.n.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			held.Release()
			t.Fatal("a write waiting for room did not tell its transport (hints.Waiting)")
		}
	}
	held.Release()
	wg.Wait()
	pc.flush()
	if !bytes.Equal(mem.Bytes(), want) {
		t.Fatalf("after the flush the device differs from the writes at byte %d", firstDiffPC(mem.Bytes(), want))
	}
	if st := pc.Status(stack.StatusInfo); !strings.Contains(st, " around 1 ") {
		t.Fatalf("status %q: want exactly the one write around the cache", st)
	}
}
