package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// delayDevice is the delay the devices of these tests add; every timing
// check below is a lower bound or a comparison with it, never an upper bound.
const delayDevice = 50 * time.Millisecond

// timedIO runs f once and returns how long it took.
func timedIO(t *testing.T, what string, f func() (int, error)) time.Duration {
	t.Helper()
	t0 := time.Now()
	n, err := f()
	took := time.Since(t0)
	if err != nil || n != 4096 {
		t.Fatalf("%s: %d bytes, %v", what, n, err)
	}
	return took
}

// openDirect opens a device file for direct I/O.
func openDirect(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// pattern returns 4 KiB of a recognisable byte.
func pattern(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }

// TestDelayRead: every read and write on a 3-argument delay device takes at
// least the delay, and the data goes to the underlying file.
func TestDelayRead(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "base.img")
	sparseFile(t, img, 1<<20)
	d := startDaemon(t, dir, fmt.Sprintf("slow,,,rw,0 2048 delay %s 0 50", img))
	f := openDirect(t, d.path("slow"))

	buf := make([]byte, 4096)
	for i := range 3 {
		if took := timedIO(t, "read", func() (int, error) { return f.ReadAt(buf, int64(i)*4096) }); took < delayDevice {
			t.Errorf("read %d took %v on a %v device", i, took, delayDevice)
		}
	}
	want := pattern(0xa5)
	if took := timedIO(t, "write", func() (int, error) { return f.WriteAt(want, 8192) }); took < delayDevice {
		t.Errorf("write took %v on a %v device", took, delayDevice)
	}
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[8192:8192+4096], want) {
		t.Error("the write did not reach the underlying file at the same offset")
	}
	t0 := time.Now()
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if took := time.Since(t0); took < delayDevice {
		t.Errorf("fsync took %v on a %v device (flushes are delayed like reads with 3 arguments)", took, delayDevice)
	}
}

