package test

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/dmfuse/dmfuse/fs/export"
	"golang.org/x/sys/unix"
)

// uringParam is the fuse module parameter that lets the kernel offer io_uring.
const uringParam = "/sys/module/fuse/parameters/enable_uring"

// requireURing skips unless the kernel offers FUSE over io_uring now.
func requireURing(t *testing.T) {
	t.Helper()
	requireFUSE(t)
	b, err := os.ReadFile(uringParam)
	if err != nil || strings.TrimSpace(string(b)) != "Y" {
		t.Skipf("FUSE over io_uring is not switched on (%s)", uringParam)
	}
}

// checkIO writes and reads back through a device file with O_DIRECT-sized
// requests and a fsync.
func checkIO(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := []byte(strings.Repeat("dmfuse-uring ", 400))
	if _, err := f.WriteAt(want, 12345); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 12345); err != nil || string(got) != string(want) {
		t.Fatalf("read back %q..., %v", got[:20], err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 12288, 4096); err != nil {
		t.Fatalf("punch hole: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatalf("statfs: %v", err)
	}
	ents, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(ents) < 2 {
		t.Fatalf("readdir: %v %v", ents, err)
	}
}

func TestURingTransport(t *testing.T) {
	requireURing(t)
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 16384 linear ./a.img 0;", "--transport", "uring", "--uring-depth", "4")
	mustLog(t, d, "transport io_uring")
	checkIO(t, d.path("lin"))
	// More requests in flight than a queue has entries.
	requireTool(t, "fio")
	run(t, "fio", "--name=q", "--filename="+d.path("lin"), "--direct=1", "--bs=4k", "--rw=randwrite",
		"--ioengine=io_uring", "--iodepth=32", "--numjobs=2", "--size=4m", "--offset_increment=4m", "--verify=crc32c", "--do_verify=1", "--verify_state_save=0")
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
	if export.Mounted(d.mnt) {
		t.Error("still mounted after SIGTERM")
	}
}

func TestURingExternalUnmountAndKill(t *testing.T) {
	requireURing(t)
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	conf := "lin,,,rw,0 16384 linear ./a.img 0;"
	d := startDaemon(t, dir, conf, "--transport", "uring")
	if err := unix.Unmount(d.mnt, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.stop(syscall.Signal(0)); err != nil {
		t.Fatalf("daemon did not exit after umount: %v", err)
	}
	d = startDaemon(t, dir, conf, "--transport", "uring")
	d.cmd.Process.Kill()
	<-d.done
	d.done <- nil
	// Requests that race the kernel's teardown of the rings (it runs after
	// the process is gone) fail with ECONNABORTED or ECANCELED; after it,
	// the dead mount answers ENOTCONN.
	_, err := os.Stat(d.path("lin"))
	if !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) && !errors.Is(err, syscall.ECANCELED) {
		t.Fatalf("after kill: %v", err)
	}
	d2 := startDaemon(t, dir, conf, "--transport", "uring")
	if !strings.Contains(d2.stderr.String(), "stale mount") {
		t.Errorf("no message about the stale mount: %s", d2.stderr)
	}
	checkIO(t, d2.path("lin"))
}

func TestURingRegistrationFallback(t *testing.T) {
	requireURing(t)
	t.Setenv("DMFUSE_URING_PAYLOAD", "4096") // smaller than the kernel accepts
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 16384 linear ./a.img 0;", "--transport", "auto")
	mustLog(t, d, "registration failed, falling back")
	checkIO(t, d.path("lin"))
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if export.Mounted(d.mnt) {
		t.Error("still mounted after SIGTERM")
	}
}

func TestTransportDevAndUnavailable(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 16384 linear ./a.img 0;", "--transport", "dev")
	mustLog(t, d, "transport /dev/fuse")
	checkIO(t, d.path("lin"))
	b, err := os.ReadFile(uringParam)
	if err != nil || strings.TrimSpace(string(b)) == "Y" {
		return
	}
	// Without the module parameter, auto falls back and says why.
	d = startDaemon(t, t.TempDir(), "z,,,rw,0 8 zero;", "--transport", "auto")
	mustLog(t, d, "io_uring is not available")
}

// mustLog fails the test unless the daemon's log contains s. The daemon logs
// its transport while it mounts, before it says it serves, which is when
// startDaemon returns.
func mustLog(t *testing.T, d *daemon, s string) {
	t.Helper()
	if !strings.Contains(d.stderr.String(), s) {
		t.Errorf("%q not in the log: %s", s, d.stderr)
	}
}

// onCPU0 runs f on a thread bound to CPU 0, so that every FUSE request it
// issues goes to io_uring queue 0 (the kernel picks the queue of the
// issuing CPU).
func onCPU0(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(0)
		unix.SchedSetaffinity(0, &set)
		f()
	}()
	<-done
}

