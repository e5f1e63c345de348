package stack

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stats"
)

// testDevice makes a live device with table text over devs.
func testDevice(t testing.TB, text string, devs map[string]*MemDevice, clock Clock) *Device {
	t.Helper()
	bdevs := make(map[string]BlockDevice, len(devs))
	for k, m := range devs {
		bdevs[k] = m
	}
	return liveDevice(t, text, bdevs, clock)
}

// liveDevice builds a device named "test" whose live table is text, over the
// devices in devs (a name missing from devs fails the lookup); a nil clock is
// the system clock.
func liveDevice(t testing.TB, text string, devs map[string]BlockDevice, clk Clock) *Device {
	t.Helper()
	if clk == nil {
		clk = clock.System
	}
	d := newDevice("test", "", DefaultMajor, 0, 1, false, clk)
	d.gate.blocked.Store(true)
	d.mu.suspended = true
	lines, err := ParseTable(text)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := Build(lines, BuildOptions{Registry: testRegistry(t), Clock: clk, Context: context.Background(),
		Open: func(arg string) (BlockDevice, error) {
			if m, ok := devs[arg]; ok {
				return m, nil
			}
			return nil, Errorf("Device lookup failed")
		}})
	if err != nil {
		t.Fatal(err)
	}
	d.Load(tb)
	if err := d.Resume(); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestStripeMapping checks drivers/md/dm-stripe.c: stripe_map_sector: with 2
// stripes of 8 sectors, dm sector 27 lands on stripe 1 at sector 11 and dm
// sector 20 on stripe 0 at sector 12.
func TestStripeMapping(t *testing.T) {
	s := &striped{stripes: make([]stripe, 2), chunk: 8 * SectorSize, chunkS: 8}
	for _, c := range []struct {
		sector, stripe, dev int64
	}{{27, 1, 11}, {20, 0, 12}, {0, 0, 0}, {8, 1, 0}, {16, 0, 8}} {
		i, o := s.mapOff(c.sector * SectorSize)
		if int64(i) != c.stripe || o != c.dev*SectorSize {
			t.Errorf("sector %d -> stripe %d sector %d, want stripe %d sector %d", c.sector, i, o/SectorSize, c.stripe, c.dev)
		}
	}
}

// TestStripeBijection checks, for many stripe counts and chunk sizes
// (powers of two or not), that the mapping is one-to-one and onto the
// stripes' areas.
func TestStripeBijection(t *testing.T) {
	for n := 1; n <= 5; n++ {
		for chunk := int64(1); chunk <= 9; chunk++ {
			rows := int64(3)
			length := int64(n) * chunk * rows
			s := &striped{stripes: make([]stripe, n), chunk: chunk * SectorSize, chunkS: chunk}
			seen := make(map[[2]int64]bool)
			for sec := int64(0); sec < length; sec++ {
				i, o := s.mapOff(sec * SectorSize)
				if o%SectorSize != 0 || o/SectorSize >= chunk*rows {
					t.Fatalf("n=%d chunk=%d: sector %d maps outside the stripe: %d", n, chunk, sec, o/SectorSize)
				}
				k := [2]int64{int64(i), o / SectorSize}
				if seen[k] {
					t.Fatalf("n=%d chunk=%d: sector %d maps to a taken place %v", n, chunk, sec, k)
				}
				seen[k] = true
			}
			if int64(len(seen)) != length {
				t.Fatalf("n=%d chunk=%d: %d places for %d sectors", n, chunk, len(seen), length)
			}
		}
	}
}

// TestStripedRanges checks that a discard's per-stripe ranges cover exactly
// the sectors a sector-by-sector mapping gives.
func TestStripedRanges(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 2000; iter++ {
		n := 1 + r.IntN(4)
		chunk := int64(1 + r.IntN(7))
		length := int64(n) * chunk * int64(1+r.IntN(5))
		s := &striped{stripes: make([]stripe, n), chunk: chunk * SectorSize, chunkS: chunk}
		off := r.Int64N(length)
		cnt := 1 + r.Int64N(length-off)
		want := make(map[[2]int64]bool)
		for sec := off; sec < off+cnt; sec++ {
			i, o := s.mapOff(sec * SectorSize)
			want[[2]int64{int64(i), o / SectorSize}] = true
		}
		got := make(map[[2]int64]bool)
		s.eachStripe(off*SectorSize, cnt*SectorSize, func(st *stripe, o, l int64) error {
			i := int64(0)
			for j := range s.stripes {
				if &s.stripes[j] == st {
					i = int64(j)
				}
			}
			for x := o / SectorSize; x < (o+l)/SectorSize; x++ {
				got[[2]int64{i, x}] = true
			}
			return nil
		})
		if len(got) != len(want) {
			t.Fatalf("n=%d chunk=%d off=%d cnt=%d: %d sectors, want %d", n, chunk, off, cnt, len(got), len(want))
		}
		for k := range want {
			if !got[k] {
				t.Fatalf("n=%d chunk=%d off=%d cnt=%d: missing %v", n, chunk, off, cnt, k)
			}
		}
	}
}

// TestDeviceModel writes and reads random unaligned ranges through linear,
// striped (with a chunk that is not a power of two) and zero segments, and
// compares with a byte-slice model of what each underlying device should hold.
func TestDeviceModel(t *testing.T) {
	devs := testDevs()
	text := "0 1000 linear 8:16 100\n1000 3000 striped 3 5 8:32 0 8:48 7 8:16 3000\n4000 96 zero\n4096 904 linear 8:16 2000"
	d := testDevice(t, text, devs, nil)
	model := make([]byte, d.Size())
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 3000; iter++ {
		off := r.Int64N(d.Size())
		n := 1 + r.Int64N(min(64<<10, d.Size()-off))
		if r.IntN(2) == 0 {
			buf := make([]byte, n)
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			k, err := d.WriteAt(ctx, buf, off)
			if err != nil || int64(k) != n {
				t.Fatalf("write %d@%d: %d, %v", n, off, k, err)
			}
			copy(model[off:], buf)
			// the zero segment swallows writes
			zs, ze := int64(4000*SectorSize), int64(4096*SectorSize)
			for i := max(off, zs); i < min(off+n, ze); i++ {
				model[i] = 0
			}
		} else {
			buf := make([]byte, n)
			k, err := d.ReadAt(ctx, buf, off)
			if err != nil || int64(k) != n {
				t.Fatalf("read %d@%d: %d, %v", n, off, k, err)
			}
			if !bytes.Equal(buf, model[off:off+n]) {
				t.Fatalf("read %d@%d differs from the model", n, off)
			}
		}
	}
	// The first linear segment lives at sector 100 of 8:16.
	if !bytes.Equal(devs["8:16"].Bytes()[100*SectorSize:1100*SectorSize], model[:1000*SectorSize]) {
		t.Fatal("8:16 does not hold the first segment at sector 100")
	}
}

func TestDeviceEdges(t *testing.T) {
	d := testDevice(t, "0 8 linear 8:16 0", testDevs(), nil)
	ctx := context.Background()
	buf := make([]byte, 8192)
	if n, err := d.ReadAt(ctx, buf, 4000); n != 96 || err != nil {
		t.Errorf("read crossing the end: %d, %v; want 96, nil", n, err)
	}
	if n, err := d.ReadAt(ctx, buf, 4096); n != 0 || err != nil {
		t.Errorf("read at the end: %d, %v; want 0, nil", n, err)
	}
	if n, err := d.WriteAt(ctx, buf, 4000); n != 96 || err != nil {
		t.Errorf("write crossing the end: %d, %v; want 96, nil", n, err)
	}
	if _, err := d.WriteAt(ctx, buf, 4096); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("write at the end: %v, want ENOSPC", err)
	}
	e := testDevice(t, "0 8 error", testDevs(), nil)
	if _, err := e.ReadAt(ctx, buf[:512], 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("error target read: %v, want EIO", err)
	}
	if err := e.Flush(ctx); err != nil {
		t.Errorf("error target flush: %v, want success", err)
	}
}

