package dmsetup

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The mapper folder. The daemon keeps MAPPER/NAME, a symbolic link to the
// node of the device's loop device (../loopN), in step with its devices, as
// udev keeps /dev/mapper/NAME a link to ../dm-N; mknodes repairs it after
// someone else changed it.

// mknodes is dmsetup's mknodes (libdm's dm_mknodes): for each device (or
// the one named) with a block device, MAPPER/NAME is made a link to its
// node where it is missing or names something else; without a name, the
// entries of the folder that name no device and lead to no attached loop
// device (links left dangling, nodes of a detached loop device) are
// removed as well.
func (r *run) mknodes(args []string, _ bool) bool {
	devs, ok := r.devices()
	if !ok {
		return false
	}
	named := map[string]bool{}
	for _, a := range args {
		t, ok := r.device(a, false)
		if !ok {
			return false
		}
		named[t.name] = true
	}
	mapper := filepath.Join(r.devDir, "mapper")
	known := map[string]bool{}
	for _, d := range devs {
		known[d.Name] = true
		if len(args) > 0 && !named[d.Name] || d.BlkDevName == "" {
			continue
		}
		p := filepath.Join(mapper, d.Name)
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == unix.Mkdev(d.Major, d.Minor) {
			continue
		}
		if err := os.MkdirAll(mapper, 0o755); err != nil {
			r.errf("%v", err)
			return false
		}
		tmp := filepath.Join(mapper, ".dmfuse-"+d.Name)
		os.Remove(tmp)
		if err := os.Symlink(nodeLink(mapper, "/dev/"+d.BlkDevName), tmp); err != nil {
			r.errf("%v", err)
			return false
		}
		if err := os.Rename(tmp, p); err != nil {
			os.Remove(tmp)
			r.errf("%v", err)
			return false
		}
	}
	if len(args) > 0 {
		return true
	}
	ents, _ := os.ReadDir(mapper)
	for _, e := range ents {
		if known[e.Name()] || e.Name() == "control" {
			continue
		}
		if p := filepath.Join(mapper, e.Name()); staleEntry(p) {
			os.Remove(p)
		}
	}
	return true
}

// nodeLink is what MAPPER/NAME points at for the block device node dev:
// ../loopN beside the mapper folder, else dev itself (the daemon's rule).
func nodeLink(mapper, dev string) string {
	if filepath.Dir(filepath.Clean(mapper)) == filepath.Dir(dev) {
		return filepath.Join("..", filepath.Base(dev))
	}
	return dev
}

// staleEntry reports whether the mapper entry p leads nowhere: a link that
// dangles, or a link or node of a loop device with no backing file.
func staleEntry(p string) bool {
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil {
		return false
	}
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFLNK {
		if unix.Stat(p, &st) != nil {
			return true
		}
		typ = st.Mode & unix.S_IFMT
	}
	if typ != unix.S_IFBLK || unix.Major(st.Rdev) != 7 {
		return false
	}
	_, err := os.Stat(filepath.Join("/sys/dev/block", devNo(st.Rdev), "loop", "backing_file"))
	return os.IsNotExist(err)
}

func devNo(rdev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))
}
