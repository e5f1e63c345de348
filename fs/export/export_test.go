package export

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
	"golang.org/x/sys/unix"
)

func TestParseDevNo(t *testing.T) {
	for s, want := range map[string][3]uint32{"7:3": {7, 3, 1}, "253:0": {253, 0, 1}, "7": {0, 0, 0}, "a:1": {0, 1, 0}} {
		maj, min, ok := parseDevNo(s)
		if ok != (want[2] == 1) || ok && (maj != want[0] || min != want[1]) {
			t.Errorf("parseDevNo(%q) = %d %d %v", s, maj, min, ok)
		}
	}
	if got := unescapeMount(`/mnt/a\040b\134c`); got != `/mnt/a b\c` {
		t.Errorf("unescapeMount: %q", got)
	}
}

// loopImage returns a new 1 MiB file to attach loop devices over; it skips
// the test without root or loop devices.
func loopImage(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no /dev/loop-control")
	}
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestLoopUsers attaches a loop device over a file and counts its users as
// the open count does: none, then an open descriptor (of another process:
// the test's own are skipped, as the daemon's are).
func TestLoopUsers(t *testing.T) {
	img := loopImage(t)
	l, err := attachLoop(img, false)
	if err != nil {
		t.Fatal(err)
	}
	defer detachLoop(l.path)
	if unix.Major(l.rdev) != 7 {
		t.Errorf("%s: number %d:%d", l.path, unix.Major(l.rdev), unix.Minor(l.rdev))
	}
	if n := l.users(); n != 0 {
		t.Errorf("users of a fresh loop device: %d", n)
	}
	if got := LoopsUnder(filepath.Dir(img)); len(got) != 1 || got[0] != (Loop{Path: l.path, Rdev: l.rdev}) {
		t.Errorf("LoopsUnder: %+v, want %+v", got, *l)
	}
	if err := detachLoop(l.path); err != nil {
		t.Fatal(err)
	}
	if got := LoopsUnder(filepath.Dir(img)); len(got) != 0 {
		t.Errorf("after detach: %+v", got)
	}
}

// TestFreeMajor: the lowest local-use block major no driver holds.
func TestFreeMajor(t *testing.T) {
	for devices, want := range map[string]uint32{
		"Character devices:\n240 foo\n\nBlock devices:\n  7 loop\n253 zram\n254 virtblk\n": 240,
		"Block devices:\n240 a\n241 b\n": 242,
		"":                               240,
		"Block devices:\n" + allLocal():  stack.DefaultMajor,
		"Character devices:\n241 c\n":    240,
	} {
		if got := freeMajor(devices); got != want {
			t.Errorf("freeMajor(%q) = %d, want %d", devices, got, want)
		}
	}
	if m := FreeMajor(); m < 240 || m > 254 {
		t.Errorf("FreeMajor() = %d, not in 240-254", m)
	}
}

func allLocal() string {
	var b strings.Builder
	for m := 240; m <= 254; m++ {
		fmt.Fprintf(&b, "%d x\n", m)
	}
	return b.String()
}

// TestAttachClearsStaleReadOnly: a loop device whose block device a former
// user left read-only (BLKROSET outlives attachments) is writable once
// attached for a writable device, and read-only for a read-only one.
func TestAttachClearsStaleReadOnly(t *testing.T) {
	img := loopImage(t)
	for _, ro := range []bool{false, true} {
		l, err := attachLoop(img, ro)
		if err != nil {
			t.Fatal(err)
		}
		// Leave it read-only behind, then attach again: the same free
		// loop device comes back unless another test took it.
		if err := setReadOnly(l.path, true); err != nil {
			t.Fatal(err)
		}
		if err := detachLoop(l.path); err != nil {
			t.Fatal(err)
		}
		l, err = attachLoop(img, ro)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(l.path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKROGET)
		f.Close()
		detachLoop(l.path)
		if err != nil || (got == 1) != ro {
			t.Errorf("attached with ro=%v: BLKROGET %d, %v", ro, got, err)
		}
	}
}