// TestDelayWritesOnly: the 6-argument form with read delay 0 and write delay
// 50 delays writes (and flushes, which follow the write class) but not reads,
// and maps each class to its own device and offset.
func TestDelayWritesOnly(t *testing.T) {
	dir := t.TempDir()
	rimg, wimg := filepath.Join(dir, "r.img"), filepath.Join(dir, "w.img")
	sparseFile(t, wimg, 2<<20)
	if err := os.WriteFile(rimg, pattern(0x11), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(rimg, 1<<20); err != nil {
		t.Fatal(err)
	}
	// Writes go to w.img at sector 2048 (1 MiB); reads come from r.img at 0.
	// held is the same with a write delay of an hour.
	d := startDaemon(t, dir, fmt.Sprintf("wslow,,,rw,0 2048 delay %[1]s 0 0 %[2]s 2048 50;\n"+
		"held,,,rw,0 2048 delay %[1]s 0 0 %[2]s 2048 3600000", rimg, wimg))
	f := openDirect(t, d.path("wslow"))

	buf := make([]byte, 4096)
	var writes []time.Duration
	for i := range 3 {
		writes = append(writes, timedIO(t, "write", func() (int, error) { return f.WriteAt(pattern(0x22), int64(i)*4096) }))
	}
	timedIO(t, "read", func() (int, error) { return f.ReadAt(buf, 0) })
	if !bytes.Equal(buf, pattern(0x11)) {
		t.Error("reads do not come from the read device at its offset")
	}
	for _, w := range writes {
		if w < delayDevice {
			t.Errorf("write took %v on a device with a write delay of %v", w, delayDevice)
		}
	}
	readsPassHeldWrite(t, d, "held")
	t0 := time.Now()
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if took := time.Since(t0); took < delayDevice {
		t.Errorf("fsync took %v; with 6 arguments flushes use the write delay %v", took, delayDevice)
	}
	w, err := os.ReadFile(wimg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w[1<<20:1<<20+4096], pattern(0x22)) || !bytes.Equal(w[:4096], make([]byte, 4096)) {
		t.Error("writes did not land on the write device at its offset")
	}

	// The statistics count the delay in the write time (the start time is taken
	// before the delay, drivers/md/dm.c: alloc_io): at least 3 x 50 ms over 3
	// writes.
	st, err := os.ReadFile(d.path("stats", "wslow", "stat"))
	if err != nil {
		t.Fatal(err)
	}
	fs := strings.Fields(string(st))
	if len(fs) < 8 {
		t.Fatalf("stat %q", st)
	}
	var wticks int64
	fmt.Sscan(fs[7], &wticks)
	if wticks < 3*delayDevice.Milliseconds() {
		t.Errorf("write ticks %d ms after 3 writes of at least %v each (stat %q)", wticks, delayDevice, st)
	}
}

// readsPassHeldWrite checks that a read on the delay device name, whose read
// delay is 0, does not wait for its write delay: with a write held in the
// target, the read completes and the target never counts a read queued. The
// write is released by a suspend (presuspend lets queued requests go).
func readsPassHeldWrite(t *testing.T, d *daemon, name string) {
	t.Helper()
	f := openDirect(t, d.path(name))
	wdone := make(chan error, 1)
	go func() {
		_, err := f.WriteAt(pattern(0x33), 65536)
		wdone <- err
	}()
	waitDelayStatus(t, d, name, "0 1 0", wdone)
	rdone := make(chan error, 1)
	go func() {
		_, err := f.ReadAt(make([]byte, 4096), 0)
		rdone <- err
	}()
	read, stuck := false, false
	for !read && !stuck {
		select {
		case err := <-rdone:
			if err != nil {
				t.Errorf("read beside a held write: %v", err)
			}
			read = true
		case <-time.After(10 * time.Millisecond):
			if st := delayStatus(t, d, name); st != "0 1 0" {
				t.Errorf("status %q beside a held write: a read waits in the target (or the write went)", st)
				stuck = true
			}
		}
	}
	if out, err := d.ctl("suspend", name); err != nil {
		t.Fatalf("dmfuse suspend: %v: %s", err, out)
	}
	if err := <-wdone; err != nil {
		t.Errorf("the held write, released by suspend: %v", err)
	}
	if !read {
		<-rdone // released by the suspend too
	}
	if out, err := d.ctl("resume", name); err != nil {
		t.Fatalf("dmfuse resume: %v: %s", err, out)
	}
}

// delayStatus returns the queued reads, writes and flushes of the delay
// device name (the end of its status line).
func delayStatus(t *testing.T, d *daemon, name string) string {
	t.Helper()
	out, err := d.ctl("status", name)
	if err != nil {
		t.Fatalf("dmfuse status %s: %v: %s", name, err, out)
	}
	_, counts, ok := strings.Cut(strings.TrimSpace(out), " delay ")
	if !ok {
		t.Fatalf("dmfuse status %s: %q", name, out)
	}
	return counts
}

// waitDelayStatus waits until the delay device name counts want queued
// (reads, writes, flushes); it fails if a request it waits for ends first.
func waitDelayStatus(t *testing.T, d *daemon, name, want string, ended <-chan error) {
	t.Helper()
	for {
		st := delayStatus(t, d, name)
		if st == want {
			return
		}
		select {
		case err := <-ended:
			t.Fatalf("the request ended (%v) before %s counted %q queued; status %q", err, name, want, st)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ctl runs a dmfuse control command against the daemon d.
// waitDelayHeld polls the status of delay device dev until it holds n
// requests, or until done yields. It returns what done yielded, the last
// status line and whether done yielded first.
func waitDelayHeld[T any](t *testing.T, d *daemon, dev string, n int, done <-chan T) (v T, status string, ended bool) {
	t.Helper()
	want := "delay " + strconv.Itoa(n) + " 0 0"
	for {
		out, err := d.ctl("status", dev)
		if err != nil {
			t.Fatalf("dmfuse status: %v: %s", err, out)
		}
		status = strings.TrimSpace(out)
		if strings.HasSuffix(status, want) {
			return v, status, false
		}
		select {
		case v = <-done:
			return v, status, true
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (d *daemon) ctl(args ...string) (string, error) {
	out, err := exec.Command(dmfuseBin, append([]string{"--mount", d.mnt}, args...)...).CombinedOutput()
	return string(out), err
}

// TestDelayPresuspendReleases: suspending a delay device releases the
// request waiting in it at once (long before its delay), status returns to
// "0 0 0", and after resume requests are delayed again.
func TestDelayPresuspendReleases(t *testing.T) {
	requireFUSE(t)
	if out, err := exec.Command(dmfuseBin, "suspend", "--help").CombinedOutput(); err != nil {
		t.Skipf("dmfuse has no suspend command: %s", strings.TrimSpace(string(out)))
	}
	const long = 30 * time.Second
	dir := t.TempDir()
	img := filepath.Join(dir, "base.img")
	sparseFile(t, img, 1<<20)
	d := startDaemon(t, dir, fmt.Sprintf("held,,,rw,0 2048 delay %s 0 %d", img, long.Milliseconds()))
	f := openDirect(t, d.path("held"))

	type result struct {
		took time.Duration
		err  error
	}
	done := make(chan result, 1)
	go func() {
		buf := make([]byte, 4096)
		t0 := time.Now()
		_, err := f.ReadAt(buf, 0)
		done <- result{time.Since(t0), err}
	}()
	// Wait until the read is queued in the target.
	if r, out, ended := waitDelayHeld(t, d, "held", 1, done); ended {
		t.Fatalf("the read ended (%v, %v) before it was seen queued; status %q", r.took, r.err, out)
	}
	if out, err := d.ctl("suspend", "held"); err != nil {
		t.Fatalf("dmfuse suspend: %v: %s", err, out)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("the released read failed: %v", r.err)
	}
	if r.took >= long {
		t.Errorf("the read took %v: suspend did not release it", r.took)
	}
	if out, err := d.ctl("status", "held"); err != nil || !strings.HasSuffix(strings.TrimSpace(out), "delay 0 0 0") {
		t.Errorf("status after suspend: %q, %v", out, err)
	}
	if out, err := d.ctl("resume", "held"); err != nil {
		t.Fatalf("dmfuse resume: %v: %s", err, out)
	}
	// Delaying again: the next read is queued, not passed through.
	go func() {
		buf := make([]byte, 4096)
		_, err := f.ReadAt(buf, 4096)
		done <- result{err: err}
	}()
	for {
		out, err := d.ctl("status", "held")
		if err != nil {
			t.Fatalf("dmfuse status: %v: %s", err, out)
		}
		if strings.HasSuffix(strings.TrimSpace(out), "delay 1 0 0") {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("a read after resume was not delayed (%v); status %q", r.err, out)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// Release it for cleanup.
	if out, err := d.ctl("suspend", "held"); err != nil {
		t.Fatalf("dmfuse suspend: %v: %s", err, out)
	}
	<-done
	d.ctl("resume", "held")
}