func TestFlushReachesEveryStripe(t *testing.T) {
	devs := testDevs()
	d := testDevice(t, "0 32 striped 2 8 8:16 0 8:32 0\n32 32 linear 8:48 0\n64 8 zero", devs, nil)
	if err := d.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"8:16", "8:32", "8:48"} {
		if devs[n].Flushes() != 1 {
			t.Errorf("%s got %d flushes, want 1", n, devs[n].Flushes())
		}
	}
	s := d.Disk().Snapshot()
	if s.IOs[stats.GroupWrite] != 1 || s.Sectors[stats.GroupWrite] != 0 {
		t.Errorf("flush counted as %d writes of %d sectors, want 1 of 0", s.IOs[stats.GroupWrite], s.Sectors[stats.GroupWrite])
	}
}

func TestDiscardAndZeroes(t *testing.T) {
	devs := testDevs()
	for _, m := range devs {
		for i := range m.Bytes() {
			m.Bytes()[i] = 0xaa
		}
	}
	d := testDevice(t, "0 32 striped 2 8 8:16 0 8:32 0\n32 8 linear 8:48 0", devs, nil)
	ctx := context.Background()
	if err := d.Discard(ctx, 4*SectorSize, 30*SectorSize); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 40*SectorSize)
	d.ReadAt(ctx, buf, 0)
	for i, c := range buf {
		want := byte(0)
		if i < 4*SectorSize || i >= 34*SectorSize {
			want = 0xaa
		}
		if c != want {
			t.Fatalf("byte %d = %#x after discard, want %#x", i, c, want)
		}
	}
	s := d.Disk().Snapshot()
	if s.IOs[stats.GroupDiscard] != 2 || s.Sectors[stats.GroupDiscard] != 30 {
		t.Errorf("discard counted %d ios, %d sectors; want 2 pieces, 30 sectors", s.IOs[stats.GroupDiscard], s.Sectors[stats.GroupDiscard])
	}
}

