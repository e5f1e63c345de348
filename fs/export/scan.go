package export

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dmfuse/dmfuse/stack"
	"golang.org/x/sys/unix"
)

// The one reading of the kernel's tables of mounts (/proc/self/mountinfo)
// and loop devices (/sys/block/loop*) in dmfuse: the daemon, its cleanup
// after a dead daemon and the tests use these.

// Loop is an attached loop device.
type Loop struct {
	// Path is its node, /dev/loopN.
	Path string
	// Rdev is its device number.
	Rdev uint64
}

// mountinfo calls f with the fields of each line of /proc/self/mountinfo
// until f returns false.
func mountinfo(f func(fields []string) bool) {
	file, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer file.Close()
	s := bufio.NewScanner(file)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		if fs := strings.Fields(s.Text()); len(fs) > 4 && !f(fs) {
			return
		}
	}
}

// Mounted reports whether dir is a mount point.
func Mounted(dir string) bool {
	found := false
	mountinfo(func(f []string) bool {
		found = unescapeMount(f[4]) == dir
		return !found
	})
	return found
}

// MountsOf returns the mount points of the file systems on block device
// rdev.
func MountsOf(rdev uint64) []string {
	want := fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))
	var out []string
	mountinfo(func(f []string) bool {
		if f[2] == want {
			out = append(out, unescapeMount(f[4]))
		}
		return true
	})
	return out
}

// MountsOfPath returns the mount points of the file systems on the block
// device whose node is dev (none if dev is not a block device).
func MountsOfPath(dev string) []string {
	var st unix.Stat_t
	if unix.Stat(dev, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	return MountsOf(st.Rdev)
}

// unescapeMount undoes mountinfo's octal escapes of a path.
func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// LoopsUnder lists the loop devices whose backing file is dir or lies under
// it, from sysfs. Read it before dir's mount goes: the files of a detached
// mount show as relative paths.
func LoopsUnder(dir string) []Loop {
	var out []Loop
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		p := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if p != dir && !strings.HasPrefix(p, dir+"/") {
			continue
		}
		blk := filepath.Dir(filepath.Dir(m))
		devno, err := os.ReadFile(filepath.Join(blk, "dev"))
		if err != nil {
			continue
		}
		maj, min, ok := parseDevNo(strings.TrimSpace(string(devno)))
		if !ok {
			continue
		}
		out = append(out, Loop{Path: "/dev/" + filepath.Base(blk), Rdev: unix.Mkdev(maj, min)})
	}
	return out
}

// parseDevNo parses "MAJ:MIN".
func parseDevNo(s string) (uint32, uint32, bool) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, false
	}
	maj, err1 := strconv.ParseUint(a, 10, 32)
	min, err2 := strconv.ParseUint(b, 10, 32)
	return uint32(maj), uint32(min), err1 == nil && err2 == nil
}

// FreeMajor returns the block major the devices of a daemon report: the
// lowest of the majors Linux keeps for local use (240-254) that no driver
// holds in /proc/devices, stack.DefaultMajor if it cannot tell or all are
// taken. A driver loaded later asks the kernel for a dynamic major, which
// counts down from 254, so the lowest free one is the last it would take.
func FreeMajor() uint32 {
	b, err := os.ReadFile("/proc/devices")
	if err != nil {
		return stack.DefaultMajor
	}
	return freeMajor(string(b))
}

// freeMajor is FreeMajor over the text of /proc/devices.
func freeMajor(devices string) uint32 {
	_, block, _ := strings.Cut(devices, "Block devices:")
	used := map[uint64]bool{}
	for _, line := range strings.Split(block, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
				used[n] = true
			}
		}
	}
	for m := uint64(240); m <= 254; m++ {
		if !used[m] {
			return uint32(m)
		}
	}
	return stack.DefaultMajor
}
