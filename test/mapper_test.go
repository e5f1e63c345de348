package test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/fs/export"
	"golang.org/x/sys/unix"
)

// The block devices the dmsetup personality leaves, as the kernel's
// device-mapper and udev leave them: /dev/mapper/NAME a link that scripts
// resolve to a name /sys knows (xfstests' _short_dev), devices under
// tables held exclusively (generic/741), and a file system frozen by
// suspend thawed by resume even when it was unmounted in between
// (generic/085).

// TestDmsetupMapperLink: /dev/mapper/NAME resolves (readlink -f) to a
// block device whose /sys/block entry exists and, with XFS mounted on it,
// whose /sys/fs/xfs/<name>/error exists, as _xfs_set_error_config writes
// there; info and deps take the link; rename moves it, mknodes restores it
// and remove takes it away before it returns.
func TestDmsetupMapperLink(t *testing.T) {
	requireTool(t, "mkfs.xfs", "readlink")
	e := newDmsetupEnv(t)
	dev := e.loop("xfs", 320<<20)
	name := e.name("flakey-test.xfs")
	node := "/dev/mapper/" + name
	e.must("create", name, "--table", "0 655360 flakey "+dev+" 0 180 0")
	target, err := os.Readlink(node)
	if err != nil {
		t.Fatalf("%s is no link: %v", node, err)
	}
	blk := filepath.Base(strings.TrimSpace(e.mustSh("readlink -f " + node)))
	if !strings.HasPrefix(target, "../") || filepath.Base(target) != blk {
		t.Errorf("%s -> %s, resolving to %s: want ../%s", node, target, blk, blk)
	}
	if _, err := os.Stat("/sys/block/" + blk); err != nil {
		t.Errorf("readlink -f %s names %s, which /sys/block does not know: %v", node, blk, err)
	}
	if got := e.must("info", "-c", "--noheadings", "-o", "name,blkdevname", node); got != name+":"+blk+"\n" {
		t.Errorf("info of the link: %q", got)
	}
	run(t, "mkfs.xfs", "-q", "-f", node)
	mnt := e.mountDev(node, "xfs-mnt")
	errDir := "/sys/fs/xfs/" + blk + "/error"
	if _, err := os.Stat(errDir); err != nil {
		t.Errorf("_short_dev's %s: %v", errDir, err)
	}
	// _xfs_set_error_config's write.
	e.mustSh("echo 0 > " + errDir + "/fail_at_unmount")
	run(t, "umount", mnt)

	renamed := e.name("renamed")
	e.must("rename", name, renamed)
	if _, err := os.Lstat(node); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old name is left after rename: %v", err)
	}
	if got, err := filepath.EvalSymlinks("/dev/mapper/" + renamed); err != nil || got != "/dev/"+blk {
		t.Errorf("after rename: %q, %v", got, err)
	}
	os.Remove("/dev/mapper/" + renamed)
	e.must("mknodes")
	if got, err := filepath.EvalSymlinks("/dev/mapper/" + renamed); err != nil || got != "/dev/"+blk {
		t.Errorf("after mknodes: %q, %v", got, err)
	}
	e.must("remove", renamed)
	if _, err := os.Lstat("/dev/mapper/" + renamed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link is left after remove returned: %v", err)
	}
}