// directBuf returns a 4 KiB buffer aligned for O_DIRECT.
func directBuf() []byte {
	b := make([]byte, 8192)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095)
	return b[off : off+4096]
}

// scrape returns the metrics of d, started with --metrics-addr.
func scrape(t *testing.T, d *daemon) []byte {
	t.Helper()
	m := regexp.MustCompile(`dmfuse: metrics on (http://\S+/metrics)\n`).FindStringSubmatch(d.stderr.String())
	if m == nil {
		t.Fatalf("no metrics address in the log: %s", d.stderr)
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestURingLargeRequests: 1 MiB writes and reads, 256 KiB requests under
// the default memory limit, run off the queues' threads (offloaded) and
// keep their data, also several at once.
func TestURingLargeRequests(t *testing.T) {
	_, body := verifiedLinear(t, t.TempDir(), "--bs=1M", "--iodepth=4", "--size=8m", "--offset_increment=8m")
	// 2 jobs x 8 writes and 8 verifying reads of 1 MiB: at least one
	// request of 64 KiB or more each.
	if n := scraped(t, body, "dmfuse_uring_offloaded_total"); n < 32 {
		t.Errorf("%d offloaded requests, want at least 32\n%s", n, regexp.MustCompile(`(?m)^dmfuse_uring.*$`).FindAll(body, -1))
	}
}

// TestURingDirectReads: READs of a linear device over a file on a disk file
// system are read from the file through the queues' rings (counted in
// dmfuse_uring_direct_total), and return what the writes before them
// wrote, as the device's statistics count them.
func TestURingDirectReads(t *testing.T) {
	d, body := verifiedLinear(t, diskTempDir(t), "--bsrange=4k-16k", "--iodepth=8", "--size=4m", "--offset_increment=4m")
	n := scraped(t, body, "dmfuse_uring_direct_total")
	// 2 jobs x 4 MiB verified in requests of at most 16 KiB.
	if n < 2*4<<20/(16<<10) {
		t.Errorf("%d reads through the rings, want at least %d\n%s", n, 2*4<<20/(16<<10), regexp.MustCompile(`(?m)^dmfuse_uring.*$`).FindAll(body, -1))
	}
	b, err := os.ReadFile(d.path("stats", "lin", "stat"))
	if err != nil {
		t.Fatal(err)
	}
	if reads, _ := strconv.Atoi(strings.Fields(string(b))[0]); reads < n {
		t.Errorf("the device counted %d reads, %d went through the rings", reads, n)
	}
}

// verifiedLinear serves a linear device over a 16 MiB file in dir on
// io_uring, writes it with two fio jobs (args: sizes and depth) that read
// every block back and check it, and returns the daemon and its metrics.
func verifiedLinear(t *testing.T, dir string, args ...string) (*daemon, []byte) {
	t.Helper()
	requireURing(t)
	requireTool(t, "fio")
	sparseFile(t, filepath.Join(dir, "a.img"), 16<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 32768 linear ./a.img 0;", "--transport", "uring", "--metrics-addr", "127.0.0.1:0")
	mustLog(t, d, "transport io_uring")
	run(t, "fio", append([]string{"--name=verified", "--filename=" + d.path("lin"), "--direct=1", "--rw=randwrite",
		"--ioengine=io_uring", "--numjobs=2", "--verify=crc32c", "--do_verify=1", "--verify_state_save=0"}, args...)...)
	return d, scrape(t, d)
}

// diskTempDir returns a temporary folder on a disk file system whose files
// io_uring reads without a worker thread (ext4, xfs, btrfs): the test's,
// or one under /var/tmp.
func diskTempDir(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{t.TempDir(), "/var/tmp"} {
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) != nil {
			continue
		}
		switch st.Type {
		case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC:
			if dir == "/var/tmp" {
				d, err := os.MkdirTemp(dir, "dmfuse-test-")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(d) })
				return d
			}
			return dir
		}
	}
	t.Skip("no ext4, xfs or btrfs folder for the backing file")
	return ""
}
