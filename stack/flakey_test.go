package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

// flakeyRaceBuild reports whether the test binary was built with -race, under
// which sync.Pool drops items on purpose.
func flakeyRaceBuild() bool {
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

// newFaultCtor returns a Ctor for a segment of length sectors whose Open
// resolves the names of devs.
func newFaultCtor(clock Clock, length int64, devs ...*MemDevice) *Ctor {
	return &Ctor{
		Len: length, Clock: clock, Context: context.Background(),
		Open: func(arg string) (BlockDevice, error) {
			for _, d := range devs {
				if d.Name() == arg {
					return d, nil
				}
			}
			return nil, Errorf("Device lookup failed")
		},
	}
}

// newTestFlakey builds a flakey target over dev from a parameter string.
func newTestFlakey(t testing.TB, clock Clock, dev *MemDevice, params string) *flakey {
	t.Helper()
	tg, err := Flakey.New(newFaultCtor(clock, 2048, dev), SplitArgs(params))
	if err != nil {
		t.Fatalf("flakey %q: %v", params, err)
	}
	return tg.(*flakey)
}

// faultPattern fills a device with a byte pattern that differs from every
// corruption value the tests use at the positions they check.
func faultPattern(d *MemDevice) {
	for i := range d.Bytes() {
		d.Bytes()[i] = byte(i*7 + 3)
	}
}

// faultAcctPiece returns an accounting piece of op, as the table hands targets.
func faultAcctPiece(op ioop.Op) *piece {
	return newPiece(context.Background(), stats.NewDisk(&clock.Manual{}), op)
}

// faultAcctStarted reports whether accounting of p has started.
func faultAcctStarted(p *piece) bool {
	return p.started.Load()
}

func TestFlakeyTableVectors(t *testing.T) {
	// The table lines drivers/md/dm-flakey.c: flakey_status prints (kernel 6.16
	// and later), with the device printed by name.
	dev := NewMemDevice("8:16", 4096*SectorSize)
	tests := []struct{ in, table string }{
		{"8:16 0 4 2", "8:16 0 4 2 2 error_reads error_writes"},
		{"8:16 0 4 2 0", "8:16 0 4 2 2 error_reads error_writes"},
		{"8:16 0 4 2 1 drop_writes", "8:16 0 4 2 1 drop_writes"},
		{"8:16 0 4 2 1 ERROR_WRITES", "8:16 0 4 2 1 error_writes"},
		{"8:16 0 4 2 2 error_writes error_reads", "8:16 0 4 2 2 error_reads error_writes"},
		{"8:16 0 4 2 5 corrupt_bio_byte 32 r 1 0", "8:16 0 4 2 5 corrupt_bio_byte 32 r 1 0"},
		{"8:16 0 4 2 3 drop_writes random_read_corrupt 500000000", "8:16 0 4 2 3 drop_writes random_read_corrupt 500000000"},
		// Canonical order and count, case folding, defaults.
		{"8:16 16 0 7 3 random_write_corrupt 9 Error_Reads", "8:16 16 0 7 3 error_reads random_write_corrupt 9"},
		{"8:16 0 4 2 5 CORRUPT_BIO_BYTE 1 W 255 0", "8:16 0 4 2 5 corrupt_bio_byte 1 w 255 0"},
		{"8:16 0 4 2 2 random_read_corrupt 0", "8:16 0 4 2 2 error_reads error_writes"},
		{"8:16 0 4 2 4 random_read_corrupt 0 random_read_corrupt 7", "8:16 0 4 2 2 random_read_corrupt 7"},
		{"8:16 0 4 2 0 ignored words", "8:16 0 4 2 2 error_reads error_writes"},
		{"8:16 0 4294967295 0", "8:16 0 4294967295 0 2 error_reads error_writes"},
		// The random_seed extension: printed after the others, counted as 2.
		{"8:16 0 4 2 2 random_seed 42", "8:16 0 4 2 4 error_reads error_writes random_seed 42"},
		{"8:16 0 4 2 4 random_seed 18446744073709551615 random_read_corrupt 1000000000",
			"8:16 0 4 2 4 random_read_corrupt 1000000000 random_seed 18446744073709551615"},
		{"8:16 0 4 2 11 random_seed 1 corrupt_bio_byte 3 w 4 0 random_write_corrupt 5 random_read_corrupt 6",
			"8:16 0 4 2 11 corrupt_bio_byte 3 w 4 0 random_read_corrupt 6 random_write_corrupt 5 random_seed 1"},
	}
	for _, tc := range tests {
		f := newTestFlakey(t, &clock.Manual{}, dev, tc.in)
		if got := f.Status(StatusTable); got != tc.table {
			t.Errorf("flakey %q: table %q, want %q", tc.in, got, tc.table)
		}
		if got := f.Status(StatusInfo); got != "" {
			t.Errorf("flakey %q: status %q, want empty", tc.in, got)
		}
		// The table form is accepted back and is a fixed point.
		g := newTestFlakey(t, &clock.Manual{}, dev, f.Status(StatusTable))
		if got := g.Status(StatusTable); got != tc.table {
			t.Errorf("flakey %q: table of the table %q, want %q", tc.in, got, tc.table)
		}
		if f.Dev != BlockDevice(dev) {
			t.Errorf("flakey %q: remaps to %v", tc.in, f.Dev)
		}
	}
}

func TestFlakeyRejected(t *testing.T) {
	// Every refusal of drivers/md/dm-flakey.c: flakey_ctr and parse_features,
	// in the kernel's words.
	dev := NewMemDevice("8:16", 2048*SectorSize)
	tests := []struct{ in, reason string }{
		{"8:16 0 0 0", "Total (up + down) interval is zero"},
		{"8:16 0 4 2 2 drop_writes error_writes", "Feature error_writes conflicts with feature drop_writes"},
		{"8:16 0 4 2 2 error_writes drop_writes", "Feature drop_writes conflicts with feature error_writes"},
		{"8:16 0 4 2 6 drop_writes corrupt_bio_byte 1 w 0 0", "drop_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set"},
		{"8:16 0 4 2 3 drop_writes random_write_corrupt 1", "drop_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set"},
		{"8:16 0 4 2 3 error_writes random_write_corrupt 1", "error_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set"},
		{"8:16 0 4 2 6 corrupt_bio_byte 1 W 0 0 error_writes", "error_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set"},
		{"8:16 0 4 2 3 error_reads random_read_corrupt 5", "error_reads is incompatible with random_read_corrupt or corrupt_bio_byte with the READ flag set"},
		{"8:16 0 4 2 6 error_reads corrupt_bio_byte 1 r 0 0", "error_reads is incompatible with random_read_corrupt or corrupt_bio_byte with the READ flag set"},
		{"8:16 0 4 2 1 foo", "Unrecognised flakey feature requested"},
		{"8:16 0 4 2 12 a b c d e f g h i j k l", "Invalid number of feature args"},
		{"8:16 0 4 2 2 drop_writes", "Invalid number of feature args"},
		{"8:16 0 4 2 x", "Invalid number of feature args"},
		{"8:16 0 4 2 -1", "Invalid number of feature args"},
		{"8:16 0 4", "Invalid argument count"},
		{"", "Invalid argument count"},
		{"8:16 10x 4 2", "Invalid device sector"},
		{"8:16 -1 4 2", "Invalid device sector"},
		{"8:16 0 4x 2", "Invalid up interval"},
		{"8:16 0 4 -2", "Invalid down interval"},
		{"8:16 0 4294967295 1", "Interval overflow"},
		{"8:16 0 2147483648 2147483648", "Interval overflow"},
		{"8:16 0 4 2 2 error_reads ERROR_READS", "Feature error_reads duplicated"},
		{"8:16 0 4 2 2 drop_writes drop_writes", "Feature drop_writes duplicated"},
		{"8:16 0 4 2 2 error_writes error_writes", "Feature error_writes duplicated"},
		{"8:16 0 4 2 10 corrupt_bio_byte 1 r 0 0 corrupt_bio_byte 1 r 0 0", "Feature corrupt_bio_byte duplicated"},
		{"8:16 0 4 2 4 corrupt_bio_byte 1 r 0", "Feature corrupt_bio_byte requires 4 parameters"},
		{"8:16 0 4 2 5 corrupt_bio_byte 0 r 0 0", "Invalid corrupt bio byte"},
		{"8:16 0 4 2 5 corrupt_bio_byte 4294967296 r 0 0", "Invalid corrupt bio byte"},
		{"8:16 0 4 2 5 corrupt_bio_byte 1 x 0 0", "Invalid corrupt bio direction (r or w)"},
		{"8:16 0 4 2 5 corrupt_bio_byte 1 rw 0 0", "Invalid corrupt bio direction (r or w)"},
		{"8:16 0 4 2 5 corrupt_bio_byte 1 r 256 0", "Invalid corrupt value to write into bio byte (0-255)"},
		{"8:16 0 4 2 5 corrupt_bio_byte 1 r 1 x", "Invalid corrupt bio flags mask"},
		{"8:16 0 4 2 5 corrupt_bio_byte 1 r 1 16", "Invalid corrupt bio flags mask 16: dmfuse requests carry no bio flags, so only 0 (every request) can match"},
		{"8:16 0 4 2 4 random_read_corrupt 1 random_read_corrupt 2", "Feature random_read_corrupt duplicated"},
		{"8:16 0 4 2 4 random_write_corrupt 1 RANDOM_WRITE_CORRUPT 2", "Feature random_write_corrupt duplicated"},
		{"8:16 0 4 2 1 random_read_corrupt", "Feature random_read_corrupt requires a parameter"},
		{"8:16 0 4 2 1 random_write_corrupt 5", "Feature random_write_corrupt requires a parameter"},
		{"8:16 0 4 2 2 random_read_corrupt 1000000001", "Invalid random corrupt argument"},
		{"8:16 0 4 2 2 random_write_corrupt x", "Invalid random corrupt argument"},
		{"8:16 0 4 2 4 random_seed 1 random_seed 1", "Feature random_seed duplicated"},
		{"8:16 0 4 2 1 random_seed 1", "Feature random_seed requires a parameter"},
		{"8:16 0 4 2 2 random_seed -1", `Invalid random seed "-1": not an unsigned 64-bit decimal`},
		{"8:16 0 4 2 2 random_seed 18446744073709551616", `Invalid random seed "18446744073709551616": not an unsigned 64-bit decimal`},
		{"8:99 0 4 2", "Device lookup failed"},
	}
	for _, tc := range tests {
		_, err := Flakey.New(newFaultCtor(&clock.Manual{}, 2048, dev), SplitArgs(tc.in))
		var ae *ArgError
		if !errors.As(err, &ae) {
			t.Errorf("flakey %q: err %v, want *ArgError %q", tc.in, err, tc.reason)
			continue
		}
		if ae.Reason != tc.reason {
			t.Errorf("flakey %q: reason %q, want %q", tc.in, ae.Reason, tc.reason)
		}
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("flakey %q: %v is not EINVAL", tc.in, err)
		}
	}
}

