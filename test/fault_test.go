package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/fs/export"
	"golang.org/x/sys/unix"
)

// TestFlakeyDropAndRemount is xfstests' _flakey_drop_and_remount on a real
// mount: ext4 on a loop device over a flakey device that stays up; file A is
// written and fsynced, file B only written; then a drop_writes table goes live
// (a power cut: nothing more reaches the disk), the file system is unmounted,
// the up table comes back, the loop device is re-attached, e2fsck -fy runs and
// the file system mounts. A must be intact; B may be missing or short but
// never holds garbage.
func TestFlakeyDropAndRemount(t *testing.T) {
	requireTool(t, "losetup", "mkfs.ext4", "e2fsck", "mount", "umount")
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	sparseFile(t, img, 262144*sector)
	up := fmt.Sprintf("0 262144 flakey %s 0 180 0", img)
	down := fmt.Sprintf("0 262144 flakey %s 0 0 180 1 drop_writes", img)
	d := startDaemon(t, dir, "fl,,,rw,"+strings.ReplaceAll(up, ",", `\,`)+";")

	attach := func() string {
		loop := strings.TrimSpace(run(t, "losetup", "--direct-io=on", "-f", "--show", d.path("fl")))
		t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
		return loop
	}
	loop := attach()
	run(t, "mkfs.ext4", "-q", "-F", loop)
	fsdir := filepath.Join(dir, "fs")
	os.Mkdir(fsdir, 0o755)
	run(t, "mount", loop, fsdir)
	t.Cleanup(func() {
		if export.Mounted(fsdir) {
			unix.Unmount(fsdir, unix.MNT_DETACH)
		}
	})
	a := bytes.Repeat([]byte("fsynced A "), 100000)
	b := bytes.Repeat([]byte("not synced B "), 100000)
	fa, err := os.Create(filepath.Join(fsdir, "A"))
	if err != nil {
		t.Fatal(err)
	}
	fa.Write(a)
	if err := fa.Sync(); err != nil {
		t.Fatal(err)
	}
	fa.Close()
	if df, err := os.Open(fsdir); err == nil {
		df.Sync() // the directory entry of A
		df.Close()
	}
	if err := os.WriteFile(filepath.Join(fsdir, "B"), b, 0o644); err != nil {
		t.Fatal(err)
	}

	d.must("load", "fl", "--table", down)
	d.must("resume", "fl")
	if got := d.must("table", "fl"); got != down+"\n" {
		t.Fatalf("table after the drop: %q", got)
	}
	if err := unix.Unmount(fsdir, 0); err != nil {
		t.Fatalf("unmount with dropped writes: %v", err)
	}
	d.must("load", "fl", "--table", up)
	d.must("resume", "fl")
	run(t, "losetup", "-d", loop)
	loop = attach()

	out, err := exec.Command("e2fsck", "-fy", loop).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() <= 2) {
		t.Fatalf("e2fsck -fy: %v\n%s", err, out)
	}
	if out, err := exec.Command("e2fsck", "-fn", loop).CombinedOutput(); err != nil {
		t.Fatalf("file system not consistent after e2fsck -fy: %v\n%s", err, out)
	}
	run(t, "mount", loop, fsdir)
	got, err := os.ReadFile(filepath.Join(fsdir, "A"))
	if err != nil || !bytes.Equal(got, a) {
		t.Errorf("A after the power cut: %d bytes, %v; want the %d bytes fsynced", len(got), err, len(a))
	}
	got, err = os.ReadFile(filepath.Join(fsdir, "B"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		t.Log("B is gone, as the power cut allows")
	case err != nil:
		t.Errorf("reading B: %v", err)
	default:
		if len(got) > len(b) {
			t.Errorf("B grew to %d bytes", len(got))
		}
		for i := range got {
			if got[i] != b[i] && got[i] != 0 {
				t.Fatalf("B holds garbage at byte %d: %q", i, got[i:min(len(got), i+16)])
			}
		}
		t.Logf("B survived with %d of %d bytes", len(got), len(b))
	}
	run(t, "umount", fsdir)
}

// TestDustScenario marks blocks bad, reads them through the device file (EIO),
// writes one (which clears it) and reads it again.
func TestDustScenario(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "d.img"), 2048*sector)
	d := startDaemon(t, dir, "du,,,rw,0 2048 dust ./d.img 0 4096;")
	d.must("message", "du", "0", "addbadblock", "10")
	d.must("message", "du", "0", "addbadblock", "11")
	d.must("message", "du", "0", "addbadblock", "200")
	f, err := os.OpenFile(d.path("du"), os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	// In bypass mode the list does not matter.
	if _, err := f.ReadAt(buf, 10*4096); err != nil {
		t.Fatalf("read of a listed block in bypass mode: %v", err)
	}
	d.must("message", "du", "0", "enable")
	if got := d.must("status", "du"); got != "0 2048 dust "+filepath.Join(dir, "d.img")+" fail_read_on_bad_block verbose\n" {
		t.Errorf("status after enable: %q", got)
	}
	if _, err := f.ReadAt(buf, 10*4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of bad block 10: %v, want EIO", err)
	}
	// A read spanning a good and a bad block fails as a whole.
	if _, err := f.ReadAt(make([]byte, 8192), 9*4096); !errors.Is(err, syscall.EIO) {
		t.Errorf("read spanning blocks 9 and 10: %v, want EIO", err)
	}
	if _, err := f.ReadAt(buf, 12*4096); err != nil {
		t.Errorf("read of good block 12: %v", err)
	}
	for i := range buf {
		buf[i] = 0x77
	}
	if _, err := f.WriteAt(buf, 10*4096); err != nil {
		t.Fatalf("write of bad block 10: %v", err)
	}
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, 10*4096); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("block 10 after the write: %v", err)
	}
	if got := d.must("message", "du", "0", "countbadblocks"); got != "countbadblocks: 2 badblock(s) found\n" {
		t.Errorf("countbadblocks: %q", got)
	}
	if got := d.must("message", "du", "0", "listbadblocks"); got != "11\n200\n" {
		t.Errorf("listbadblocks: %q", got)
	}
	if got := d.must("message", "du", "0", "queryblock", "10"); got != "dust_query_block: block 10 not found in badblocklist\n" {
		t.Errorf("queryblock 10: %q", got)
	}
	if _, errs, code := d.dmfuse("/", "", "message", "du", "0", "addbadblock", "11"); code == 0 || !strings.Contains(errs, "du") {
		t.Errorf("adding a listed block again: exit %d, %q", code, errs)
	}
	// Killed reads count nothing; the rest count by block.
	s := diskstatsOf(t, d, "du")
	if s[0] != 4 {
		t.Errorf("reads completed %d, want 4 (bypass read, block 9 of the spanning read, block 12, the re-read); killed pieces count nothing", s[0])
	}
	d.must("message", "du", "0", "clearbadblocks")
	if got := d.must("message", "du", "0", "listbadblocks"); got != "No blocks in badblocklist\n" {
		t.Errorf("listbadblocks after clear: %q", got)
	}
}
