package stack

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stats"
)

// limitedDev is a MemDevice that refuses discards or write-zeroes in its
// limits and counts the calls that reach it anyway.
type limitedDev struct {
	*MemDevice
	noDiscard, noZeroes   bool
	discards, writeZeroes atomic.Int32
}

func (l *limitedDev) Discard(ctx context.Context, off, n int64) error {
	l.discards.Add(1)
	return l.MemDevice.Discard(ctx, off, n)
}

func (l *limitedDev) WriteZeroes(ctx context.Context, off, n int64) error {
	l.writeZeroes.Add(1)
	return l.MemDevice.WriteZeroes(ctx, off, n)
}

// Limits reports what the device takes, as a block device's queue limits do.
func (l *limitedDev) Limits() Limits { return Limits{Discard: !l.noDiscard, WriteZeroes: !l.noZeroes} }

// TestWriteZeroesFallback: where a table does not take write-zeroes
// (drivers/md/dm-table.c: dm_table_supports_write_zeroes wants
// num_write_zeroes_bios on every target, which zero, error, flakey, dust and
// delay do not set), fallocate ZERO_RANGE on the device falls back to
// writing zeros (block/fops.c: blkdev_fallocate calls blkdev_issue_zeroout
// without BLKDEV_ZERO_NOFALLBACK; block/blk-lib.c: blkdev_issue_zeroout
// then calls blkdev_issue_zero_pages). The targets see plain writes.
func TestWriteZeroesFallback(t *testing.T) {
	ctx := context.Background()

	// zero swallows the writes: success, where a write-zeroes would fail.
	z := testDevice(t, "0 8192 zero", testDevs(), nil)
	if err := z.WriteZeroes(ctx, 4096, 1<<20+8192); err != nil {
		t.Errorf("write-zeroes on zero: %v, want success", err)
	}
	s := z.Disk().Snapshot()
	if s.IOs[stats.GroupWrite] != 2 || s.Sectors[stats.GroupWrite] != 2064 {
		t.Errorf("zero: %d writes of %d sectors, want 2 (1 MiB of zeros each at most) of 2064",
			s.IOs[stats.GroupWrite], s.Sectors[stats.GroupWrite])
	}

	// error fails them: EIO, and killed writes count nothing.
	e := testDevice(t, "0 2048 error", testDevs(), nil)
	if err := e.WriteZeroes(ctx, 0, 4096); !errors.Is(err, syscall.EIO) {
		t.Errorf("write-zeroes on error: %v, want EIO", err)
	}
	if s := e.Disk().Snapshot(); s.IOs[stats.GroupWrite] != 0 {
		t.Errorf("error: %d writes counted", s.IOs[stats.GroupWrite])
	}

	// flakey while down corrupts the zero writes like any other write.
	devs := testDevs()
	faultPattern(devs["8:16"])
	f := testDevice(t, "0 2048 flakey 8:16 0 0 1 5 corrupt_bio_byte 3 w 7 0", devs, nil)
	if err := f.WriteZeroes(ctx, 512, 1024); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 1024)
	want[2] = 7
	if got := devs["8:16"].Bytes()[512:1536]; !bytes.Equal(got, want) {
		t.Errorf("flakey corrupt_bio_byte 3 w 7 while down: zeros written as %v..., want byte 3 set to 7", got[:8])
	}

	// A linear table over a device without write-zeroes writes zeros.
	ld := &limitedDev{MemDevice: NewMemDevice("8:16", 2048*SectorSize), noZeroes: true}
	faultPattern(ld.MemDevice)
	l := liveDevice(t, "0 2048 linear 8:16 0", map[string]BlockDevice{"8:16": ld}, nil)
	if err := l.WriteZeroes(ctx, 100, 5000); err != nil {
		t.Fatal(err)
	}
	if ld.writeZeroes.Load() != 0 {
		t.Error("write-zeroes reached a device that does not take it")
	}
	if got := ld.Bytes()[100:5100]; !bytes.Equal(got, make([]byte, 5000)) || ld.Bytes()[99] == 0 || ld.Bytes()[5100] == 0 {
		t.Error("the fallback wrote the wrong range")
	}

	// Where every target and device takes write-zeroes, they are passed on.
	wz := &limitedDev{MemDevice: NewMemDevice("8:16", 2048*SectorSize)}
	w := liveDevice(t, "0 2048 linear 8:16 0", map[string]BlockDevice{"8:16": wz}, nil)
	if err := w.WriteZeroes(ctx, 0, 4096); err != nil || wz.writeZeroes.Load() != 1 {
		t.Errorf("write-zeroes on linear: %v, %d calls", err, wz.writeZeroes.Load())
	}
}