func TestFlakeyLookupErrorKeepsCause(t *testing.T) {
	c := newFaultCtor(&clock.Manual{}, 2048)
	c.Open = func(arg string) (BlockDevice, error) { return nil, fmt.Errorf("open %s: %w", arg, syscall.ENOENT) }
	_, err := Flakey.New(c, SplitArgs("/nope 0 1 1"))
	if err == nil || err.Error() != "Device lookup failed: open /nope: no such file or directory" {
		t.Fatalf("err %v", err)
	}
}

// flakeyTryIO tries a 512-byte read and write at segment byte 0 and reports
// whether each succeeded.
func flakeyTryIO(t *testing.T, f *flakey) (readOK, writeOK bool) {
	t.Helper()
	buf := make([]byte, SectorSize)
	_, rerr := f.ReadAt(context.Background(), buf, 0)
	_, werr := f.WriteAt(context.Background(), buf, 0)
	for _, err := range []error{rerr, werr} {
		if err != nil && !errors.Is(err, syscall.EIO) {
			t.Fatalf("error %v, want EIO", err)
		}
	}
	return rerr == nil, werr == nil
}

func TestFlakeyTimeline(t *testing.T) {
	// Up 4, down 2, no features: down while (now - start) % (up + down) >= up
	// (drivers/md/dm-flakey.c: flakey_map); the cycle starts at construction,
	// here 100 s into the clock.
	clock := &clock.Manual{}
	clock.Set(int64(100 * time.Second))
	f := newTestFlakey(t, clock, NewMemDevice("8:16", 2048*SectorSize), "8:16 0 4 2")
	steps := []struct {
		at time.Duration
		up bool
	}{
		{0, true}, {time.Second, true}, {3999 * time.Millisecond, true},
		{4 * time.Second, false}, {4500 * time.Millisecond, false}, {5999 * time.Millisecond, false},
		{6 * time.Second, true}, {6100 * time.Millisecond, true}, {9999 * time.Millisecond, true},
		{10 * time.Second, false}, {11999 * time.Millisecond, false}, {12 * time.Second, true},
		{600*time.Second + 4*time.Second, false}, // 604 = 100*6 + 4
	}
	for _, s := range steps {
		clock.Set(int64(100*time.Second + s.at))
		r, w := flakeyTryIO(t, f)
		if r != s.up || w != s.up {
			t.Errorf("t=%v: read ok %v, write ok %v; want %v", s.at, r, w, s.up)
		}
	}

	// up 0: always down; down 0: always up.
	always := newTestFlakey(t, clock, NewMemDevice("8:16", 2048*SectorSize), "8:16 0 0 3")
	never := newTestFlakey(t, clock, NewMemDevice("8:16", 2048*SectorSize), "8:16 0 3 0")
	for range 8 {
		if r, w := flakeyTryIO(t, always); r || w {
			t.Errorf("up 0 at %v: read ok %v, write ok %v", clock.Nanotime(), r, w)
		}
		if r, w := flakeyTryIO(t, never); !r || !w {
			t.Errorf("down 0 at %v: read ok %v, write ok %v", clock.Nanotime(), r, w)
		}
		clock.Advance(700 * time.Millisecond)
	}
}

