package test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/fs/export"
	"golang.org/x/sys/unix"
)

const sector = 512

// roundTrip writes random ranges (unaligned, crossing segment and chunk
// boundaries) to a device file opened with flags and checks every read
// against a model of the device.
func roundTrip(t *testing.T, path string, flags int, seed uint64) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|flags, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	model := make([]byte, size)
	if _, err := f.ReadAt(model, 0); err != nil {
		t.Fatalf("reading the whole device: %v", err)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	for i := 0; i < 400; i++ {
		off := r.Int64N(size)
		n := 1 + r.Int64N(min(300<<10, size-off))
		if i%4 == 0 { // aligned, 4k
			off &^= 4095
			n = 4096 * (1 + r.Int64N(64))
			n = min(n, size-off)
		}
		buf := make([]byte, n)
		if r.IntN(2) == 0 {
			for j := range buf {
				buf[j] = byte(r.Uint32())
			}
			if k, err := f.WriteAt(buf, off); err != nil || int64(k) != n {
				t.Fatalf("write %d@%d: %d, %v", n, off, k, err)
			}
			copy(model[off:], buf)
		} else {
			if k, err := f.ReadAt(buf, off); err != nil || int64(k) != n {
				t.Fatalf("read %d@%d: %d, %v", n, off, k, err)
			}
			if !bytes.Equal(buf, model[off:off+n]) {
				t.Fatalf("read %d@%d differs from what was written", n, off)
			}
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	got := make([]byte, size)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("the whole device differs from what was written")
	}
	return model
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		sparseFile(t, filepath.Join(dir, n+".img"), 16<<20)
	}
	d := startDaemon(t, dir, `
lin,,,rw,0 8192 linear ./a.img 1000,8192 8192 linear ./b.img 0;
str,,,rw,0 24570 striped 3 5 ./c.img 0 ./d.img 0 ./e.img 8;
`)
	for _, mode := range []struct {
		name  string
		flags int
	}{{"direct", syscall.O_DIRECT}, {"buffered", 0}} {
		t.Run("linear/"+mode.name, func(t *testing.T) {
			model := roundTrip(t, d.path("lin"), mode.flags, 1)
			a, _ := os.ReadFile(filepath.Join(dir, "a.img"))
			b, _ := os.ReadFile(filepath.Join(dir, "b.img"))
			if !bytes.Equal(a[1000*sector:9192*sector], model[:8192*sector]) || !bytes.Equal(b[:8192*sector], model[8192*sector:]) {
				t.Fatal("backing files do not hold the data where the table maps it")
			}
		})
		t.Run("striped/"+mode.name, func(t *testing.T) {
			model := roundTrip(t, d.path("str"), mode.flags, 2)
			files := [3][]byte{}
			for i, n := range []string{"c", "d", "e"} {
				files[i], _ = os.ReadFile(filepath.Join(dir, n+".img"))
			}
			offs := [3]int64{0, 0, 8}
			for s := int64(0); s < 24570; s++ {
				chunk, within := s/5, s%5
				st, row := chunk%3, chunk/3
				devSec := offs[st] + row*5 + within
				if !bytes.Equal(files[st][devSec*sector:(devSec+1)*sector], model[s*sector:(s+1)*sector]) {
					t.Fatalf("sector %d is not at stripe %d sector %d", s, st, devSec)
				}
			}
		})
	}
}

func TestErrorAndZero(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "bad,,,rw,0 2048 error;\nnil,,,rw,0 2048 zero;")
	f, err := os.OpenFile(d.path("bad"), os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of the error device: %v, want EIO", err)
	}
	if _, err := f.WriteAt(buf, 4096); !errors.Is(err, syscall.EIO) {
		t.Errorf("write to the error device: %v, want EIO", err)
	}
	z, err := os.OpenFile(d.path("nil"), os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	for i := range buf {
		buf[i] = 0x5a
	}
	if _, err := z.WriteAt(buf, 8192); err != nil {
		t.Fatalf("write to zero: %v", err)
	}
	if _, err := z.ReadAt(buf, 8192); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, make([]byte, 4096)) {
		t.Error("zero device did not read zeros after a write")
	}
	if n, err := z.ReadAt(buf, 2048*sector-100); n != 100 || err == nil {
		t.Errorf("read crossing the end: %d, %v; want 100 bytes and EOF", n, err)
	}
	if _, err := z.WriteAt(buf, 2048*sector); !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EFBIG) {
		t.Errorf("write past the end: %v, want ENOSPC", err)
	}
	// Stats: I/O killed by the error target counts nothing.
	ds, err := os.ReadFile(d.path("stats", "diskstats"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ds), fmt.Sprintf(" %d       0 bad 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", export.FreeMajor())) {
		t.Errorf("diskstats of the error device:\n%s", ds)
	}
}