// TestAccountingRules checks the accounting rules of the package documentation
// on a device: pieces split at segment and chunk boundaries count separately,
// I/O killed by the error target counts nothing, and in-flight returns to zero.
func TestAccountingRules(t *testing.T) {
	d := testDevice(t, "0 1024 linear 8:16 0\n1024 1024 linear 8:32 0\n2048 64 striped 2 8 8:16 2048 8:32 2048\n2112 64 error", testDevs(), nil)
	ctx := context.Background()
	buf := make([]byte, 16*SectorSize)
	d.ReadAt(ctx, buf[:8*SectorSize], 0)     // 1 piece
	d.ReadAt(ctx, buf, 1016*SectorSize)      // crosses a segment: 2 pieces
	d.ReadAt(ctx, buf, 2048*SectorSize+4096) // two chunks of 8 sectors: 2 pieces
	if _, err := d.ReadAt(ctx, buf[:512], 2112*SectorSize); err == nil {
		t.Fatal("error target read succeeded")
	}
	d.WriteAt(ctx, buf[:4096], 0)
	s := d.Disk().Snapshot()
	if s.IOs[stats.GroupRead] != 5 || s.Sectors[stats.GroupRead] != 40 {
		t.Errorf("reads %d, sectors %d; want 5, 40", s.IOs[stats.GroupRead], s.Sectors[stats.GroupRead])
	}
	if s.IOs[stats.GroupWrite] != 1 || s.Sectors[stats.GroupWrite] != 8 {
		t.Errorf("writes %d, sectors %d; want 1, 8", s.IOs[stats.GroupWrite], s.Sectors[stats.GroupWrite])
	}
	if s.InFlight != [2]uint32{0, 0} {
		t.Errorf("in flight %v after all I/O completed", s.InFlight)
	}
}

func TestSuspendHoldsIO(t *testing.T) {
	d := testDevice(t, "0 8 zero", testDevs(), nil)
	d.Suspend(false)
	if !d.Suspended() {
		t.Fatal("not suspended")
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.ReadAt(context.Background(), make([]byte, 512), 0)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("read completed while suspended: %v", err)
	default:
	}
	// A cancelled request leaves the gate with its context's error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.ReadAt(ctx, make([]byte, 512), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled held read: %v", err)
	}
	if err := d.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("held read after resume: %v", err)
	}
	if s := d.Disk().Snapshot(); s.IOs[stats.GroupRead] != 1 {
		t.Errorf("reads %d after resume, want 1 (held and cancelled I/O is not counted)", s.IOs[stats.GroupRead])
	}
}

func TestConcurrentIO(t *testing.T) {
	devs := testDevs()
	d := testDevice(t, "0 4096 striped 2 8 8:16 0 8:32 0", devs, nil)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; i < 200; i++ {
				off := int64((g*200+i)%500) * 4096
				if i%2 == 0 {
					d.WriteAt(context.Background(), buf, off)
				} else {
					d.ReadAt(context.Background(), buf, off)
				}
			}
		}(g)
	}
	wg.Wait()
	s := d.Disk().Snapshot()
	if got := s.IOs[stats.GroupRead] + s.IOs[stats.GroupWrite]; got != 8*200 {
		t.Errorf("%d I/Os counted, want %d", got, 8*200)
	}
}