func TestFlakeyUpPassesAtOffset(t *testing.T) {
	dev := NewMemDevice("8:16", 4096*SectorSize)
	faultPattern(dev)
	f := newTestFlakey(t, &clock.Manual{}, dev, "8:16 8 1 1 1 error_writes")
	got := make([]byte, 100)
	if n, err := f.ReadAt(context.Background(), got, 10); n != 100 || err != nil {
		t.Fatalf("read: %d, %v", n, err)
	}
	if !bytes.Equal(got, dev.Bytes()[8*SectorSize+10:8*SectorSize+110]) {
		t.Fatal("read did not map to offset + 8 sectors")
	}
	data := bytes.Repeat([]byte{0xaa}, 50)
	if n, err := f.WriteAt(context.Background(), data, 512); n != 50 || err != nil {
		t.Fatalf("write: %d, %v", n, err)
	}
	if !bytes.Equal(dev.Bytes()[9*SectorSize:9*SectorSize+50], data) {
		t.Fatal("write did not map to offset + 8 sectors")
	}
	ctx := context.Background()
	if err := f.Discard(ctx, 1024, 10); err != nil || dev.Bytes()[10*SectorSize] != 0 {
		t.Fatalf("discard while up: %v", err)
	}
	if err := f.Flush(ctx); err != nil || dev.Flushes() != 1 {
		t.Fatalf("flush while up: %v, %d flushes", err, dev.Flushes())
	}
}