func TestDiscardAndZeroRange(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 4<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 8192 linear ./a.img 0;")
	f, err := os.OpenFile(d.path("lin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ones := bytes.Repeat([]byte{1}, 1<<20)
	if _, err := f.WriteAt(ones, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 8192); err != nil {
		t.Fatalf("punch hole: %v", err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE, 65536, 4096); err != nil {
		t.Fatalf("zero range: %v", err)
	}
	got := make([]byte, 1<<20)
	f.ReadAt(got, 0)
	for i, c := range got {
		want := byte(1)
		if (i >= 4096 && i < 12288) || (i >= 65536 && i < 69632) {
			want = 0
		}
		if c != want {
			t.Fatalf("byte %d = %d, want %d", i, c, want)
		}
	}
	if err := f.Truncate(0); err == nil {
		t.Error("truncate of a device file succeeded")
	}
	if st, _ := f.Stat(); st.Size() != 8192*sector {
		t.Errorf("size %d after truncate, want %d", st.Size(), 8192*sector)
	}
}

// TestDiskstatsCounts checks exact counts after a known workload.
func TestDiskstatsCounts(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 4<<20)
	d := startDaemon(t, dir, "two,,,rw,0 1024 linear ./a.img 0,1024 1024 linear ./a.img 2048;")
	f, err := os.OpenFile(d.path("two"), os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	const n = 25
	for i := 0; i < n; i++ {
		if _, err := f.ReadAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	// 8 sectors at 1020: crosses the segment boundary, counts twice.
	if _, err := f.ReadAt(buf, 1020*sector); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	stat, err := os.ReadFile(d.path("stats", "two", "stat"))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat))
	if len(fields) != 17 {
		t.Fatalf("stat has %d fields: %q", len(fields), stat)
	}
	// reads n+2, sectors 8n+8; writes 2 (data + empty flush), sectors 8
	want := map[int]string{0: "27", 1: "0", 2: "208", 4: "2", 6: "8", 8: "0"}
	for i, w := range want {
		if fields[i] != w {
			t.Errorf("stat field %d = %s, want %s (%q)", i+1, fields[i], w, stat)
		}
	}
	infl, _ := os.ReadFile(d.path("stats", "two", "inflight"))
	if string(infl) != "       0        0\n" {
		t.Errorf("inflight %q", infl)
	}
}

func TestLoopMkfsFsck(t *testing.T) {
	requireTool(t, "losetup", "mkfs.ext4", "e2fsck", "mount", "umount")
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "disk.img"), 256<<20)
	d := startDaemon(t, dir, "disk,,,rw,0 524288 linear ./disk.img 0;")
	loop := strings.TrimSpace(run(t, "losetup", "--direct-io=on", "-f", "--show", d.path("disk")))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	run(t, "mkfs.ext4", "-q", "-F", loop)
	fsdir := filepath.Join(dir, "fs")
	os.Mkdir(fsdir, 0o755)
	run(t, "mount", loop, fsdir)
	mountedFS := true
	t.Cleanup(func() {
		if mountedFS {
			exec.Command("umount", "-l", fsdir).Run()
		}
	})
	r := rand.New(rand.NewPCG(5, 5))
	files := map[string][]byte{}
	for i := 0; i < 20; i++ {
		b := make([]byte, 1+r.IntN(3<<20))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		name := filepath.Join(fsdir, "f"+string(rune('a'+i)))
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	run(t, "umount", fsdir)
	mountedFS = false
	out := run(t, "e2fsck", "-fn", loop)
	if !strings.Contains(out, "files") {
		t.Errorf("e2fsck output: %s", out)
	}
	run(t, "mount", loop, fsdir)
	mountedFS = true
	for name, want := range files {
		got, err := os.ReadFile(name)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after remount: %v, equal=%v", name, err, bytes.Equal(got, want))
		}
	}
	run(t, "umount", fsdir)
	mountedFS = false
}

