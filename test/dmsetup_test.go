package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/fs/export"
	"golang.org/x/sys/unix"
)

// The dmsetup personality end to end: dmfuse linked as dmsetup on PATH, a
// private system instance (DMFUSE_RUN_DIR) started by the first command,
// block devices at /dev/mapper/NAME, driven as the harnesses drive the
// kernel's device-mapper (xfstests common/dmflakey, dmerror, dmdust,
// blktests dm/002, bbolt's dmflakey).

// commandTimeout bounds each command a test runs, so that a hang fails the
// test with what it was doing.
const commandTimeout = 2 * time.Minute

// dmsetupEnv is one private system instance, the PATH that finds dmfuse
// as dmsetup, and the prefix of every device name the test makes.
type dmsetupEnv struct {
	t      *testing.T
	dir    string
	run    string
	env    []string
	prefix string
}

// dmsetupPrefix returns a device name prefix of its own for each test: the
// nodes are in the one /dev/mapper of the machine, which every run of these
// tests shares (two checkouts running CI at once, a second go test while
// one runs, a run after one that was killed).
func dmsetupPrefix() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return fmt.Sprintf("dmt%d-%x-", os.Getpid(), b)
}

// name is the test's device called s.
func (e *dmsetupEnv) name(s string) string { return e.prefix + s }

// devNo returns the number of the mapped device called name, as tables
// print it ("MAJOR:MINOR").
func (e *dmsetupEnv) devNo(name string) string {
	e.t.Helper()
	return strings.TrimSpace(e.must("info", "-c", "--noheadings", "--separator", ":", "-o", "major,minor", name))
}