// flakeyDown builds a flakey target that is always down.
func flakeyDown(t *testing.T, dev *MemDevice, features string) *flakey {
	return newTestFlakey(t, &clock.Manual{}, dev, "8:16 0 0 1 "+features)
}

func TestFlakeyDropWrites(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	faultPattern(dev)
	before := bytes.Clone(dev.Bytes())
	f := flakeyDown(t, dev, "1 drop_writes")
	data := bytes.Repeat([]byte{0x55}, 4096)
	if n, err := f.WriteAt(ctx, data, 0); n != len(data) || err != nil {
		t.Fatalf("dropped write: %d, %v; want %d, nil", n, err, len(data))
	}
	if err := f.Discard(ctx, 0, 4096); err != nil {
		t.Fatalf("dropped discard: %v", err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatalf("dropped flush: %v", err)
	}
	if !bytes.Equal(dev.Bytes(), before) {
		t.Fatal("drop_writes changed the device")
	}
	if dev.Flushes() != 0 {
		t.Fatal("a dropped flush reached the device")
	}
	// Reads pass, uncorrupted.
	got := make([]byte, 4096)
	if n, err := f.ReadAt(ctx, got, 0); n != 4096 || err != nil || !bytes.Equal(got, before[:4096]) {
		t.Fatalf("read while down with drop_writes: %d, %v", n, err)
	}
}

func TestFlakeyErrorWrites(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	faultPattern(dev)
	before := bytes.Clone(dev.Bytes())
	f := flakeyDown(t, dev, "1 error_writes")
	if n, err := f.WriteAt(ctx, make([]byte, 512), 0); n != 0 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("write: %d, %v; want 0, EIO", n, err)
	}
	for name, err := range map[string]error{
		"flush":   f.Flush(ctx),
		"discard": f.Discard(ctx, 0, 512),
	} {
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s: %v, want EIO", name, err)
		}
	}
	if !bytes.Equal(dev.Bytes(), before) || dev.Flushes() != 0 {
		t.Fatal("error_writes changed the device")
	}
	got := make([]byte, 512)
	if _, err := f.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, before[:512]) {
		t.Fatalf("read with error_writes only: %v", err)
	}
}