// TestDmsetupClaims: a device a table uses is held exclusively, as dm
// holds it: mounting it (generic/741) or opening it O_EXCL fails with
// EBUSY while a table (live, or only inactive) uses it, two tables and a
// reload over it share the claim, and it is free again when the last table
// goes. A table over a device someone else holds exclusively (mounted)
// fails to load with the kernel's EBUSY.
func TestDmsetupClaims(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("claim", 64<<20)
	run(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := filepath.Join(e.dir, "claim-mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if export.Mounted(mnt) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	busy := func(why string) {
		t.Helper()
		if err := unix.Mount(dev, mnt, "ext4", 0, ""); !errors.Is(err, unix.EBUSY) {
			if err == nil {
				unix.Unmount(mnt, 0)
			}
			t.Errorf("%s: mount of the device under a table: %v, want EBUSY", why, err)
		}
		if fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0); !errors.Is(err, unix.EBUSY) {
			if err == nil {
				unix.Close(fd)
			}
			t.Errorf("%s: O_EXCL open of the device under a table: %v, want EBUSY", why, err)
		}
	}
	a, b := e.name("a"), e.name("b")
	e.must("create", a, "--table", "0 131072 linear "+dev+" 0")
	busy("one table")
	// generic/741: the file system mounted through the table, the device
	// under it cannot be mounted a second time.
	top := e.mountDev("/dev/mapper/"+a, "claim-top")
	busy("one table, mounted")
	run(t, "umount", top)
	e.must("create", b, "--table", "0 65536 linear "+dev+" 65536")
	// A reload that keeps the device does not conflict with itself.
	e.must("load", a, "--table", "0 65536 linear "+dev+" 8")
	e.must("resume", a)
	e.must("remove", a)
	busy("the second table")
	e.must("load", b, "--table", "0 8 zero")
	busy("a live table, with an inactive one that does not use the device")
	e.must("resume", b)
	// An inactive table alone holds the device too, until it is cleared.
	n := e.name("notable")
	e.must("create", n, "--notable")
	e.must("load", n, "--table", "0 65536 linear "+dev+" 0")
	busy("an inactive table")
	e.must("clear", n)
	e.must("remove", n)
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		t.Fatalf("mount once no table uses the device: %v", err)
	}
	// Mounted: a table over it fails as the kernel's does.
	c := e.name("c")
	if _, errs, code := e.dmsetup("", "create", c, "--table", "0 65536 linear "+dev+" 0"); code != 1 ||
		!strings.HasPrefix(errs, "device-mapper: reload ioctl on "+c+" ") || !strings.HasSuffix(errs, " failed: Device or resource busy\nCommand failed.\n") {
		t.Errorf("create over a mounted device: exit %d, %q", code, errs)
	}
	if _, errs, code := e.dmsetup("", "load", b, "--table", "0 65536 linear "+dev+" 0"); code != 1 ||
		errs != "device-mapper: reload ioctl on "+b+"  failed: Device or resource busy\nCommand failed.\n" {
		t.Errorf("load over a mounted device: exit %d, %q", code, errs)
	}
	if out, _, _ := e.dmsetup("", "ls"); out == "No devices found\n" || strings.Contains(out, c) {
		t.Errorf("ls after the failed create: %q", out)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	e.must("remove", b)
}

// TestDmsetupThawAfterUnmount is generic/085's sequence: suspend freezes
// the file system, which is unmounted before resume; resume thaws it all
// the same, so that a mount after it takes writes, and remove leaves no
// loop device of the daemon attached.
func TestDmsetupThawAfterUnmount(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("thaw", 64<<20)
	name := e.name("lin")
	node := "/dev/mapper/" + name
	mnt := filepath.Join(e.dir, "thaw-mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if export.Mounted(mnt) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	e.mustSh(fmt.Sprintf(`set -e
DEV=%s; NAME=%s; MNT=%s
dmsetup create $NAME --table "0 $(blockdev --getsz $DEV) linear $DEV 0"
mkfs.ext4 -q /dev/mapper/$NAME; mount /dev/mapper/$NAME $MNT
echo before > $MNT/before
dmsetup suspend $NAME; umount $MNT; dmsetup resume $NAME
mount /dev/mapper/$NAME $MNT`, dev, name, mnt))
	done := make(chan error, 1)
	go func() {
		f, err := os.Create(filepath.Join(mnt, "x"))
		if err == nil {
			_, err = f.WriteString("after\n")
			if err == nil {
				err = f.Sync()
			}
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write after the remount: %v", err)
		}
	case <-time.After(commandTimeout):
		// Thaw it here, or the blocked writer could never exit.
		if fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			unix.IoctlSetInt(fd, 0xc0045878, 0) // FITHAW
			unix.Close(fd)
		}
		<-done
		t.Fatal("a write after the remount blocked: the file system was still frozen")
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "before")); err != nil || string(b) != "before\n" {
		t.Errorf("file written before the suspend: %q, %v", b, err)
	}
	run(t, "umount", mnt)
	loops := loopsOf(filepath.Join(e.run, "mnt"))
	e.must("remove", name)
	if _, err := os.Lstat(node); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left after remove: %v", node, err)
	}
	if left := loopsOf(filepath.Join(e.run, "mnt")); len(left) > 0 {
		out, _ := exec.Command("losetup", "-a").CombinedOutput()
		t.Errorf("loop devices %v (of %v) still attached after remove:\n%s", left, loops, out)
	}
	// The file system is whole: e2fsck of the device under the table.
	if out, err := exec.Command("e2fsck", "-fn", dev).CombinedOutput(); err != nil {
		t.Errorf("e2fsck after the sequence: %v\n%s", err, out)
	}
}
