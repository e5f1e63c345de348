package stack

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// loopDevice attaches a loop device over a new file of size bytes and
// detaches it when the test ends; it skips without root or loop devices.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no /dev/loop-control")
	}
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// exclusive reports whether an O_EXCL open of dev succeeds (and closes it).
func exclusive(t *testing.T, dev string) bool {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
		return true
	}
	if !errors.Is(err, unix.EBUSY) {
		t.Fatalf("O_EXCL open of %s: %v", dev, err)
	}
	return false
}

// TestClaims: the tables over a block device hold it exclusively with one
// claim between them (a reload keeping it, a second table, an inactive
// table), released with the last; a device held exclusively elsewhere
// fails to load with EBUSY.
func TestClaims(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	m, _ := newExportManager(t)
	if !exclusive(t, dev) {
		t.Fatal("a fresh loop device is held")
	}
	mustCreate(t, m, "a", "0 1024 linear "+dev+" 0")
	if exclusive(t, dev) {
		t.Error("a table's device is not held")
	}
	if err := m.Load("a", "0 1024 linear "+dev+" 1024", ""); err != nil {
		t.Fatalf("a reload keeping the device: %v", err)
	}
	if err := m.Resume("a", Flags{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "b", "0 8 linear "+dev+" 0")
	if err := m.Remove("a", Flags{}); err != nil {
		t.Fatal(err)
	}
	if exclusive(t, dev) {
		t.Error("released while b still uses it")
	}
	if err := m.Load("b", "0 8 zero", ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume("b", Flags{}); err != nil {
		t.Fatal(err)
	}
	if !exclusive(t, dev) {
		t.Error("still held after the last table using it went")
	}
	// Inactive only.
	if err := m.Load("b", "0 8 linear "+dev+" 0", ""); err != nil {
		t.Fatal(err)
	}
	if exclusive(t, dev) {
		t.Error("an inactive table's device is not held")
	}
	if err := m.Clear("b"); err != nil {
		t.Fatal(err)
	}
	if !exclusive(t, dev) {
		t.Error("still held after the inactive table was cleared")
	}

	// Someone else holds it.
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = m.Load("b", "0 8 linear "+dev+" 0", "")
	unix.Close(fd)
	if !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "Device lookup failed: "+dev+": ") {
		t.Errorf("load over a device held elsewhere: %v", err)
	}
	if err := m.Load("b", "0 8 linear "+dev+" 0", ""); err != nil {
		t.Errorf("load once it is free: %v", err)
	}
	if err := m.Remove("b", Flags{}); err != nil {
		t.Fatal(err)
	}
	if !exclusive(t, dev) {
		t.Error("still held after remove")
	}
	claims.Lock()
	n := len(claims.m)
	claims.Unlock()
	if n != 0 {
		t.Errorf("%d claims left", n)
	}
}

// TestRegularFileNotClaimed: a regular file is opened as it is, with no
// claim.
func TestRegularFileNotClaimed(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	bd, err := OpenFile(f, f, false)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.(interface{ Close() error }).Close()
	claims.Lock()
	defer claims.Unlock()
	if len(claims.m) != 0 {
		t.Errorf("a regular file is claimed: %v", claims.m)
	}
}

// TestClaimedZeroesOverDirtyPages: write-zeroes and discard of a block
// device succeed right after a buffered write left the range's pages
// dirty (from a descriptor without O_EXCL the kernel could only try to
// invalidate them, and fails with EBUSY), and the range reads back zeros.
func TestClaimedZeroesOverDirtyPages(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	bd, err := OpenFile(dev, dev, false)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.(interface{ Close() error }).Close()
	ctx := context.Background()
	data := bytes.Repeat([]byte{0xa5}, 8192)
	for _, op := range []struct {
		name string
		do   func(off, n int64) error
	}{
		{"write-zeroes", func(off, n int64) error { return bd.(ZeroWriter).WriteZeroes(ctx, off, n) }},
		{"discard", func(off, n int64) error { return bd.(Discarder).Discard(ctx, off, n) }},
	} {
		if _, err := bd.WriteAt(ctx, data, 0); err != nil {
			t.Fatal(err)
		}
		if err := op.do(0, 4096); err != nil {
			t.Fatalf("%s over dirty pages: %v", op.name, err)
		}
		got := make([]byte, 8192)
		if _, err := bd.ReadAt(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		// A loop device over a file discards by punching a hole: zeros.
		if !bytes.Equal(got[:4096], make([]byte, 4096)) || !bytes.Equal(got[4096:], data[4096:]) {
			t.Errorf("%s: the range or its neighbour reads wrong", op.name)
		}
	}
}