func TestManagerFiles(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, _ := NewRegistry(Linear, Striped, Zero, Error)
	m := NewManager(ManagerOptions{Registry: reg})
	defer m.Close()
	if _, err := m.Create(CreateOptions{Name: "a", Minor: -1, Table: "0 2048 linear ./a.img 0", Dir: dir}); err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(CreateOptions{Name: "b", Minor: -1, Table: "0 1024 linear a 1024"})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Live().Format(StatusTable); got != "0 1024 linear 240:0 1024\n" {
		t.Errorf("stacked table prints %q, want device a by its number, as the kernel prints it", got)
	}
	if got := m.Lookup("a").Live().Format(StatusTable); got != "0 2048 linear "+img+" 0\n" {
		t.Errorf("file table prints %q", got)
	}
	if err := m.Remove("a", Flags{}); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("removing a device stacked on: %v, want EBUSY", err)
	}
	if _, err := m.Create(CreateOptions{Name: "c", Minor: -1, Table: "0 4096 linear a 0"}); err == nil {
		t.Error("a table mapping past the end of a mapped device was accepted")
	}
	if m.Lookup("c") != nil {
		t.Error("a failed create left a device")
	}
	if _, err := m.Create(CreateOptions{Name: "d", Minor: -1, Table: "0 8 linear ./missing.img 0", Dir: dir}); err == nil ||
		err.Error() != "d: line 1: linear: Device lookup failed: ./missing.img: no such file or directory" {
		t.Errorf("missing file: %v", err)
	}
	if got := b.Minor(); got != 1 {
		t.Errorf("second device has minor %d, want 1", got)
	}
	if err := m.Remove("b", Flags{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("a", Flags{}); err != nil {
		t.Fatalf("remove after the upper device went away: %v", err)
	}
}

func TestParseConcise(t *testing.T) {
	text := "# devices\n  # indented comment\n\na,,,rw,0 8 zero,8 8 error ;\n b , u-1 , 7 , ro , 0 16 linear /x\\,y 0 ;\n"
	devs, err := ParseConcise(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 {
		t.Fatalf("%d devices, want 2", len(devs))
	}
	if d := devs[0]; d.Name != "a" || d.Table != "0 8 zero\n8 8 error\n" || d.Minor != -1 || d.ReadOnly || d.Line != 4 {
		t.Errorf("first device %+v", d)
	}
	if d := devs[1]; d.Name != "b" || d.UUID != "u-1" || d.Minor != 7 || !d.ReadOnly || d.Table != "0 16 linear /x,y 0\n" || d.Line != 5 {
		t.Errorf("second device %+v", d)
	}
	for _, bad := range []string{"a,,,xx,0 8 zero", "a,,,rw", "a/b,,,rw,0 8 zero", "a,,x,rw,0 8 zero", "a,,,rw,0 8 zero,"} {
		if _, err := ParseConcise(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// The Manager takes uuids as given: the config checks them.
	long := "a," + strings.Repeat("u", 129) + ",,rw,0 8 zero"
	if _, err := ParseConcise(long); err == nil || err.Error() != "line 1: a: uuid longer than 128 bytes" {
		t.Errorf("uuid of 129 bytes: %v", err)
	}
	if devs, err := ParseConcise("a," + strings.Repeat("u", 128) + ",,rw,0 8 zero"); err != nil || len(devs[0].UUID) != 128 {
		t.Errorf("uuid of 128 bytes: %v", err)
	}
	for _, empty := range []string{"", "# nothing\n", " ;\n", "\n\n"} {
		if devs, err := ParseConcise(empty); err != nil || len(devs) != 0 {
			t.Errorf("%q: %v, %v", empty, devs, err)
		}
	}
}

// FuzzConcise checks that the config parser never panics and that every
// device it returns has a valid name and a table that parses.
func FuzzConcise(f *testing.F) {
	f.Add("a,,,rw,0 8 zero;b,,1,ro,0 8 linear a 0")
	f.Add("# c\nx,u,,,0 1 error\\;;")
	f.Fuzz(func(t *testing.T, text string) {
		devs, err := ParseConcise(text)
		if err != nil {
			return
		}
		for _, d := range devs {
			if ValidName(d.Name) != nil {
				t.Fatalf("invalid name %q accepted", d.Name)
			}
			if ValidUUID(d.UUID) != nil {
				t.Fatalf("device %q: invalid uuid %q accepted", d.Name, d.UUID)
			}
			if d.Table == "" {
				t.Fatalf("device %q without a table", d.Name)
			}
		}
	})
}