func TestFlakeyDefaultFailsAll(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f := flakeyDown(t, dev, "")
	if _, err := f.ReadAt(ctx, make([]byte, 512), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("read: %v", err)
	}
	if _, err := f.WriteAt(ctx, make([]byte, 512), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("write: %v", err)
	}
	if err := f.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("flush: %v", err)
	}
}

func TestFlakeyCorruptBioByteRead(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	faultPattern(dev)
	before := bytes.Clone(dev.Bytes())
	clock := &clock.Manual{}
	f := newTestFlakey(t, clock, dev, "8:16 0 1 1 5 corrupt_bio_byte 32 r 1 0")
	got := make([]byte, 512)

	// Up: nothing happens.
	if _, err := f.ReadAt(ctx, got, 512); err != nil || !bytes.Equal(got, before[512:1024]) {
		t.Fatalf("read while up: %v", err)
	}
	clock.Set(int64(time.Second))
	if _, err := f.ReadAt(ctx, got, 512); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(before[512:1024])
	want[31] = 1
	if !bytes.Equal(got, want) {
		t.Fatalf("read while down: byte 31 = %d, want 1; other bytes equal: %v", got[31], bytes.Equal(got[32:], want[32:]))
	}
	// A read shorter than N is not corrupted.
	short := make([]byte, 31)
	if _, err := f.ReadAt(ctx, short, 0); err != nil || !bytes.Equal(short, before[:31]) {
		t.Fatalf("short read: %v", err)
	}
	// Writes are untouched; the device itself is never corrupted by reads.
	data := bytes.Repeat([]byte{9}, 64)
	if _, err := f.WriteAt(ctx, data, 0); err != nil || !bytes.Equal(dev.Bytes()[:64], data) {
		t.Fatalf("write while down with read corruption: %v", err)
	}
	if !bytes.Equal(dev.Bytes()[512:], before[512:]) {
		t.Fatal("read corruption changed the device")
	}
}

