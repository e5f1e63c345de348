package export

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The users of a block device, as the kernel's open count of a dm device
// sees them: a mounted file system, each open file descriptor on it, each
// device stacked on it (holders) and swap.

// openFDs counts the open file descriptors of every process on block
// device rdev (/proc/PID/fd), skipping the process self.
func openFDs(rdev uint64) int32 {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := fmt.Sprint(os.Getpid())
	var n int32
	for _, p := range procs {
		name := p.Name()
		if name[0] < '0' || name[0] > '9' || name == self {
			continue
		}
		dir := filepath.Join("/proc", name, "fd")
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(dir, fd.Name()))
			if err != nil || !strings.HasPrefix(link, "/dev/") && !strings.HasPrefix(link, nodeDirs) {
				continue
			}
			var st unix.Stat_t
			if unix.Stat(filepath.Join(dir, fd.Name()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == rdev {
				n++
			}
		}
	}
	return n
}

// nodeDirs is a folder besides /dev whose block nodes processes open block
// devices through: the nodes `dmfuse exec` hands out (SetNodeDir).
var nodeDirs = "/dev/"

// SetNodeDir makes the users of a loop device include the descriptors
// opened through the block nodes in dir.
func SetNodeDir(dir string) { nodeDirs = filepath.Clean(dir) + "/" }

// holders counts the devices stacked on block device dev (a kernel dm or
// md device on it), from /sys/block/NAME/holders.
func holders(dev string) int32 {
	ents, err := os.ReadDir(filepath.Join("/sys/block", filepath.Base(dev), "holders"))
	if err != nil {
		return 0
	}
	return int32(len(ents))
}

// swaps reports whether dev is in use as swap.
func swaps(dev string) bool {
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(l); len(f) > 0 && f[0] == dev {
			return true
		}
	}
	return false
}

// users counts the users of the loop device l.
func (l *loopDev) users() int32 {
	n := openFDs(l.rdev) + holders(l.path)
	if len(MountsOf(l.rdev)) > 0 || n == 0 && claimed(l.path) {
		// A file system mounted in another mount namespace (a command of
		// dmfuse exec's) is not in ours, but it claims the device.
		n++
	}
	if swaps(l.path) {
		n++
	}
	return n
}

// claimed reports whether someone holds block device dev exclusively (a
// mounted file system, an O_EXCL opener): an exclusive open fails with
// EBUSY.
func claimed(dev string) bool {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return err == unix.EBUSY
	}
	unix.Close(fd)
	return false
}
