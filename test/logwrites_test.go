package test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/fs/export"
	"github.com/dmfuse/dmfuse/logwrites"
)

// lwMemDir returns a new folder on tmpfs when there is one (logs and
// images cost no disk there), else under t.TempDir.
func lwMemDir(t *testing.T) string {
	if dir, err := os.MkdirTemp("/dev/shm", "dmfuse-logwrites-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

// replayLog runs `dmfuse replay-log` (or, with name "replay-log", the
// binary through a link of that name) in dir and returns stdout, stderr and
// the exit status.
func replayLog(t *testing.T, dir, name string, args ...string) (string, string, int) {
	t.Helper()
	bin, argv := dmfuseBin, append([]string{"replay-log"}, args...)
	if name == "replay-log" {
		bin = filepath.Join(dir, "replay-log")
		if _, err := os.Lstat(bin); err != nil {
			if err := os.Symlink(dmfuseBin, bin); err != nil {
				t.Fatal(err)
			}
		}
		argv = args
	}
	cmd := exec.Command(bin, argv...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s %q: %v", bin, argv, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// mustReplayLog runs replay-log and fails the test unless it exits 0.
func mustReplayLog(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	out, errs, code := replayLog(t, dir, name, args...)
	if code != 0 {
		t.Fatalf("%s %q: exit %d\n%s%s", name, args, code, out, errs)
	}
	return out
}

// lwStatus returns the status numbers of a log-writes device (its status
// waits for the worker to log what was queued before it).
func lwStatus(t *testing.T, d *daemon, name string) string {
	t.Helper()
	f := strings.Fields(d.must("status", name))
	return strings.Join(f[3:], " ")
}

// TestLogWritesMountRoundTrip records writes, discards, zeroing and flushes
// made through a mounted log-writes device, with a mark after each round,
// and replays the log up to each mark with `dmfuse replay-log` or the binary
// under the name replay-log, onto a file, a dmfuse device file or a loop
// device: the result is the device as it was at the mark. A log device too
// small for the log stops logging as the kernel's does, and a torn log is
// refused.
func TestLogWritesMountRoundTrip(t *testing.T) {
	requireTool(t, "losetup", "blockdev")
	dir := lwMemDir(t)
	const size = 8 << 20
	for _, f := range []struct {
		name string
		size int64
	}{{"data.img", size}, {"log.img", 64 << 20}, {"r.img", size}, {"r2.img", size}, {"r3.img", size}, {"d2.img", 1 << 20}, {"l2.img", 64 << 10}} {
		sparseFile(t, filepath.Join(dir, f.name), f.size)
	}
	d := startDaemon(t, dir, fmt.Sprintf("lw,,,rw,0 %d log-writes ./data.img ./log.img;\nrep,,,rw,0 %d linear ./r2.img 0;\nfull,,,rw,0 2048 log-writes ./d2.img ./l2.img;", size/512, size/512))
	if st := lwStatus(t, d, "lw"); st != "0 0" {
		t.Errorf("fresh status %q, want \"0 0\"", st)
	}
	if got := strings.TrimSpace(d.must("table", "lw")); got != fmt.Sprintf("0 %d log-writes %s %s", size/512, filepath.Join(dir, "data.img"), filepath.Join(dir, "log.img")) {
		t.Errorf("table %q", got)
	}
	dev := openDirect(t, d.path("lw"))
	defer dev.Close()
	r := rand.New(rand.NewPCG(42, 1))
	buf := alignedBuf(256 << 10)
	snaps := map[string][]byte{}
	var marks []string
	for round := range 6 {
		for range 40 {
			off := r.Int64N(size/4096-64) * 4096
			n := (1 + r.IntN(64)) * 4096
			switch r.IntN(10) {
			case 0:
				if err := unix.Fallocate(int(dev.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n)); err != nil {
					t.Fatal(err)
				}
			case 1:
				if err := unix.Fallocate(int(dev.Fd()), unix.FALLOC_FL_ZERO_RANGE, off, int64(n)); err != nil {
					t.Fatal(err)
				}
			case 2:
				if err := dev.Sync(); err != nil {
					t.Fatal(err)
				}
			default:
				for i := range buf[:n] {
					buf[i] = byte(r.Uint32())
				}
				if _, err := dev.WriteAt(buf[:n], off); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := dev.Sync(); err != nil {
			t.Fatal(err)
		}
		snap := make([]byte, size)
		if _, err := dev.ReadAt(snap, 0); err != nil {
			t.Fatal(err)
		}
		name := "round" + strconv.Itoa(round)
		snaps[name] = snap
		marks = append(marks, name)
		d.must("message", "lw", "0", "mark", name)
	}
	st := lwStatus(t, d, "lw")
	dev.Close()
	lwRemove(t, d, "lw")

	// The super counts every entry once the device is gone: what status
	// showed, plus the end mark.
	var entries, next uint64
	fmt.Sscanf(st, "%d %d", &entries, &next)
	if out := mustReplayLog(t, dir, "dmfuse", "--log", "log.img", "--num-entries"); out != fmt.Sprintf("%d\n", entries+1) {
		t.Errorf("--num-entries %q after status %q", out, st)
	}
	if out := mustReplayLog(t, dir, "dmfuse", "--log", "log.img", "--find", "--end-mark", logwrites.EndMark); !strings.HasPrefix(out, strconv.FormatUint(entries, 10)+"@") {
		t.Errorf("end mark at %q, want entry %d", out, entries)
	}
	// Replay onto a file, through the binary named replay-log, onto a
	// dmfuse device file, and onto a loop device (which takes BLKDISCARD).
	loop := strings.TrimSpace(run(t, "losetup", "-f", "--show", filepath.Join(dir, "r3.img")))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	for i, m := range marks {
		target, via, file := "r.img", "dmfuse", "r.img"
		switch i % 4 {
		case 1:
			via = "replay-log"
		case 2:
			target, file = d.path("rep"), "r2.img"
		case 3:
			target, file = loop, "r3.img"
		}
		for _, f := range []string{"r.img", "r2.img", "r3.img"} {
			// Rewritten in place: the daemon and the loop device keep them open.
			if err := os.WriteFile(filepath.Join(dir, f), make([]byte, size), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if i%4 == 3 {
			run(t, "blockdev", "--flushbufs", loop)
		}
		mustReplayLog(t, dir, via, "--log", "log.img", "--replay", target, "--end-mark", m)
		got, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, snaps[m]) {
			t.Errorf("replay to %s (%s onto %s) differs from the device at that mark from byte %d", m, via, target, firstDiff(got, snaps[m]))
		}
	}

	// A torn log: cut inside the data of the last write entry.
	log, err := os.ReadFile(filepath.Join(dir, "log.img"))
	if err != nil {
		t.Fatal(err)
	}
	rd, err := logwrites.Open(bytes.NewReader(log), int64(len(log)), 0)
	if err != nil {
		t.Fatal(err)
	}
	var lastData int64
	for rd.More() {
		e, err := rd.Next(512)
		if err != nil {
			t.Fatal(err)
		}
		if e.HasData() {
			lastData = rd.Pos()
		}
		if err := rd.SkipData(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "torn.img"), log[:lastData+100], 0o644); err != nil {
		t.Fatal(err)
	}
	// (--no-discard: a discard on a regular file leaves ENOTTY in errno,
	// which replay-log, and so dmfuse, then prints instead of 0.)
	if _, errs, code := replayLog(t, dir, "dmfuse", "--log", "torn.img", "--replay", "r.img", "--no-discard"); code != 1 || errs != "Error reading data: 0\n" {
		t.Errorf("torn log: exit %d, stderr %q", code, errs)
	}

	// A log device of 128 sectors: a 60 KiB write and its flush fit (the
	// next entry would start at sector 123); the next 4 KiB write would end
	// at 132, so logging stops there, and the device keeps working.
	full := openDirect(t, d.path("full"))
	defer full.Close()
	for _, w := range []struct{ off, n int64 }{{0, 60 << 10}, {64 << 10, 4096}} {
		if _, err := full.WriteAt(buf[:w.n], w.off); err != nil {
			t.Fatal(err)
		}
		if err := full.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if st := lwStatus(t, d, "full"); st != "2 131 logging_disabled" {
		t.Errorf("full log device: status %q, want \"2 131 logging_disabled\"", st)
	}
	got := make([]byte, 4096)
	if _, err := full.ReadAt(got, 64<<10); err != nil || !bytes.Equal(got, buf[:4096]) {
		t.Errorf("a write after logging stopped did not reach the data device: %v", err)
	}
	full.Close()
	lwRemove(t, d, "full")
	if _, errs, code := replayLog(t, dir, "replay-log", "--log", "l2.img"); code != 1 || errs != "Magic doesn't match\n" {
		t.Errorf("a log whose super was never written: exit %d, stderr %q", code, errs)
	}
}

// lwRemove removes a device once the last close of its file has reached
// the daemon (FUSE sends RELEASE after close returns); the removal
// completes the log.
func lwRemove(t *testing.T, d *daemon, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, errs, code := d.dmfuse("/", "", "remove", name)
		if code == 0 {
			return
		}
		if !strings.Contains(errs, "device is open") || time.Now().After(deadline) {
			t.Fatalf("dmfuse remove %s: exit %d: %s", name, code, errs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// lwCheckScript checks a replayed ext4 image as generic/482 does after a
// mount: on a copy (the replay target must stay as the log left it), the
// journal is recovered, then `e2fsck -fn` must find the file system clean.
const lwCheckScript = `#!/bin/sh
img=${1:-$DMFUSE_REPLAY_TARGET}
cp --sparse=always "$img" "$img.chk" || exit 9
e2fsck -E journal_only -p "$img.chk" >/dev/null 2>&1
e2fsck -fn "$img.chk"
`

// ext4Workload creates, appends to, overwrites, renames over and deletes
// files and folders under root, making each step durable with fsync (of the
// file, and of its folder after a rename or a delete), as applications that
// care about crashes do.
func ext4Workload(t *testing.T, root string, ops int) {
	r := rand.New(rand.NewPCG(482, 1))
	fill := rand.NewChaCha8([32]byte{4, 8, 2})
	fsync := func(path string) { syncPath(t, path) }
	data := func(max int) []byte {
		b := make([]byte, 1+r.IntN(max))
		fill.Read(b)
		return b
	}
	write := func(path string, b []byte, flags int) {
		f, err := os.OpenFile(path, flags, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	var files []string
	dirs := []string{root}
	for i := range ops {
		dir := dirs[r.IntN(len(dirs))]
		switch op := r.IntN(7); {
		case op == 0 || len(files) == 0:
			p := filepath.Join(dir, "f"+strconv.Itoa(i))
			write(p, data(96<<10), os.O_CREATE|os.O_WRONLY)
			fsync(dir)
			files = append(files, p)
		case op == 1: // replace a file atomically
			dst := files[r.IntN(len(files))]
			tmp := dst + ".tmp"
			write(tmp, data(96<<10), os.O_CREATE|os.O_WRONLY|os.O_TRUNC)
			if err := os.Rename(tmp, dst); err != nil {
				t.Fatal(err)
			}
			fsync(filepath.Dir(dst))
		case op == 2:
			write(files[r.IntN(len(files))], data(96<<10), os.O_WRONLY|os.O_APPEND)
		case op == 3:
			k := r.IntN(len(files))
			if err := os.Remove(files[k]); err != nil {
				t.Fatal(err)
			}
			fsync(filepath.Dir(files[k]))
			files = append(files[:k], files[k+1:]...)
		case op == 4:
			p := filepath.Join(dir, "d"+strconv.Itoa(i))
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			fsync(dir)
			dirs = append(dirs, p)
		case op == 5: // move a file to another folder
			k := r.IntN(len(files))
			dst := filepath.Join(dirs[r.IntN(len(dirs))], "m"+strconv.Itoa(i))
			if err := os.Rename(files[k], dst); err != nil {
				t.Fatal(err)
			}
			fsync(filepath.Dir(files[k]))
			fsync(filepath.Dir(dst))
			files[k] = dst
		default: // overwrite inside a file
			f, err := os.OpenFile(files[r.IntN(len(files))], os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(data(8192), int64(r.IntN(16384))); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
}

// TestLogWritesGeneric482 is xfstests' generic/482 on a dmfuse log-writes
// device: mkfs.ext4, a mark, a workload of fsyncs and renames, unmount,
// remove; then the file system is checked at every crash point after the
// mark, once with `replay-log --each` (one pass) and once with replay-log
// driven as common/dmlogwrites drives it (find the next point, replay the
// log from entry 0 up to it, check). The whole log replayed is the data
// device.
//
// The crash points are the FUA entries when the loop device passes FUA
// down. This kernel's loop driver does not (queue/fua is 0): the block
// layer turns each FUA write into a write followed by a flush, which FUSE
// delivers as a write and an fsync. The file system's FUA points are then
// the FLUSH entries after its commit writes, so the test checks at every
// FLUSH entry, which includes them.
func TestLogWritesGeneric482(t *testing.T) {
	requireTool(t, "losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "cp")
	dir := lwMemDir(t)
	const size = 64 << 20
	sparseFile(t, filepath.Join(dir, "data.img"), size)
	sparseFile(t, filepath.Join(dir, "log.img"), 512<<20)
	d := startDaemon(t, dir, fmt.Sprintf("lw,,,rw,0 %d log-writes ./data.img ./log.img;", size/512))
	loop := strings.TrimSpace(run(t, "losetup", "--direct-io=on", "-f", "--show", d.path("lw")))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	kind := "fua"
	if b, err := os.ReadFile("/sys/block/" + filepath.Base(loop) + "/queue/fua"); err == nil && strings.TrimSpace(string(b)) == "0" {
		kind = "flush"
	}
	run(t, "mkfs.ext4", "-q", "-F", "-b", "4096", loop)
	d.must("message", "lw", "0", "mark", "mkfs")
	fsdir := filepath.Join(dir, "fs")
	if err := os.Mkdir(fsdir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", loop, fsdir)
	t.Cleanup(func() {
		if export.Mounted(fsdir) {
			unix.Unmount(fsdir, unix.MNT_DETACH)
		}
	})
	ext4Workload(t, fsdir, 30)
	run(t, "umount", fsdir)
	run(t, "losetup", "-d", loop)
	lwRemove(t, d, "lw")
	if err := os.WriteFile(filepath.Join(dir, "check.sh"), []byte(lwCheckScript), 0o755); err != nil {
		t.Fatal(err)
	}

	// One pass: every point checked as the replay goes.
	sparseFile(t, filepath.Join(dir, "r.img"), size)
	out := mustReplayLog(t, dir, "dmfuse", "--log", "log.img", "--replay", "r.img", "--each", kind, "--each-from", "mkfs", "--fsck", "./check.sh")
	var points int
	if _, err := fmt.Sscanf(out[strings.LastIndex(out, "\nall ")+1:], "all %d", &points); err != nil || points < 20 {
		t.Fatalf("--each: %d %s points checked (want at least 20):\n%s", points, kind, out)
	}
	t.Logf("%s", out[strings.LastIndex(out[:len(out)-1], "\n")+1:])
	replayed, err := os.ReadFile(filepath.Join(dir, "r.img"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "data.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(replayed, data) {
		t.Errorf("the whole log replayed differs from the data device from byte %d", firstDiff(replayed, data))
	}

	// The check can fail: replaying only what follows the mark, without
	// mkfs's writes, leaves no file system, and --each stops at the first
	// point with the entry and a command that reproduces it.
	sparseFile(t, filepath.Join(dir, "bad.img"), size)
	out, _, code := replayLog(t, dir, "dmfuse", "--log", "log.img", "--replay", "bad.img", "--start-mark", "mkfs", "--each", kind, "--fsck", "./check.sh")
	if code != 1 || !strings.Contains(out, "point 1: entry ") || !strings.Contains(out, "FAILED") || !strings.Contains(out, "--start-mark mkfs --limit ") {
		t.Errorf("--each on a replay without mkfs: exit %d\n%s", code, out)
	}

	// The same points as common/dmlogwrites walks them, with the binary
	// under the name replay-log: each round replays from entry 0.
	sparseFile(t, filepath.Join(dir, "r2.img"), size)
	entryOf := func(args ...string) string {
		out, _, code := replayLog(t, dir, "replay-log", args...)
		if code != 0 {
			return ""
		}
		return strings.SplitN(out, "@", 2)[0]
	}
	prev := entryOf("--find", "--log", "log.img", "--end-mark", "mkfs")
	if prev == "" {
		t.Fatal("mark mkfs not in the log")
	}
	cur := entryOf("--find", "--log", "log.img", "--next-"+kind, "--start-entry", prev)
	n := 0
	for cur != "" {
		c, _ := strconv.Atoi(cur)
		mustReplayLog(t, dir, "replay-log", "-vv", "--log", "log.img", "--replay", "r2.img", "--limit", strconv.Itoa(c+1))
		if out, err := exec.Command(filepath.Join(dir, "check.sh"), filepath.Join(dir, "r2.img")).CombinedOutput(); err != nil {
			t.Fatalf("file system inconsistent after entry %s: %v\n%s", cur, err, out)
		}
		n++
		cur = entryOf("--find", "--log", "log.img", "--next-"+kind, "--start-entry", strconv.Itoa(c+1))
	}
	if n != points {
		t.Errorf("the replay-log loop checked %d points, --each %d", n, points)
	}
}

// TestLogWritesFUA: writes that must be durable (a device file opened with
// O_DSYNC, pwritev2 with RWF_DSYNC) reach the target as FUA writes and are
// logged at once, ahead of an earlier plain write that no flush covered,
// with the super rewritten after each; replay-log sees them while the device
// is still live, and --each fua checks at each.
func TestLogWritesFUA(t *testing.T) {
	dir := lwMemDir(t)
	sparseFile(t, filepath.Join(dir, "data.img"), 1<<20)
	sparseFile(t, filepath.Join(dir, "log.img"), 1<<20)
	sparseFile(t, filepath.Join(dir, "r.img"), 1<<20)
	d := startDaemon(t, dir, "lw,,,rw,0 2048 log-writes ./data.img ./log.img;")
	plain := openDirect(t, d.path("lw"))
	defer plain.Close()
	dsync, err := os.OpenFile(d.path("lw"), os.O_RDWR|unix.O_DSYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dsync.Close()
	buf := alignedBuf(4096)
	for i := range buf {
		buf[i] = 0x11
	}
	if _, err := plain.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if st := lwStatus(t, d, "lw"); st != "0 0" {
		t.Errorf("after a plain write: status %q, want \"0 0\"", st)
	}
	for i := range buf {
		buf[i] = 0x22
	}
	if _, err := dsync.WriteAt(buf, 4096); err != nil {
		t.Fatal(err)
	}
	if st := lwStatus(t, d, "lw"); st != "1 9" {
		t.Errorf("after an O_DSYNC write: status %q, want \"1 9\"", st)
	}
	for i := range buf {
		buf[i] = 0x33
	}
	if _, err := unix.Pwritev2(int(plain.Fd()), [][]byte{buf}, 8192, unix.RWF_DSYNC); err != nil {
		t.Fatal(err)
	}
	if st := lwStatus(t, d, "lw"); st != "2 18" {
		t.Errorf("after an RWF_DSYNC write: status %q, want \"2 18\"", st)
	}
	// The super counts the FUA entries while the device is live.
	if out := mustReplayLog(t, dir, "replay-log", "--log", "log.img", "--num-entries"); out != "2\n" {
		t.Errorf("--num-entries on the live log: %q, want 2", out)
	}
	plain.Close()
	dsync.Close()
	lwRemove(t, d, "lw")
	want := "replaying 0@2: sector 8, size 4096, flags 0x2(FUA)\n" +
		"replaying 1@11: sector 16, size 4096, flags 0x2(FUA)\n" +
		"replaying 2@20: sector 0, size 4096, flags 0x0(NONE)\n" +
		"replaying 3@29: sector 0, size 0, flags 0x8(MARK)\n"
	if out := mustReplayLog(t, dir, "dmfuse", "-v", "--log", "log.img", "--replay", "r.img"); out != want {
		t.Errorf("replay -v:\n%s\nwant:\n%s", out, want)
	}
	// At FUA point k (entry k), block k+1 holds what that write wrote.
	sparseFile(t, filepath.Join(dir, "r.img"), 1<<20)
	out := mustReplayLog(t, dir, "dmfuse", "--log", "log.img", "--replay", "r.img", "--each", "fua", "--fsck",
		`b=$((4096 * (DMFUSE_REPLAY_ENTRY + 1))); cmp -n 4096 -i $b:$b "$DMFUSE_REPLAY_TARGET" data.img`)
	if !strings.Contains(out, "all 2 fua points clean") {
		t.Errorf("--each fua:\n%s", out)
	}
}