func TestFlakeyCorruptBioByteWrite(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f := flakeyDown(t, dev, "5 corrupt_bio_byte 1 w 7 0")
	data := bytes.Repeat([]byte{0xee}, 1024)
	orig := bytes.Clone(data)
	if n, err := f.WriteAt(ctx, data, 2048); n != len(data) || err != nil {
		t.Fatalf("write: %d, %v", n, err)
	}
	if !bytes.Equal(data, orig) {
		t.Fatal("the caller's buffer was changed")
	}
	want := bytes.Clone(orig)
	want[0] = 7
	if !bytes.Equal(dev.Bytes()[2048:3072], want) {
		t.Fatalf("device byte 0 = %d, want 7 and the rest unchanged", dev.Bytes()[2048])
	}
	// Reads while down pass uncorrupted (direction w).
	got := make([]byte, 1024)
	if _, err := f.ReadAt(ctx, got, 2048); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read: %v", err)
	}
}

// flakeyRandomRun writes then reads n blocks through a target with random
// corruption and returns what reached the device and what the reads returned.
func flakeyRandomRun(t *testing.T, features string, n int) (written, read []byte, src []byte) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", int64(max(n, 2048))*SectorSize)
	f := flakeyDown(t, dev, features)
	src = make([]byte, n*SectorSize)
	for i := range src {
		src[i] = byte(i * 13)
	}
	srcCopy := bytes.Clone(src)
	for i := range n {
		if _, err := f.WriteAt(ctx, src[i*SectorSize:(i+1)*SectorSize], int64(i*SectorSize)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(src, srcCopy) {
		t.Fatal("random write corruption changed the caller's buffer")
	}
	written = bytes.Clone(dev.Bytes()[:n*SectorSize])
	read = make([]byte, n*SectorSize)
	for i := range n {
		if _, err := f.ReadAt(ctx, read[i*SectorSize:(i+1)*SectorSize], int64(i*SectorSize)); err != nil {
			t.Fatal(err)
		}
	}
	return written, read, src
}

// flakeyDiffSectors counts per-sector differing bytes between a and b.
func flakeyDiffSectors(a, b []byte) []int {
	out := make([]int, len(a)/SectorSize)
	for i := range a {
		if a[i] != b[i] {
			out[i/SectorSize]++
		}
	}
	return out
}

func TestFlakeyRandomCorruptReproducible(t *testing.T) {
	const n = 400
	w1, r1, src := flakeyRandomRun(t, "4 random_write_corrupt 500000000 random_seed 7", n)
	w2, r2, _ := flakeyRandomRun(t, "4 random_write_corrupt 500000000 random_seed 7", n)
	if !bytes.Equal(w1, w2) || !bytes.Equal(r1, r2) {
		t.Fatal("the same random_seed gave different corruption")
	}
	changed := 0
	for i, d := range flakeyDiffSectors(src, w1) {
		if d > 1 {
			t.Fatalf("sector %d: %d bytes corrupted, want at most 1", i, d)
		}
		changed += d
	}
	// p = 0.5: with this seed some but not all writes are corrupted (a random
	// value may also equal the original byte).
	if changed == 0 || changed >= n {
		t.Fatalf("%d of %d writes corrupted with p = 0.5", changed, n)
	}
	if !bytes.Equal(r1, w1) {
		t.Fatal("reads were corrupted with random_write_corrupt only")
	}
	w3, _, _ := flakeyRandomRun(t, "4 random_write_corrupt 500000000 random_seed 8", n)
	if bytes.Equal(w1, w3) {
		t.Fatal("different seeds gave the same corruption")
	}

	// Reads: every read gets one random byte (p = 1); the device is intact.
	w4, r4, _ := flakeyRandomRun(t, "4 random_read_corrupt 1000000000 random_seed 3", n)
	w5, r5, _ := flakeyRandomRun(t, "4 RANDOM_SEED 3 random_read_corrupt 1000000000", n)
	if !bytes.Equal(w4, src) || !bytes.Equal(r4, r5) || !bytes.Equal(w5, src) {
		t.Fatal("random read corruption not reproducible or changed the device")
	}
	changed = 0
	for i, d := range flakeyDiffSectors(src, r4) {
		if d > 1 {
			t.Fatalf("read %d: %d bytes corrupted", i, d)
		}
		changed += d
	}
	if changed < n*9/10 {
		t.Fatalf("%d of %d reads corrupted with p = 1", changed, n)
	}
}

func TestFlakeyAccounting(t *testing.T) {
	// A read killed at map time (DM_MAPIO_KILL) is not accounted
	// (drivers/md/dm.c: __dm_io_complete); everything the target passes down or
	// completes itself is.
	dev := NewMemDevice("8:16", 2048*SectorSize)
	buf := make([]byte, 512)
	check := func(name string, op ioop.Op, f func(ctx context.Context) error, wantStarted bool) {
		t.Helper()
		p := faultAcctPiece(op)
		f(p)
		if got := faultAcctStarted(p); got != wantStarted {
			t.Errorf("%s: accounting started %v, want %v", name, got, wantStarted)
		}
	}
	fail := flakeyDown(t, dev, "")
	check("killed read", ioop.Read, func(c context.Context) error { _, err := fail.ReadAt(c, buf, 0); return err }, false)
	check("error_writes write", ioop.Write, func(c context.Context) error { _, err := fail.WriteAt(c, buf, 0); return err }, true)
	check("error_writes flush", ioop.Flush, fail.Flush, true)
	drop := flakeyDown(t, dev, "1 drop_writes")
	check("passed read", ioop.Read, func(c context.Context) error { _, err := drop.ReadAt(c, buf, 0); return err }, true)
	check("dropped write", ioop.Write, func(c context.Context) error { _, err := drop.WriteAt(c, buf, 0); return err }, true)
	check("dropped discard", ioop.Discard, func(c context.Context) error { return drop.Discard(c, 0, 512) }, true)
	up := newTestFlakey(t, &clock.Manual{}, dev, "8:16 0 1 0")
	check("read while up", ioop.Read, func(c context.Context) error { _, err := up.ReadAt(c, buf, 0); return err }, true)
	check("write while up", ioop.Write, func(c context.Context) error { _, err := up.WriteAt(c, buf, 0); return err }, true)
}

func TestFlakeyConcurrentCorruption(t *testing.T) {
	// Many writers and readers at once; run with -race.
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f := flakeyDown(t, dev, "6 random_read_corrupt 300000000 random_write_corrupt 300000000 random_seed 1")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := range 200 {
				off := int64((g*200+i)%60) * SectorSize
				if i%2 == 0 {
					if _, err := f.WriteAt(context.Background(), buf, off); err != nil {
						t.Error(err)
						return
					}
				} else if _, err := f.ReadAt(context.Background(), buf, off); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestFlakeyWriteCorruptionAllocs(t *testing.T) {
	if flakeyRaceBuild() {
		t.Skip("allocation counts are not meaningful under -race")
	}
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f := flakeyDown(t, dev, "5 corrupt_bio_byte 1 w 7 0")
	buf := make([]byte, 4096)
	ctx := context.Background()
	f.WriteAt(ctx, buf, 0)
	if a := testing.AllocsPerRun(100, func() { f.WriteAt(ctx, buf, 0) }); a > 0 {
		t.Fatalf("%v allocations per corrupted write, want 0 (pooled copy)", a)
	}
}

func BenchmarkFlakeyCorruptWrite(b *testing.B) {
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f := newTestFlakey(b, &clock.Manual{}, dev, "8:16 0 0 1 5 corrupt_bio_byte 1 w 7 0")
	buf := make([]byte, 4096)
	ctx := context.Background()
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		f.WriteAt(ctx, buf, 0)
	}
}

func FuzzFlakeyArgs(f *testing.F) {
	for _, s := range []string{
		"8:16 0 4 2", "8:16 0 4 2 0", "8:16 0 4 2 1 drop_writes", "8:16 0 4 2 2 error_writes error_reads",
		"8:16 0 4 2 5 corrupt_bio_byte 32 r 1 0", "8:16 0 4 2 3 drop_writes random_read_corrupt 500000000",
		"8:16 0 4 2 2 random_seed 9", "8:16 0 0 0", "8:16 0 4 2 12", "8:16 0 4 2 4 random_read_corrupt 0 random_read_corrupt 1",
		"8:16 0 4 2 5 corrupt_bio_byte 1 W 255 0",
	} {
		f.Add(s)
	}
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f.Fuzz(func(t *testing.T, params string) {
		args := SplitArgs(params)
		tg, err := Flakey.New(newFaultCtor(&clock.Manual{}, 2048, dev), args)
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) || ae.Reason == "" || !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("%q: error %v is not an EINVAL *ArgError with a reason", params, err)
			}
			return
		}
		table := tg.Status(StatusTable)
		tg2, err := Flakey.New(newFaultCtor(&clock.Manual{}, 2048, dev), SplitArgs(table))
		if err != nil {
			t.Fatalf("%q: table form %q rejected: %v", params, table, err)
		}
		if got := tg2.Status(StatusTable); got != table {
			t.Fatalf("%q: table %q, then %q", params, table, got)
		}
		if strings.HasSuffix(table, " ") {
			t.Fatalf("%q: table %q ends with a space", params, table)
		}
		// I/O never panics, whatever the features.
		buf := make([]byte, 700)
		tg.ReadAt(context.Background(), buf, 100)
		tg.WriteAt(context.Background(), buf, 100)
	})
}

