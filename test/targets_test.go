package test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestZeroRangeWithoutWriteZeroes: zero and error take no write-zeroes
// (drivers/md/dm-table.c: dm_table_supports_write_zeroes), so fallocate
// ZERO_RANGE falls back to writing zeros (block/fops.c: blkdev_fallocate;
// block/blk-lib.c: blkdev_issue_zeroout, blkdev_issue_zero_pages): zero
// swallows them and succeeds, error fails them with EIO. Both take discards
// (drivers/md/dm-target.c: io_err_ctr and dm-zero.c: zero_ctr set
// discards_supported): PUNCH_HOLE succeeds on zero and fails with EIO on
// error.
func TestZeroRangeWithoutWriteZeroes(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "nil,,,rw,0 2048 zero;\nbad,,,rw,0 2048 error;")
	open := func(name string) *os.File {
		f, err := os.OpenFile(d.path(name), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	z, e := open("nil"), open("bad")
	if err := unix.Fallocate(int(z.Fd()), unix.FALLOC_FL_ZERO_RANGE, 4096, 65536); err != nil {
		t.Errorf("zero range on zero: %v, want success", err)
	}
	if s := diskstatsOf(t, d, "nil"); s[4] != 1 || s[6] != 128 {
		t.Errorf("zero range on zero counted %d writes of %d sectors, want 1 of 128", s[4], s[6])
	}
	if err := unix.Fallocate(int(e.Fd()), unix.FALLOC_FL_ZERO_RANGE, 4096, 65536); !errors.Is(err, syscall.EIO) {
		t.Errorf("zero range on error: %v, want EIO", err)
	}
	if err := unix.Fallocate(int(z.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 8192); err != nil {
		t.Errorf("punch hole on zero: %v", err)
	}
	if err := unix.Fallocate(int(e.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 8192); !errors.Is(err, syscall.EIO) {
		t.Errorf("punch hole on error: %v, want EIO", err)
	}
}

// TestDustFsync: fsync is an empty flush, which dust maps as a write to the
// block of sector 0 (drivers/md/dm.c: __send_empty_flush; drivers/md/
// dm-dust.c: dust_map, dust_map_write): it fails while that block is bad
// with a write-fail count left, and then clears the block.
func TestDustFsync(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "d.img"), 2048*sector)
	d := startDaemon(t, dir, "du,,,rw,0 2048 dust ./d.img 0 4096;")
	d.must("message", "du", "0", "addbadblock", "0", "1")
	d.must("message", "du", "0", "enable")
	f, err := os.OpenFile(d.path("du"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync with block 0 bad: %v, want EIO", err)
	}
	if err := f.Sync(); err != nil {
		t.Errorf("fsync after block 0's write-fail count ran out: %v", err)
	}
	if got := d.must("message", "du", "0", "listbadblocks"); got != "No blocks in badblocklist\n" {
		t.Errorf("listbadblocks after the clearing fsync: %q", got)
	}
}