func TestDefaultSet(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "")
	for _, n := range []string{"disk", "slow", "zero", "broken"} {
		if _, err := os.Stat(d.path(n)); err != nil {
			t.Errorf("default device %s: %v", n, err)
		}
	}
	st, err := os.Stat(d.path("disk"))
	if err != nil || st.Size() != 1<<30 {
		t.Fatalf("disk: %v, size %v; want 1 GiB", err, st)
	}
	img := filepath.Join(dir, "state", "dmfuse", "disk.img")
	if st, err := os.Stat(img); err != nil || st.Size() != 1<<30 {
		t.Fatalf("backing file %s: %v", img, err)
	}
	// A second daemon on the same state folder is refused.
	other := exec.Command(dmfuseBin, "mount", filepath.Join(dir, "mnt2"))
	other.Env = append(os.Environ(), "XDG_STATE_HOME="+filepath.Join(dir, "state"))
	out, err := other.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by another dmfuse daemon") {
		t.Errorf("second daemon on the same state: %v\n%s", err, out)
		exec.Command("umount", "-l", filepath.Join(dir, "mnt2")).Run()
	}
	// Data persists across restarts.
	f, err := os.OpenFile(d.path("disk"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("persist"), 1<<20)
	f.Close()
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	d2 := startDaemon(t, dir, "")
	b := make([]byte, 7)
	f, err = os.Open(d2.path("slow"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(b, 1<<20); err != nil || string(b) != "persist" {
		t.Errorf("after restart, through slow: %q, %v", b, err)
	}
}

func TestSignalsAndStaleMount(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "z,,,rw,0 8 zero;")
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if d.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("exit code %d after SIGTERM", d.cmd.ProcessState.ExitCode())
	}
	if export.Mounted(d.mnt) {
		t.Fatal("still mounted after SIGTERM")
	}
	// A killed daemon leaves a dead mount that the next one clears.
	d = startDaemon(t, dir, "z,,,rw,0 8 zero;")
	d.cmd.Process.Kill()
	<-d.done
	d.done <- nil
	// On the io_uring transport a request racing the kernel's teardown of the
	// dead daemon's rings is aborted (ECONNABORTED, ECANCELED) before the mount
	// settles on ENOTCONN.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := os.Stat(d.path("z"))
		if errors.Is(err, syscall.ENOTCONN) {
			break
		}
		if !errors.Is(err, syscall.ECONNABORTED) && !errors.Is(err, syscall.ECANCELED) || time.Now().After(deadline) {
			t.Fatalf("after kill: %v, want ENOTCONN", err)
		}
	}
	d2 := startDaemon(t, dir, "z,,,rw,0 8 zero;")
	if !strings.Contains(d2.stderr.String(), "stale mount") {
		t.Errorf("no message about the stale mount: %s", d2.stderr)
	}
	if _, err := os.Stat(d2.path("z")); err != nil {
		t.Errorf("after clearing the stale mount: %v", err)
	}
}

// TestRestartRightAfterKill starts the next daemon on the folder as soon as
// the last one, killed with SIGKILL, has exited, with nothing probing the
// dead mount in between, ten times over: each clears the dead mount, also
// while the kernel is still tearing down the dead daemon's connection (on
// the io_uring transport that ends after the process is gone, and a request
// meanwhile is cancelled or aborted rather than refused).
func TestRestartRightAfterKill(t *testing.T) {
	dir := t.TempDir()
	for i := range 10 {
		d := startDaemon(t, dir, "z,,,rw,0 8 zero;")
		if i > 0 && !strings.Contains(d.stderr.String(), "cleared a stale mount") {
			t.Errorf("restart %d: no message about the stale mount: %s", i, d.stderr)
		}
		d.cmd.Process.Kill()
		err := <-d.done
		d.done <- err
	}
	d := startDaemon(t, dir, "z,,,rw,0 8 zero;")
	if _, err := os.Stat(d.path("z")); err != nil {
		t.Errorf("after the last restart: %v", err)
	}
}

func TestBusyUnmount(t *testing.T) {
	requireTool(t, "losetup")
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 16384 linear ./a.img 0;")
	loop := strings.TrimSpace(run(t, "losetup", "-f", "--show", d.path("lin")))
	d.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.stderr.String(), "losetup -d "+loop) {
		if time.Now().After(deadline) {
			exec.Command("losetup", "-d", loop).Run()
			t.Fatalf("no advice to detach %s: %s", loop, d.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !export.Mounted(d.mnt) {
		t.Fatal("unmounted while a loop device was attached")
	}
	run(t, "losetup", "-d", loop)
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if export.Mounted(d.mnt) {
		t.Error("still mounted after the loop device was detached")
	}
}

func TestBadConfig(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "small.img"), 1<<20)
	cases := map[string]string{
		"ok,,,rw,0 8 zero;\nbad,,,rw,0 8 linear ./small.img":      "bad: line 1: linear: Invalid argument count",
		"ok,,,rw,0 8 zero;\nbig,,,rw,0 4096 linear ./small.img 0": "big: line 1: linear: ",
		"ok,,,rw,0 8 zero;\nno,,,rw,0 8 linear ./none.img 0":      "no: line 1: linear: Device lookup failed",
		"ok,,,rw,0 8 zero;\ngap,,,rw,0 8 zero,9 8 zero":           "gap: line 2: zero: Gap in table",
		"ok,,,rw,0 8 zero;\nx,,,maybe,0 8 zero":                   "invalid flags",
	}
	for cfg, want := range cases {
		path := filepath.Join(dir, "bad.conf")
		os.WriteFile(path, []byte(cfg), 0o644)
		mnt := filepath.Join(dir, "mnt")
		out, err := exec.Command(dmfuseBin, "mount", "--config", path, mnt).CombinedOutput()
		if err == nil {
			exec.Command("umount", "-l", mnt).Run()
			t.Errorf("%q: mounted", cfg)
			continue
		}
		if !strings.Contains(string(out), want) || !strings.HasPrefix(string(out), "dmfuse: ") {
			t.Errorf("%q: output %q, want it to contain %q", cfg, out, want)
		}
		if export.Mounted(mnt) {
			t.Errorf("%q: left a mount", cfg)
		}
	}
}