// TestDiscardSupport: a discard on a table that does not take discards
// (drivers/md/dm-table.c: dm_table_supports_discards wants every target to
// set num_discard_bios and either discards_supported or devices that all
// take discards) fails with EOPNOTSUPP before any target sees it.
func TestDiscardSupport(t *testing.T) {
	ctx := context.Background()
	yes := &limitedDev{MemDevice: NewMemDevice("8:16", 2048*SectorSize)}
	no := &limitedDev{MemDevice: NewMemDevice("8:32", 2048*SectorSize), noDiscard: true}
	d := liveDevice(t, "0 1024 linear 8:16 0\n1024 1024 linear 8:32 0", map[string]BlockDevice{"8:16": yes, "8:32": no}, nil)
	if err := d.Discard(ctx, 0, 2048*SectorSize); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("discard: %v, want EOPNOTSUPP", err)
	}
	if yes.discards.Load() != 0 || no.discards.Load() != 0 {
		t.Errorf("discards reached the devices: %d, %d", yes.discards.Load(), no.discards.Load())
	}
	if s := d.Disk().Snapshot(); s.IOs[stats.GroupDiscard] != 0 {
		t.Errorf("%d discards counted", s.IOs[stats.GroupDiscard])
	}
	// zero drops discards and error fails them, whatever the rest.
	if err := testDevice(t, "0 8 zero", testDevs(), nil).Discard(ctx, 0, 4096); err != nil {
		t.Errorf("discard on zero: %v", err)
	}
	if err := testDevice(t, "0 8 error", testDevs(), nil).Discard(ctx, 0, 4096); !errors.Is(err, syscall.EIO) {
		t.Errorf("discard on error: %v, want EIO", err)
	}
}

// TestTargetLimits: which tables take discards and write-zeroes, target by
// target, as each kernel constructor sets num_discard_bios,
// discards_supported and num_write_zeroes_bios (dm-linear.c: linear_ctr,
// dm-stripe.c: stripe_ctr set both (multipath: in its package);
// dm-flakey.c: flakey_ctr, dm-dust.c: dust_ctr set discards only;
// dm-zero.c: zero_ctr and dm-target.c: io_err_ctr set discards and
// discards_supported), and whether the devices below take them
// (dm-table.c: dm_table_supports_discards, dm_table_supports_write_zeroes).
func TestTargetLimits(t *testing.T) {
	reg, err := NewRegistry(Linear, Striped, Zero, Error, Flakey, Dust)
	if err != nil {
		t.Fatal(err)
	}
	devs := map[string]BlockDevice{
		"8:16": NewMemDevice("8:16", 16384*SectorSize),
		"8:32": NewMemDevice("8:32", 16384*SectorSize),
		"nd":   &limitedDev{MemDevice: NewMemDevice("nd", 16384*SectorSize), noDiscard: true},
		"nz":   &limitedDev{MemDevice: NewMemDevice("nz", 16384*SectorSize), noZeroes: true},
	}
	build := func(text string) *Table {
		t.Helper()
		lines, err := ParseTable(text)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := Build(lines, BuildOptions{Registry: reg, Clock: clock.System, Context: context.Background(),
			Open: func(arg string) (BlockDevice, error) { return devs[arg], nil }})
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		t.Cleanup(func() { tb.Close() })
		return tb
	}
	for _, tc := range []struct {
		table string
		want  Limits
	}{
		{"0 2048 linear 8:16 0", Limits{Discard: true, WriteZeroes: true}},
		{"0 2048 striped 2 8 8:16 0 8:32 0", Limits{Discard: true, WriteZeroes: true}},
		{"0 2048 zero", Limits{Discard: true}},
		{"0 2048 error", Limits{Discard: true}},
		{"0 2048 error 8:16 0", Limits{Discard: true}},
		{"0 2048 flakey 8:16 0 1 0", Limits{Discard: true}},
		{"0 2048 dust 8:16 0 512", Limits{Discard: true}},
		// The devices below decide for the targets that pass operations on.
		{"0 2048 linear nd 0", Limits{WriteZeroes: true}},
		{"0 2048 linear nz 0", Limits{Discard: true}},
		{"0 2048 striped 2 8 8:16 0 nz 0", Limits{Discard: true}},
		{"0 2048 flakey nd 0 1 0", Limits{}},
		// zero and error complete discards themselves (discards_supported).
		{"0 2048 error nd 0", Limits{Discard: true}},
		// A table takes an operation only if every target does.
		{"0 1024 linear 8:16 0\n1024 1024 zero", Limits{Discard: true}},
		{"0 1024 linear 8:16 0\n1024 1024 linear nd 0", Limits{WriteZeroes: true}},
		{"0 1024 zero\n1024 1024 error", Limits{Discard: true}},
	} {
		if got := build(tc.table).Limits(); got != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.table, got, tc.want)
		}
	}
}