// TestFlakeyRangeCheck: flakey's area on its device is checked like every
// other target's, with the offset in sectors (drivers/md/dm-table.c:
// device_area_is_invalid, called through flakey_iterate_devices with
// fc->start and ti->len). A table mapping past the end is refused.
func TestFlakeyRangeCheck(t *testing.T) {
	dev := NewMemDevice("8:16", 16384*SectorSize)
	for _, tc := range []struct {
		length     int64
		in, reason string
	}{
		{2048, "8:16 15000 4 2", "8:16 too small for target: start=15000, len=2048, dev_size=16384"},
		{2048, "8:16 16384 4 2", "8:16 too small for target: start=16384, len=2048, dev_size=16384"},
		{16385, "8:16 0 4 2", "8:16 too small for target: start=0, len=16385, dev_size=16384"},
	} {
		_, err := Flakey.New(newFaultCtor(&clock.Manual{}, tc.length, dev), SplitArgs(tc.in))
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Reason != tc.reason || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("flakey %q (len %d): %v, want EINVAL %q", tc.in, tc.length, err, tc.reason)
		}
	}
	if _, err := Flakey.New(newFaultCtor(&clock.Manual{}, 2048, dev), SplitArgs("8:16 14336 4 2")); err != nil {
		t.Errorf("flakey ending at the device's last sector: %v", err)
	}
}

// TestFlakeyRangeCheckFile: a flakey table past the end of a backing file is
// refused when it is loaded (drivers/md/dm-table.c: device_area_is_invalid),
// so that no write can grow the file.
func TestFlakeyRangeCheckFile(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "f.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, _ := NewRegistry(Flakey)
	m := NewManager(ManagerOptions{Registry: reg})
	defer m.Close()
	_, err := m.Create(CreateOptions{Name: "f", Minor: -1, Table: "0 1024 flakey ./f.img 1536 4 2", Dir: dir})
	if want := "f: line 1: flakey: " + img + " too small for target: start=1536, len=1024, dev_size=2048"; err == nil || err.Error() != want {
		t.Fatalf("create: %v, want %q", err, want)
	}
	if st, err := os.Stat(img); err != nil || st.Size() != 1<<20 {
		t.Fatalf("backing file: %v, %v", st.Size(), err)
	}
}
