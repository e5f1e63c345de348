package sysfs

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// mountView mounts the view of a manager with devices lower (8 MiB, uuid
// U-lower) and upper (linear on lower) on a new folder, unmounted when the
// test ends. It skips without root or /dev/fuse, or fails under
// DMFUSE_REQUIRE_FUSE=1.
func mountView(t *testing.T) (string, *stack.Manager) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	}
	if why != "" {
		if os.Getenv("DMFUSE_REQUIRE_FUSE") == "1" {
			t.Fatalf("cannot mount (%s) but DMFUSE_REQUIRE_FUSE=1", why)
		}
		t.Skipf("cannot mount: %s", why)
	}
	reg, err := stack.NewRegistry(stack.Linear, stack.Zero)
	if err != nil {
		t.Fatal(err)
	}
	open := stacktest.Opener{"mem": stacktest.NewMemDevice("mem", 8<<20)}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Open: open.Open, Major: 240})
	t.Cleanup(func() { m.Close() })
	for _, c := range []stack.CreateOptions{
		{Name: "lower", UUID: "U-lower", Minor: -1, Table: "0 16384 linear mem 0"},
		{Name: "upper", Minor: -1, Table: "0 8192 linear lower 100"},
	} {
		if _, err := m.Create(c); err != nil {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(t.TempDir(), "sys")
	s, err := Mount(mnt, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unmount() })
	return mnt, m
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// TestView: the files libdevmapper, lvm and cryptsetup read, reached as
// they reach them (through /sys/dev/block/MAJOR:MINOR and /sys/block/dm-N),
// say what the devices are; holders and slaves follow the stacking; the
// host's entries are still there.
func TestView(t *testing.T) {
	mnt, m := mountView(t)
	lower, upper := m.Lookup("lower"), m.Lookup("upper")
	byNo := filepath.Join(mnt, "dev/block", lower.DevNo())
	for file, want := range map[string]string{
		"dev": lower.DevNo() + "\n", "size": "16384\n", "ro": "0\n", "dm/name": "lower\n", "dm/uuid": "U-lower\n",
		"dm/suspended": "0\n", "uevent": "MAJOR=240\nMINOR=" + strings.TrimPrefix(lower.DevNo(), "240:") + "\nDEVNAME=dm-0\nDEVTYPE=disk\n",
		"queue/logical_block_size": "512\n", "bdi/read_ahead_kb": "128\n",
	} {
		if got := readFile(t, filepath.Join(byNo, file)); got != want {
			t.Errorf("%s: %q, want %q", file, got, want)
		}
	}
	if got := readFile(t, filepath.Join(mnt, "block/dm-1/dm/name")); got != "upper\n" {
		t.Errorf("block/dm-1/dm/name: %q", got)
	}
	if got := names(t, filepath.Join(byNo, "holders")); strings.Join(got, " ") != "dm-1" {
		t.Errorf("lower's holders: %v", got)
	}
	if got := names(t, filepath.Join(mnt, "block/dm-1/slaves")); strings.Join(got, " ") != "dm-0" {
		t.Errorf("upper's slaves: %v", got)
	}
	if got := readFile(t, filepath.Join(mnt, "block/dm-1/slaves/dm-0/dm/name")); got != "lower\n" {
		t.Errorf("upper's slave's name: %q", got)
	}
	// A suspended device says so; a removed one is gone.
	if err := m.Suspend("upper", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(mnt, "dev/block", upper.DevNo(), "dm/suspended")); got != "1\n" {
		t.Errorf("suspended: %q", got)
	}
	if err := m.Remove("upper", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "block/dm-1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a removed device's folder: %v", err)
	}
	if got := names(t, filepath.Join(byNo, "holders")); len(got) != 0 {
		t.Errorf("holders after the holder went: %v", got)
	}
	// The host's devices are links into the host's sysfs.
	host, _ := os.ReadDir("/sys/block")
	if len(host) > 0 {
		name := host[0].Name()
		want, _ := os.Readlink(filepath.Join("/sys/block", name))
		if got, err := os.Readlink(filepath.Join(mnt, "block", name)); err != nil || got != want {
			t.Errorf("host entry %s: %q, %v; want %q", name, got, err, want)
		}
	}
}

// TestReadAhead: read_ahead_kb is written as libdevmapper writes it (open
// with O_TRUNC, one write of a decimal number) and rounded down to pages as
// the kernel rounds it; the device keeps it; a file that is not writable
// refuses writers as sysfs does (EACCES), and so does a bad number (EINVAL).
func TestReadAhead(t *testing.T) {
	mnt, m := mountView(t)
	d := m.Lookup("lower")
	ra := filepath.Join(mnt, "dev/block", d.DevNo(), "bdi/read_ahead_kb")
	for _, tc := range []struct {
		write    string
		kb       string
		sectors  uint32
		errnoWas syscall.Errno
	}{
		{"1024", "1024\n", 2048, 0},
		{"4097\n", "4096\n", 8192, 0},
		{"3", "0\n", 0, 0},
		{"lots", "0\n", 0, syscall.EINVAL},
	} {
		err := os.WriteFile(ra, []byte(tc.write), 0)
		if tc.errnoWas != 0 && !errors.Is(err, tc.errnoWas) || tc.errnoWas == 0 && err != nil {
			t.Errorf("write %q: %v, want %v", tc.write, err, tc.errnoWas)
		}
		if got := readFile(t, ra); got != tc.kb {
			t.Errorf("after %q: read_ahead_kb %q, want %q", tc.write, got, tc.kb)
		}
		if got := d.ReadAhead(); got != tc.sectors {
			t.Errorf("after %q: ReadAhead %d, want %d", tc.write, got, tc.sectors)
		}
	}
	d.SetReadAhead(256, false)
	if got := readFile(t, filepath.Join(mnt, "block/dm-0/queue/read_ahead_kb")); got != "128\n" {
		t.Errorf("queue/read_ahead_kb: %q", got)
	}
	if err := os.WriteFile(filepath.Join(mnt, "block/dm-0/dm/name"), []byte("x"), 0); !errors.Is(err, syscall.EACCES) {
		t.Errorf("writing dm/name: %v, want EACCES", err)
	}
}
