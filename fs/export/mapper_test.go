package export

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/stack"
)

func TestLinkTarget(t *testing.T) {
	for _, c := range [][3]string{
		{"/dev/mapper", "/dev/loop3", "../loop3"},
		{"/dev/mapper/", "/dev/loop12", "../loop12"},
		{"/tmp/x/mapper", "/dev/loop3", "/dev/loop3"},
	} {
		if got := linkTarget(c[0], c[1]); got != c[2] {
			t.Errorf("linkTarget(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}

// TestMapperLinks makes, renames and removes the mapper entry of a real
// loop device, checks that it resolves to the loop device's node and is
// listed in the state file, and that the cleanup of a daemon that died
// removes a link or an old-style block node it listed, and nothing else.
func TestMapperLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no /dev/loop-control")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	lp, err := attachLoop(img, false)
	if err != nil {
		t.Fatal(err)
	}
	defer detachLoop(lp.path)
	mapper := filepath.Join(dir, "mapper")
	if err := os.Mkdir(mapper, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "nodes")
	l := &Loops{mapper: mapper, state: state, logf: t.Logf, byDev: map[*stack.Device]*export{}}
	e := &export{loop: lp}
	l.byDev[nil] = e
	// An entry an older version left is replaced.
	if err := unix.Mknod(filepath.Join(mapper, "a"), unix.S_IFBLK|0o600, int(lp.rdev)); err != nil {
		t.Fatal(err)
	}
	l.makeNode(e, "a")
	p := filepath.Join(mapper, "a")
	if target, err := os.Readlink(p); err != nil || target != lp.path {
		t.Fatalf("%s -> %q, %v; want a link to %s", p, target, err, lp.path)
	}
	if got, err := filepath.EvalSymlinks(p); err != nil || got != lp.path {
		t.Errorf("%s resolves to %q, %v", p, got, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(lp.path))); err != nil {
		t.Errorf("the link's base name is no block device of /sys/block: %v", err)
	}
	l.removeNode(e)
	l.makeNode(e, "b")
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Errorf("the old name is left: %v", err)
	}
	b, err := os.ReadFile(state)
	if want := "b " + devNo(lp.rdev) + " " + lp.path + "\n"; err != nil || string(b) != want {
		t.Errorf("state %q, %v; want %q", b, err, want)
	}
	if ents, _ := os.ReadDir(mapper); len(ents) != 1 {
		t.Errorf("mapper folder holds %d entries, want 1", len(ents))
	}

	// The cleanup removes what state lists while it names the loop device:
	// the link b, the block node c, not d (another device's number) nor e
	// (a link elsewhere).
	if err := unix.Mknod(filepath.Join(mapper, "c"), unix.S_IFBLK|0o600, int(lp.rdev)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(mapper, "d"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 999))); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(mapper, "e")); err != nil {
		t.Fatal(err)
	}
	list := ""
	for _, n := range []string{"b", "c", "d", "e"} {
		list += n + " " + devNo(lp.rdev) + " " + lp.path + "\n"
	}
	if err := os.WriteFile(state, []byte(list), 0o600); err != nil {
		t.Fatal(err)
	}
	did := cleanupEntries(mapper, state)
	if want := "removed " + filepath.Join(mapper, "b") + ",removed " + filepath.Join(mapper, "c"); strings.Join(did, ",") != want {
		t.Errorf("cleanup did %q, want %q", did, want)
	}
	var left []string
	ents, _ := os.ReadDir(mapper)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if strings.Join(left, ",") != "d,e" {
		t.Errorf("left in the mapper folder: %v", left)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state left: %v", err)
	}
}

func devNo(rdev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))
}