// blockNo returns the number of the block device at path, as tables print
// it ("MAJOR:MINOR").
func blockNo(t testing.TB, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

func newDmsetupEnv(t *testing.T) *dmsetupEnv {
	t.Helper()
	requireFUSE(t)
	requireTool(t, "losetup", "blockdev", "mkfs.ext4", "mount", "umount", "bash", "dd")
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no loop devices")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(t.Name(), realDmsetupTest+"/") {
		// Debian's dmsetup under dmfuse exec in the drop-in's place.
		script := "#!/bin/sh\nexec " + dmfuseBin + " exec -- /usr/sbin/dmsetup \"$@\"\n"
		if err := os.WriteFile(filepath.Join(bin, "dmsetup"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Symlink(dmfuseBin, filepath.Join(bin, "dmsetup")); err != nil {
		t.Fatal(err)
	}
	e := &dmsetupEnv{t: t, dir: dir, run: filepath.Join(dir, "run"), prefix: dmsetupPrefix()}
	e.env = append(os.Environ(), "DMFUSE_RUN_DIR="+e.run, "PATH="+bin+":"+os.Getenv("PATH"), "LC_ALL=C")
	// Last of all: no loop device over a file of the test is left, the
	// test's own (detached, or set to detach at last close, by their
	// cleanups) or the daemon's.
	t.Cleanup(func() {
		for deadline := time.Now().Add(5 * time.Second); len(loopsOf(dir)) > 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("loop devices left: %v", loopsOf(dir))
				detachLoops(dir)
				return
			}
		}
	})
	t.Cleanup(e.cleanup)
	return e
}

// dmsetup runs dmsetup and returns stdout, stderr and the exit status.
func (e *dmsetupEnv) dmsetup(stdin string, args ...string) (string, string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "dmsetup", args...)
	cmd.Env, cmd.Dir = e.env, e.dir
	cmd.Path = filepath.Join(e.dir, "bin", "dmsetup")
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	code := 0
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			e.t.Fatalf("dmsetup %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// must runs dmsetup, which must succeed without a word on stderr.
func (e *dmsetupEnv) must(args ...string) string {
	e.t.Helper()
	out, errs, code := e.dmsetup("", args...)
	if code != 0 || errs != "" {
		e.t.Fatalf("dmsetup %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// sh runs a bash script with dmsetup on PATH and returns its combined
// output and exit status.
func (e *dmsetupEnv) sh(script string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Env, cmd.Dir = e.env, e.dir
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			e.t.Fatalf("bash: %v", err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

// mustSh runs a script that must succeed.
func (e *dmsetupEnv) mustSh(script string) string {
	e.t.Helper()
	out, code := e.sh(script)
	if code != 0 {
		e.t.Fatalf("script failed (exit %d):\n%s\n%s", code, script, out)
	}
	return out
}

// loop attaches a loop device (the harnesses' SCRATCH_DEV) over a new
// sparse file of size bytes; cleanup detaches it.
func (e *dmsetupEnv) loop(name string, size int64) string {
	e.t.Helper()
	img := filepath.Join(e.dir, name+".img")
	sparseFile(e.t, img, size)
	dev := strings.TrimSpace(run(e.t, "losetup", "-f", "--show", img))
	e.t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// mountDev mounts dev on a new folder; cleanup unmounts it.
func (e *dmsetupEnv) mountDev(dev, name string) string {
	e.t.Helper()
	mnt := filepath.Join(e.dir, name)
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		e.t.Fatal(err)
	}
	run(e.t, "mount", dev, mnt)
	e.t.Cleanup(func() {
		if export.Mounted(mnt) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt
}

// pid is the running daemon's pid (0 if none).
func (e *dmsetupEnv) pid() int {
	b, err := os.ReadFile(filepath.Join(e.run, "daemon.pid"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// cleanup removes every device (unmounting what the test left mounted),
// stops the daemon and checks that no loop device, mount or node of it is
// left.
func (e *dmsetupEnv) cleanup() {
	t := e.t
	mnt := filepath.Join(e.run, "mnt")
	daemon := e.pid()
	if daemon != 0 {
		for _, dev := range loopsOf(mnt) {
			for _, m := range export.MountsOfPath(dev) {
				unix.Unmount(m, unix.MNT_DETACH)
			}
		}
		e.dmsetup("", "remove_all", "-f")
		stop := exec.Command(dmfuseBin, "stop")
		stop.Env = e.env
		if out, err := stop.CombinedOutput(); err != nil {
			t.Errorf("dmfuse stop: %v\n%s", err, out)
			if pid := e.pid(); pid != 0 {
				unix.Kill(pid, unix.SIGKILL)
				time.Sleep(100 * time.Millisecond)
				e.dmsetup("", "ls")
			}
		}
		// dmfuse stop returns once the daemon has let go of its devices
		// and answered; the process exits a moment later.
		for deadline := time.Now().Add(5 * time.Second); alive(daemon) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if t.Failed() {
		if b, err := os.ReadFile(filepath.Join(e.run, "daemon.log")); err == nil {
			t.Logf("daemon log:\n%s", b)
		}
	}
	if l := loopsOf(mnt); len(l) > 0 {
		t.Errorf("loop devices left: %v", l)
		detachLoops(mnt)
	}
	if export.Mounted(mnt) {
		t.Errorf("%s still mounted", mnt)
		unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if b, err := os.ReadFile(filepath.Join(e.run, "nodes")); err == nil && len(b) > 0 {
		t.Errorf("nodes left: %s", b)
	}
	if left, _ := filepath.Glob("/dev/mapper/" + e.prefix + "*"); len(left) > 0 {
		t.Errorf("/dev/mapper entries left: %v", left)
		for _, p := range left {
			os.Remove(p)
		}
	}
	for _, pid := range []int{daemon, e.pid()} {
		if alive(pid) {
			t.Errorf("daemon %d still runs", pid)
			unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// loopsOf lists the loop devices backed by files under dir.
func loopsOf(dir string) []string {
	var out []string
	for _, l := range export.LoopsUnder(dir) {
		out = append(out, l.Path)
	}
	return out
}

// waitGone waits for path to disappear, as `udevadm wait --removed` does.
func waitGone(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there", path)
		}
	}
}

func writeFile(t *testing.T, path, data string, sync bool) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDmsetupFlakeyCycle is xfstests' power-failure cycle (common/dmflakey)
// on ext4, xfs and btrfs: a file fsynced before the flakey table drops writes
// survives, one written after does not.
func TestDmsetupFlakeyCycle(t *testing.T) {
	for _, c := range []struct {
		fs   string
		size int64
		mkfs []string
	}{
		{"ext4", 64 << 20, []string{"mkfs.ext4", "-q", "-F"}},
		{"xfs", 320 << 20, []string{"mkfs.xfs", "-q", "-f"}},
		{"btrfs", 256 << 20, []string{"mkfs.btrfs", "-q", "-f"}},
	} {
		t.Run(c.fs, func(t *testing.T) {
			requireTool(t, c.mkfs[0])
			e := newDmsetupEnv(t)
			dev := e.loop("scratch", c.size)
			name := e.name("flakey-test." + c.fs)
			node := "/dev/mapper/" + name
			script := fmt.Sprintf(`set -e
DEV=%s; NAME=%s
SZ=$(blockdev --getsz $DEV)
FLAKEY_TABLE="0 $SZ flakey $DEV 0 180 0"
dmsetup create $NAME --table "$FLAKEY_TABLE"
[ -b /dev/mapper/$NAME ]
[ "$(blockdev --getsz /dev/mapper/$NAME)" = "$SZ" ]
`, dev, name)
			e.mustSh(script)
			run(t, c.mkfs[0], append(c.mkfs[1:], node)...)
			mnt := e.mountDev(node, "scratch-mnt")
			writeFile(t, filepath.Join(mnt, "synced"), "fsynced data\n", true)
			writeFile(t, filepath.Join(mnt, "lost"), "never fsynced\n", false)
			// _load_flakey_table drop: the table comes on stdin.
			e.mustSh(fmt.Sprintf(`set -e
DEV=%s; NAME=%s; SZ=$(blockdev --getsz $DEV)
dmsetup suspend --nolockfs $NAME
echo -e "0 $SZ flakey $DEV 0 0 180 1 drop_writes" | dmsetup load $NAME
dmsetup resume $NAME
dmsetup table $NAME | grep -q drop_writes`, dev, name))
			run(t, "umount", mnt)
			e.mustSh(fmt.Sprintf(`set -e
DEV=%s; NAME=%s; SZ=$(blockdev --getsz $DEV)
dmsetup suspend --nolockfs $NAME
echo -e "0 $SZ flakey $DEV 0 180 0" | dmsetup load $NAME
dmsetup resume $NAME`, dev, name))
			run(t, "mount", node, mnt)
			if b, err := os.ReadFile(filepath.Join(mnt, "synced")); err != nil || string(b) != "fsynced data\n" {
				t.Errorf("fsynced file after the cycle: %q, %v", b, err)
			}
			if b, err := os.ReadFile(filepath.Join(mnt, "lost")); err == nil && len(b) > 0 {
				t.Errorf("a file written after the last fsync survived the dropped writes: %q", b)
			}
			run(t, "umount", mnt)
			// _cleanup_flakey: resume is harmless on an active device.
			e.mustSh(fmt.Sprintf(`set -e
dmsetup resume %[1]s &>/dev/null
dmsetup remove --deferred %[1]s`, name))
			waitGone(t, node)
		})
	}
}

// TestDmsetupErrorWrites is bbolt's ErrorWrites: with flakey error_writes,
// write and fsync on the mounted file system fail with EIO; with the table
// allowing writes again, the device works after a remount.
func TestDmsetupErrorWrites(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("bbolt", 64<<20)
	name := e.name("bbolt-flakey")
	sz := strings.TrimSpace(run(t, "blockdev", "--getsz", dev))
	e.must("create", name, "--table", fmt.Sprintf("0 %s flakey %s 0 120 0", sz, dev))
	node := "/dev/mapper/" + name
	run(t, "mkfs.ext4", "-q", node)
	mnt := e.mountDev(node, "bbolt-mnt")
	reload := func(table string, syncFS bool) {
		t.Helper()
		if syncFS {
			e.must("suspend", name)
		} else {
			e.must("suspend", "--nolockfs", name)
		}
		e.must("load", name, "--table", table)
		e.must("resume", name)
	}
	reload(fmt.Sprintf("0 %s flakey %s 0 0 120 1 error_writes", sz, dev), true)
	f, err := os.Create(filepath.Join(mnt, "db"))
	if err == nil {
		f.Write(bytes.Repeat([]byte("x"), 1<<16))
		err = f.Sync()
		f.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("write and fsync with error_writes: %v, want an input/output error", err)
	}
	reload(fmt.Sprintf("0 %s flakey %s 0 120 0", sz, dev), false)
	run(t, "umount", mnt)
	run(t, "mount", node, mnt)
	writeFile(t, filepath.Join(mnt, "after"), "works\n", true)
	run(t, "umount", mnt)
	e.must("remove", name)
	// bbolt's teardown reads this as "already gone".
	if _, errs, code := e.dmsetup("", "remove", name); code != 1 || !strings.Contains(errs, "No such device or address") {
		t.Errorf("second remove: exit %d, %q", code, errs)
	}
}

// TestDmsetupDust is blktests dm/002: dust bad blocks through messages,
// direct writes that clear them, and remove --retry, compared with
// 002.out.
func TestDmsetupDust(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("test", 64<<20)
	out := e.mustSh(fmt.Sprintf(`TEST_DEV=%s
FULL=%s/full
dust1=%s
sz=$(blockdev --getsz "$TEST_DEV")
bsz=$(blockdev --getbsz "$TEST_DEV")
dmsetup create $dust1 --table "0 $sz dust $TEST_DEV 0 $bsz"
dmsetup message $dust1 0 addbadblock 60
dmsetup message $dust1 0 addbadblock 67
dmsetup message $dust1 0 addbadblock 72
dmsetup message $dust1 0 countbadblocks
dmsetup message $dust1 0 listbadblocks
dmsetup message $dust1 0 clearbadblocks
dmsetup message $dust1 0 countbadblocks
dmsetup message $dust1 0 addbadblock 60
dmsetup message $dust1 0 addbadblock 67
dmsetup message $dust1 0 addbadblock 72
dmsetup message $dust1 0 countbadblocks
dmsetup message $dust1 0 enable
dd if=/dev/zero of=/dev/mapper/$dust1 bs="$bsz" count=128 oflag=direct >"$FULL" 2>&1 || exit $?
sync
dmsetup message $dust1 0 countbadblocks
sync
dmsetup remove --retry $dust1 |& grep -v "Device or resource busy"
[ ! -e /dev/mapper/$dust1 ] || echo "node left"
`, dev, e.dir, e.name("dust1")))
	want := "countbadblocks: 3 badblock(s) found\n60\n67\n72\ndust_clear_badblocks: badblocks cleared\n" +
		"countbadblocks: 0 badblock(s) found\ncountbadblocks: 3 badblock(s) found\ncountbadblocks: 0 badblock(s) found\n"
	if out != want {
		t.Errorf("dm/002 output:\n%s\nwant:\n%s", out, want)
	}
}

// TestDmsetupErrorSwap is xfstests' dmerror: a linear device gets a
// multi-line table with an error range on stdin, reads there fail with EIO
// and elsewhere succeed; the working table comes back as a multi-line
// --table.
func TestDmsetupErrorSwap(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("err", 16<<20)
	name := e.name("error-test")
	node := "/dev/mapper/" + name
	e.mustSh(fmt.Sprintf(`set -e
DEV=%s; NAME=%s; SZ=$(blockdev --getsz $DEV)
dmsetup create $NAME --table "0 $SZ linear $DEV 0"
dmsetup suspend --nolockfs $NAME
printf "0 1000 linear $DEV 0\n1000 1000 error $DEV 1000\n2000 $((SZ-2000)) linear $DEV 2000\n" | dmsetup load $NAME
dmsetup resume $NAME`, dev, name))
	if got := e.must("table", name); got != fmt.Sprintf("0 1000 linear %s 0\n1000 1000 error \n2000 30768 linear %s 2000\n", blockNo(t, dev), blockNo(t, dev)) {
		t.Errorf("table: %q", got)
	}
	readAt := func(sector int64) error {
		f, err := os.OpenFile(node, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.ReadAt(alignedBuf(4096), sector*512)
		return err
	}
	if err := readAt(0); err != nil {
		t.Errorf("read before the bad range: %v", err)
	}
	if err := readAt(1500); !errors.Is(err, syscall.EIO) {
		t.Errorf("read in the bad range: %v, want EIO", err)
	}
	if err := readAt(2048); err != nil {
		t.Errorf("read after the bad range: %v", err)
	}
	e.mustSh(fmt.Sprintf(`set -e
DEV=%s; NAME=%s; SZ=$(blockdev --getsz $DEV)
table="0 1000 linear $DEV 0
1000 $((SZ-1000)) linear $DEV 1000"
dmsetup suspend $NAME
dmsetup load $NAME --table "$table"
dmsetup resume $NAME`, dev, name))
	if err := readAt(1500); err != nil {
		t.Errorf("read after the working table is back: %v", err)
	}
	e.must("remove", name)
	waitGone(t, node)
}

// TestDmsetupStacked: a table naming /dev/mapper/OTHER uses that device
// in-process (the table shows its name), deps and ls --tree show the stack,
// data written through the upper block device is the lower one's, and the
// lower device cannot go while the upper stands.
func TestDmsetupStacked(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("base", 16<<20)
	base, top := e.name("base"), e.name("top")
	e.must("create", base, "--table", "0 32768 linear "+dev+" 0")
	e.must("create", top, "--table", "0 16384 linear /dev/mapper/"+base+" 8192")
	if got := e.must("table", top); got != "0 16384 linear "+e.devNo(base)+" 8192\n" {
		t.Errorf("table of the upper device: %q", got)
	}
	// The device's own number, fixed at create (the loop device it is
	// exported as has another).
	baseNo := strings.ReplaceAll(e.devNo(base), ":", ", ")
	if got := e.must("deps", top); got != "1 dependencies\t: ("+baseNo+")\n" {
		t.Errorf("deps: %q", got)
	}
	if got := e.must("deps", "-o", "devname", top); got != "1 dependencies\t: ("+base+")\n" {
		t.Errorf("deps -o devname: %q", got)
	}
	if got := e.must("ls", "--tree", "-o", "ascii"); !strings.Contains(got, top+" (") || !strings.Contains(got, " `-"+base+" (") {
		t.Errorf("ls --tree:\n%s", got)
	}
	// Loading the upper table again through MAJOR:MINOR resolves the same,
	// whether the number is the device's own or its loop device's.
	e.must("load", top, "--table", "0 16384 linear "+strings.ReplaceAll(baseNo, ", ", ":")+" 8192")
	e.must("resume", top)
	e.must("load", top, "--table", "0 16384 linear "+blockNo(t, "/dev/mapper/"+base)+" 8192")
	e.must("resume", top)
	if got := e.must("table", top); got != "0 16384 linear "+e.devNo(base)+" 8192\n" {
		t.Errorf("table after a load through the loop device's number: %q", got)
	}
	data := bytes.Repeat([]byte("stacked!"), 512)
	f, err := os.OpenFile("/dev/mapper/"+top, os.O_WRONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(len(data))
	copy(buf, data)
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	g, err := os.OpenFile("/dev/mapper/"+base, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	back := alignedBuf(len(data))
	_, err = g.ReadAt(back, 8192*512)
	g.Close()
	if err != nil || !bytes.Equal(back, data) {
		t.Errorf("the lower device does not read what the upper wrote: %v", err)
	}
	// A new size reaches the block device on resume.
	e.must("load", top, "--table", "0 24576 linear /dev/mapper/"+base+" 8192")
	if got := strings.TrimSpace(run(t, "blockdev", "--getsz", "/dev/mapper/"+top)); got != "16384" {
		t.Errorf("size after load, before resume: %s sectors", got)
	}
	e.must("resume", top)
	if got := strings.TrimSpace(run(t, "blockdev", "--getsz", "/dev/mapper/"+top)); got != "24576" {
		t.Errorf("size after resume: %s sectors, want 24576", got)
	}
	if _, errs, code := e.dmsetup("", "remove", base); code != 1 ||
		errs != "device-mapper: remove ioctl on "+base+"  failed: Device or resource busy\nCommand failed.\n" {
		t.Errorf("remove of the lower device: exit %d, %q", code, errs)
	}
	e.must("remove", top, base)
}

// TestDmsetupSuspendLockFS: a plain suspend freezes the mounted file system
// (its dirty data reaches the device first, new writes wait for resume);
// with --nolockfs writes go on, and their I/O waits for resume.
func TestDmsetupSuspendLockFS(t *testing.T) {
	e := newDmsetupEnv(t)
	img := filepath.Join(e.dir, "lockfs.img")
	sparseFile(t, img, 64<<20)
	dev := strings.TrimSpace(run(t, "losetup", "-f", "--show", img))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	name := e.name("lockfs")
	node := "/dev/mapper/" + name
	e.must("create", name, "--table", "0 131072 linear "+dev+" 0")
	run(t, "mkfs.ext4", "-q", node)
	mnt := e.mountDev(node, "lockfs-mnt")
	onDisk := func(marker string) bool {
		t.Helper()
		b, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Contains(b, []byte(marker))
	}

	marker1 := "lockfs-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	writeFile(t, filepath.Join(mnt, "a"), marker1, false)
	e.must("suspend", name)
	if !onDisk(marker1) {
		t.Error("after a plain suspend, data written before it is not on the device")
	}
	if got := e.must("info", "-c", "--noheadings", "-o", "attr", name); got != "L-sw\n" {
		t.Errorf("attr while suspended: %q", got)
	}
	done := make(chan error, 1)
	go func() {
		f, err := os.Create(filepath.Join(mnt, "frozen"))
		if err == nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a file was created on a frozen file system (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	e.must("resume", name)
	if err := <-done; err != nil {
		t.Fatalf("create after resume: %v", err)
	}

	// With --nolockfs the file system is not frozen: a write completes
	// while the device is suspended, and its data cannot reach the device
	// (nor can anyone else's sync write it) before resume. Whether data
	// dirty before the suspend was written back is not checked: any
	// process's sync(1) may have done it.
	marker2 := "nolockfs-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	b, err := os.Create(filepath.Join(mnt, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	e.must("suspend", "--nolockfs", name)
	wrote := make(chan error, 1)
	go func() { _, err := b.WriteAt([]byte(marker2), 0); wrote <- err }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("write after suspend --nolockfs: %v", err)
		}
	case <-time.After(commandTimeout):
		t.Fatal("a write blocked after suspend --nolockfs: the file system was frozen")
	}
	synced := make(chan error, 1)
	go func() { synced <- exec.Command("sync", "-f", mnt).Run() }()
	select {
	case err := <-synced:
		t.Fatalf("syncfs completed on a suspended device (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	if onDisk(marker2) {
		t.Error("data written while suspended reached the device")
	}
	e.must("resume", name)
	if err := <-synced; err != nil {
		t.Fatalf("syncfs after resume: %v", err)
	}
	if !onDisk(marker2) {
		t.Error("data not on the device after resume and syncfs")
	}
}

// TestDmsetupRemoveMounted: a mounted device cannot be removed (dm's
// EBUSY), --deferred flags it, and it goes, node and loop device with it,
// when the file system is unmounted.
func TestDmsetupRemoveMounted(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("rm", 64<<20)
	name := e.name("busy")
	node := "/dev/mapper/" + name
	e.must("create", name, "--table", "0 131072 linear "+dev+" 0")
	run(t, "mkfs.ext4", "-q", node)
	mnt := e.mountDev(node, "rm-mnt")
	if got := e.must("info", "-c", "--noheadings", "-o", "open", name); got != "1\n" {
		t.Errorf("open count of a mounted device: %q", got)
	}
	if _, errs, code := e.dmsetup("", "remove", name); code != 1 ||
		errs != "device-mapper: remove ioctl on "+name+"  failed: Device or resource busy\nCommand failed.\n" {
		t.Errorf("remove of a mounted device: exit %d, %q", code, errs)
	}
	e.must("remove", "--deferred", name)
	if got := e.must("info", name); !strings.Contains(got, "State:             ACTIVE (DEFERRED REMOVE)\n") {
		t.Errorf("info after remove --deferred:\n%s", got)
	}
	if _, err := os.Stat(node); err != nil {
		t.Errorf("the node went before the device: %v", err)
	}
	loops := loopsOf(filepath.Join(e.run, "mnt"))
	run(t, "umount", mnt)
	waitGone(t, node)
	if out, _, _ := e.dmsetup("", "ls"); out != "No devices found\n" {
		t.Errorf("ls after the deferred removal: %q", out)
	}
	for deadline := time.Now().Add(5 * time.Second); len(loopsOf(filepath.Join(e.run, "mnt"))) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices %v still attached", loops)
		}
	}
}

// TestDmsetupSelfReference is blktests dm/001: a reload of a suspended
// device with a table that maps to itself (through its node) fails, and the
// suspended device, open by nobody, is removed without a word.
func TestDmsetupSelfReference(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("self", 8<<20)
	out := e.mustSh(fmt.Sprintf(`TEST_DEV=%s
test=%s
dmsetup create $test --table "0 8192 linear ${TEST_DEV} 0"
dmsetup suspend $test
if dmsetup reload $test --table "0 8192 linear /dev/mapper/$test 0" &> /dev/null; then
	echo "reload a dm with maps to itself succeed."
fi
dmsetup remove $test
[ ! -e /dev/mapper/$test ] || echo "node left"`, dev, e.name("test")))
	if out != "" {
		t.Errorf("dm/001 printed:\n%s", out)
	}
}

// TestDmsetupConcurrentStart: commands racing to start the daemon start
// one, and every one succeeds.
func TestDmsetupConcurrentStart(t *testing.T) {
	e := newDmsetupEnv(t)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if out, stderr, code := e.dmsetup("", "create", e.name(fmt.Sprintf("c%d", i)), "--table", "0 8 zero"); code != 0 {
				errs <- fmt.Sprintf("create %d: exit %d: %s%s", i, code, out, stderr)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	log, err := os.ReadFile(filepath.Join(e.run, "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "dmfuse: serving "); n != 1 {
		t.Errorf("%d daemons started:\n%s", n, log)
	}
	if got := strings.Count(e.must("ls"), e.name("c")); got != 6 {
		t.Errorf("%d devices listed, want 6", got)
	}
	e.must("remove_all")
}

// TestDmsetupDaemonDies: a daemon killed while a file system is mounted on
// one of its devices is cleaned up by the next command, which says so;
// the one after starts a new daemon.
func TestDmsetupDaemonDies(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("crash", 64<<20)
	crash := e.name("crash")
	e.must("create", crash, "--table", "0 131072 linear "+dev+" 0")
	run(t, "mkfs.ext4", "-q", "/dev/mapper/"+crash)
	mnt := e.mountDev("/dev/mapper/"+crash, "crash-mnt")
	pid := e.pid()
	if pid == 0 {
		t.Fatal("no daemon pid")
	}
	// A command in flight when the daemon dies fails cleanly: wait until
	// the daemon holds one more socket (the waiting command's), then kill.
	sockets := func() int {
		n := 0
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); strings.HasPrefix(l, "socket:") {
				n++
			}
		}
		return n
	}
	before := sockets()
	waiting := make(chan string, 1)
	go func() {
		out, errs, code := e.dmsetup("", "wait", crash)
		waiting <- fmt.Sprintf("exit %d: %s%s", code, out, errs)
	}()
	for deadline := time.Now().Add(10 * time.Second); sockets() <= before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiting command did not connect")
		}
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if got := <-waiting; !strings.HasPrefix(got, "exit 1: dmfuse: ") || !strings.HasSuffix(got, "\nCommand failed.\n") {
		t.Errorf("wait on a daemon that died: %q", got)
	}
	for deadline := time.Now().Add(5 * time.Second); unix.Kill(pid, 0) == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed daemon is still there")
		}
	}
	out, errs, code := e.dmsetup("", "ls")
	if code != 0 || out != "No devices found\n" || !strings.Contains(errs, "died; cleaned up:") {
		t.Errorf("first command after the daemon died: exit %d, %q, %q", code, out, errs)
	}
	if export.Mounted(mnt) || export.Mounted(filepath.Join(e.run, "mnt")) {
		t.Error("a mount of the dead daemon is left")
	}
	if l := loopsOf(filepath.Join(e.run, "mnt")); len(l) > 0 {
		t.Errorf("loop devices of the dead daemon left: %v", l)
	}
	if _, err := os.Lstat("/dev/mapper/" + crash); err == nil {
		t.Error("the node of the dead daemon's device is left")
	}
	e.must("create", e.name("after"), "--table", "0 8 zero")
	if e.pid() == pid || e.pid() == 0 {
		t.Errorf("no new daemon (pid %d, before %d)", e.pid(), pid)
	}
	e.must("remove", e.name("after"))
}

// TestDmsetupBadInput: unknown verbs and options, missing arguments and
// names the kernel's device-mapper refuses get dmsetup's lines and exit 1
// and start no daemon; a name of dm's 127-byte limit works; a caller who
// is not root gets one line.
func TestDmsetupBadInput(t *testing.T) {
	e := newDmsetupEnv(t)
	const failed = "Command failed.\n"
	long := e.name(strings.Repeat("n", 128-len(e.prefix)))
	for _, c := range []struct {
		args   []string
		stderr string // exact, or the start of it when usage follows
		usage  bool
	}{
		{[]string{"frobnicate"}, "Unknown command.\n", true},
		{[]string{}, "", true},
		{[]string{"message", "x"}, "Incorrect number of arguments.\n", true},
		{[]string{"create", "a", "b", "c"}, "Incorrect number of arguments.\n", true},
		{[]string{"--bogus", "info"}, "dmsetup: unrecognized option '--bogus'\nCouldn't process command line.\n", false},
		{[]string{"-x", "info"}, "dmsetup: invalid option -- 'x'\nCouldn't process command line.\n", false},
		{[]string{"--ta", "0 8 zero", "create", "x"}, "dmsetup: option '--ta' is ambiguous; possibilities: '--table' '--target'\nCouldn't process command line.\n", false},
		{[]string{"create", "x", "--table"}, "dmsetup: option '--table' requires an argument\nCouldn't process command line.\n", false},
		{[]string{"-j", "253", "info"}, "Please specify both major number and minor number.\nCouldn't process command line.\n", false},
		{[]string{"create"}, "Please provide a name for the new device.\n" + failed, false},
		{[]string{"create", e.name("sl/ash"), "--table", "0 8 zero"}, "Name \"" + e.name("sl/ash") + "\" invalid. It contains \"/\".\n" + failed, false},
		{[]string{"create", long, "--table", "0 8 zero"}, "Name \"" + long + "\" too long.\n" + failed, false},
	} {
		out, errs, code := e.dmsetup("", c.args...)
		what := "dmsetup " + strings.Join(c.args, " ")
		if code != 1 || out != "" {
			t.Errorf("%s: exit %d, stdout %q", what, code, out)
		}
		switch {
		case c.usage:
			if !strings.HasPrefix(errs, c.stderr+"Usage:\n\ndmsetup") {
				t.Errorf("%s: stderr %q, want %q and the usage", what, errs, c.stderr)
			}
		case c.stderr != "" && errs != c.stderr:
			t.Errorf("%s: stderr %q, want %q", what, errs, c.stderr)
		}
	}
	if e.pid() != 0 {
		t.Error("a refused command started the daemon")
	}
	// A table the daemon refuses leaves no device.
	if _, errs, _ := e.dmsetup("", "create", e.name("bad"), "--table", "0 8 nosuchtarget"); !strings.HasPrefix(errs, "device-mapper: reload ioctl on "+e.name("bad")+" (") {
		t.Errorf("a table with an unknown target: %q", errs)
	}
	if got := e.must("ls"); got != "No devices found\n" {
		t.Errorf("ls after the refused commands: %q", got)
	}

	name := long[:127]
	e.must("create", name, "--table", "0 8 zero")
	if got := strings.TrimSpace(run(t, "blockdev", "--getsz", "/dev/mapper/"+name)); got != "8" {
		t.Errorf("a 127-byte name: %s sectors", got)
	}
	e.must("remove", name)
	waitGone(t, "/dev/mapper/"+name)

	// Not root: a copy of dmfuse that nobody may run, as dmsetup.
	dir, err := os.MkdirTemp("", "dmfuse-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin, err := os.ReadFile(dmfuseBin)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "dmfuse"), bin, 0o755)
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err == nil {
		err = os.Symlink("dmfuse", filepath.Join(dir, "dmsetup"))
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"create", e.name("x"), "--table", "0 8 zero"}, {"ls"}, {"remove_all"}} {
		cmd := exec.Command(filepath.Join(dir, "dmsetup"), args...)
		cmd.Env, cmd.Dir = e.env, "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || out.Len() != 0 ||
			errb.String() != "dmsetup: permission denied: managing dmfuse devices needs root.\n" {
			t.Errorf("dmsetup %s as nobody: %v, %q, %q", strings.Join(args, " "), err, out.String(), errb.String())
		}
	}
	if pid := e.pid(); pid == 0 {
		t.Error("no daemon after the create")
	}
}

// TestDmsetupDaemonHoldsNoCallerFD: the daemon a command starts keeps none
// of the caller's descriptors beyond its standard streams. A lock passed
// down as flock(1) passes it is free once the command returns, and a pipe
// passed down reads EOF.
func TestDmsetupDaemonHoldsNoCallerFD(t *testing.T) {
	e := newDmsetupEnv(t)
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	lockPath := filepath.Join(e.dir, "caller.lock")
	lock, err := os.Create(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e.dir, "bin", "dmsetup"), "create", e.name("z"), "--table", "0 8 zero")
	cmd.Env, cmd.Dir = e.env, e.dir
	cmd.ExtraFiles = []*os.File{wr, lock}
	out, err := cmd.CombinedOutput()
	wr.Close()
	lock.Close()
	if err != nil {
		t.Fatalf("dmsetup create: %v\n%s", err, out)
	}
	if e.pid() == 0 {
		t.Fatal("no daemon started")
	}
	rd.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if n, err := rd.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Errorf("the caller's pipe: read %d, %v; want EOF (the daemon holds its write end)", n, err)
	}
	again, err := os.Open(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := unix.Flock(int(again.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("the caller's lock is still held after the command returned: %v", err)
	}
	e.must("remove", e.name("z"))
}
