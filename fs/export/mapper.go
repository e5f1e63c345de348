package export

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// The entries of the mapper folder. On a system with udev, the kernel's
// device-mapper leaves /dev/mapper/NAME as a symbolic link to the block
// device's node, ../dm-N (lvm2's 10-dm.rules), and scripts depend on it:
// `readlink -f /dev/mapper/NAME` gives the node whose base name /sys/block
// and /sys/fs/<fs> know (xfstests' _short_dev, lsblk, findmnt). dmfuse
// makes MAPPER/NAME a link to the loop device's node in the same way:
// ../loopN when the mapper folder is beside it (/dev/mapper and /dev), the
// absolute path otherwise. A block node with the loop device's number, as
// earlier dmfuse versions made, is recognised wherever a link is.

// linkTarget is what MAPPER/NAME points at for the loop device at dev.
func linkTarget(mapper, dev string) string {
	if filepath.Dir(filepath.Clean(mapper)) == filepath.Dir(dev) {
		return filepath.Join("..", filepath.Base(dev))
	}
	return dev
}

// makeNode makes MAPPER/name a link to e's loop device, replacing whatever
// is there in one rename, so that the name never points nowhere.
func (l *Loops) makeNode(e *export, name string) {
	p := filepath.Join(l.mapper, name)
	tmp := filepath.Join(l.mapper, ".dmfuse-"+name)
	os.Remove(tmp)
	if err := os.Symlink(linkTarget(l.mapper, e.loop.path), tmp); err != nil {
		l.logf("%s: %v", p, err)
		return
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		l.logf("%s: %v", p, err)
		return
	}
	e.node = name
	l.saveState()
}

// removeNode removes e's entry if it still names e's loop device.
func (l *Loops) removeNode(e *export) {
	if e.node == "" {
		return
	}
	removeEntry(filepath.Join(l.mapper, e.node), e.loop.rdev, e.loop.path)
	e.node = ""
	l.saveState()
}

// removeEntry removes the mapper entry p if it names the loop device dev
// of number rdev: a link to it (followed, or by its target's name when the
// node is gone) or a block node with its number. It reports whether it
// removed p.
func removeEntry(p string, rdev uint64, dev string) bool {
	if !namesLoop(p, rdev, dev) {
		return false
	}
	return os.Remove(p) == nil
}

// namesLoop reports whether the mapper entry p names the loop device dev of
// number rdev.
func namesLoop(p string, rdev uint64, dev string) bool {
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil {
		return false
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		return st.Rdev == rdev
	case unix.S_IFLNK:
		if unix.Stat(p, &st) == nil {
			return st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == rdev
		}
		target, err := os.Readlink(p)
		return err == nil && filepath.Base(target) == filepath.Base(dev)
	}
	return false
}

// saveState writes the entries made, one "NAME MAJ:MIN LOOPDEV" per line.
// The caller holds l.mu.
func (l *Loops) saveState() {
	if l.state == "" {
		return
	}
	var lines []string
	for _, e := range l.byDev {
		if e.node != "" {
			lines = append(lines, fmt.Sprintf("%s %d:%d %s", e.node, unix.Major(e.loop.rdev), unix.Minor(e.loop.rdev), e.loop.path))
		}
	}
	sort.Strings(lines)
	tmp := l.state + ".tmp"
	text := strings.Join(lines, "\n")
	if text != "" {
		text += "\n"
	}
	if err := os.WriteFile(tmp, []byte(text), 0o600); err == nil {
		os.Rename(tmp, l.state)
	}
}

// cleanupEntries removes the mapper entries a daemon that died listed in
// state, those that still name their loop device, and state itself.
func cleanupEntries(mapper, state string) []string {
	var did []string
	b, err := os.ReadFile(state)
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		maj, min, ok := parseDevNo(f[1])
		if !ok {
			continue
		}
		dev := ""
		if len(f) > 2 {
			dev = f[2]
		}
		p := filepath.Join(mapper, f[0])
		if removeEntry(p, unix.Mkdev(maj, min), dev) {
			did = append(did, "removed "+p)
		}
	}
	os.Remove(state)
	return did
}