// TestStackedLimits: a mapped device below a table passes on what its own
// live table takes, as the limits a dm device's queue got from its table
// (drivers/md/dm-table.c: dm_table_set_restrictions) are what
// dm_calculate_queue_limits of a table above reads through
// dm_set_device_limits.
func TestStackedLimits(t *testing.T) {
	reg, _ := NewRegistry(Linear, Zero)
	m := NewManager(ManagerOptions{Registry: reg})
	defer m.Close()
	for _, c := range []CreateOptions{
		{Name: "z", Minor: -1, Table: "0 2048 zero"},
		{Name: "l", Minor: -1, Table: "0 2048 linear z 0"},
	} {
		if _, err := m.Create(c); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := m.Lookup("l").Limits(), (Limits{Discard: true}); got != want {
		t.Errorf("linear over zero: %+v, want %+v", got, want)
	}
	// Write-zeroes on the upper device fall back to writes, which zero
	// below swallows.
	if err := m.Lookup("l").WriteZeroes(context.Background(), 0, 8192); err != nil {
		t.Errorf("write-zeroes on linear over zero: %v", err)
	}
}

// TestDustWriteZeroes: write-zeroes reach dust as writes, split at its block
// size like any write (drivers/md/dm.c: max_io_len), each block under the
// write rule.
func TestDustWriteZeroes(t *testing.T) {
	ctx := context.Background()
	devs := testDevs()
	faultPattern(devs["8:16"])
	d := testDevice(t, "0 64 dust 8:16 0 512", devs, nil)
	dt, _, _ := d.Live().TargetAt(0)
	dust := dt.(*dust)
	dustMsg(dust, "enable")
	dustMsg(dust, "addbadblock 2 0")
	if err := d.WriteZeroes(ctx, 512, 2048); err != nil {
		t.Fatalf("write-zeroes over a bad block without write failures: %v", err)
	}
	if out, _ := dustMsg(dust, "listbadblocks"); out != "No blocks in badblocklist" {
		t.Errorf("the zeros did not clear block 2: %q", out)
	}
	if !bytes.Equal(devs["8:16"].Bytes()[512:2560], make([]byte, 2048)) {
		t.Error("zeros not written")
	}
	dustMsg(dust, "addbadblock 6 1")
	faultPattern(devs["8:16"])
	if err := d.WriteZeroes(ctx, 6*512, 1024); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write-zeroes starting on a bad block: %v, want EIO", err)
	}
	if devs["8:16"].Bytes()[6*512] == 0 {
		t.Error("a failed zero write reached the device")
	}
	// Four blocks of zeros, one piece each; the killed piece counts nothing
	// and Table.rw issues nothing after it.
	if s := d.Disk().Snapshot(); s.IOs[stats.GroupWrite] != 4 || s.Sectors[stats.GroupWrite] != 4 {
		t.Errorf("%d writes of %d sectors counted, want 4 of 4", s.IOs[stats.GroupWrite], s.Sectors[stats.GroupWrite])
	}
}
