package dmexec

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control/dmioctl"
)

// The control node's number: misc major 10, MAPPER_CTRL_MINOR 236.
const (
	controlMajor = 10
	controlMinor = 236
)

// open answers an open, openat or openat2 (how: flags points at its struct
// open_how): an open of the control node gets a descriptor that answers DM
// ioctls, an open of a node of one of the daemon's devices a descriptor of
// the block device it is exported as, and every other open runs as made.
func (c *call) open(dirfd int32, pathAddr, flagsArg uint64, how bool) {
	flags := flagsArg
	if how {
		var b [8]byte
		if (mem{c: c, base: flagsArg}).ReadAt(b[:], 0) != nil {
			c.proceed()
			return
		}
		flags = le64(b[:])
	}
	path, err := c.cstring(pathAddr, unix.PathMax)
	if err != nil || path == "" {
		c.proceed()
		return
	}
	st, err := c.statIn(dirfd, path, flags&unix.O_NOFOLLOW == 0)
	if err != nil {
		c.proceed()
		return
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if unix.Major(st.Rdev) == controlMajor && unix.Minor(st.Rdev) == controlMinor {
			c.openControl(st, flags)
			return
		}
	case unix.S_IFBLK:
		if unix.Major(st.Rdev) == c.s.mgr.Major() {
			c.openDevice(st, unix.Minor(st.Rdev), flags)
			return
		}
	}
	c.proceed()
}

func le64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// statIn stats path as the caller would resolve it: from its root if
// absolute, else from its working directory (dirfd AT_FDCWD) or from the
// folder dirfd is open on, absolute symbolic links resolving inside the
// caller's root, in its mount namespace.
func (c *call) statIn(dirfd int32, path string, follow bool) (unix.Stat_t, error) {
	var st unix.Stat_t
	if !filepath.IsAbs(path) {
		base := fmt.Sprintf("/proc/%d/cwd", c.pid)
		if dirfd != unix.AT_FDCWD {
			base = fmt.Sprintf("/proc/%d/fd/%d", c.pid, dirfd)
		}
		dir, err := os.Readlink(base)
		if err != nil || !filepath.IsAbs(dir) {
			// A folder the caller cannot name from its root: walk from it
			// through the magic link.
			flags := 0
			if !follow {
				flags = unix.AT_SYMLINK_NOFOLLOW
			}
			err := unix.Fstatat(unix.AT_FDCWD, base+"/"+path, &st, flags)
			return st, err
		}
		path = filepath.Join(dir, path)
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", c.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(root)
	oflags := uint64(unix.O_PATH | unix.O_CLOEXEC)
	if !follow {
		oflags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Openat2(root, path, &unix.OpenHow{Flags: oflags, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstat(fd, &st)
	return st, err
}

// creds are the caller's file-system identity and capabilities, from
// /proc/TID/status.
type creds struct {
	fsuid, fsgid uint32
	groups       []uint32
	capEff       uint64
}

func (c *call) creds() (creds, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.pid))
	if err != nil {
		return creds{}, err
	}
	defer f.Close()
	var cr creds
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		switch {
		case k == "Uid" && len(fields) == 4:
			n, _ := strconv.ParseUint(fields[3], 10, 32)
			cr.fsuid = uint32(n)
		case k == "Gid" && len(fields) == 4:
			n, _ := strconv.ParseUint(fields[3], 10, 32)
			cr.fsgid = uint32(n)
		case k == "Groups":
			for _, g := range fields {
				n, _ := strconv.ParseUint(g, 10, 32)
				cr.groups = append(cr.groups, uint32(n))
			}
		case k == "CapEff" && len(fields) == 1:
			cr.capEff, _ = strconv.ParseUint(fields[0], 16, 64)
		}
	}
	return cr, sc.Err()
}

// capable reports whether the caller holds capability capBit.
func (cr creds) capable(capBit uint) bool { return cr.capEff&(1<<capBit) != 0 }

// mayOpen checks the permission bits of the node st for an open with
// flags, as the kernel checks them for the caller (CAP_DAC_OVERRIDE passes).
func (cr creds) mayOpen(st unix.Stat_t, flags uint64) bool {
	if cr.capable(unix.CAP_DAC_OVERRIDE) {
		return true
	}
	want := uint32(0)
	switch flags & unix.O_ACCMODE {
	case unix.O_RDONLY:
		want = 4
	case unix.O_WRONLY:
		want = 2
	default:
		want = 6
	}
	perm := st.Mode & 7
	switch {
	case st.Uid == cr.fsuid:
		perm = st.Mode >> 6 & 7
	case st.Gid == cr.fsgid || containsGroup(cr.groups, st.Gid):
		perm = st.Mode >> 3 & 7
	}
	return perm&want == want
}

func containsGroup(gs []uint32, g uint32) bool {
	for _, x := range gs {
		if x == g {
			return true
		}
	}
	return false
}

// openControl answers an open of the control node: a pipe whose read end
// the caller gets. Its DM ioctls are answered by the supervisor; it reads
// ready for poll while the control node would (DM_DEV_ARM_POLL).
func (c *call) openControl(st unix.Stat_t, flags uint64) {
	cr, err := c.creds()
	if err != nil {
		c.respond(0, unix.ESRCH)
		return
	}
	if !cr.mayOpen(st, flags) {
		c.respond(0, unix.EACCES)
		return
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		c.respond(0, errnoOf(err))
		return
	}
	unix.SetNonblock(p[1], true)
	var pst unix.Stat_t
	unix.Fstat(p[0], &pst)
	ctl := &control{file: dmioctl.NewFile(c.s.mgr), w: os.NewFile(uintptr(p[1]), "control")}
	c.s.mu.Lock()
	c.s.mu.controls[pst.Ino] = ctl
	c.s.mu.Unlock()
	c.installFD(p[0], flags&unix.O_CLOEXEC != 0)
	unix.Close(p[0])
}

// openDevice answers an open of a node of the daemon's device of minor
// minor: a descriptor of the block device it is exported as, opened with
// the caller's flags, through a node of the daemon's own that fstat knows.
func (c *call) openDevice(st unix.Stat_t, minor uint32, flags uint64) {
	cr, err := c.creds()
	if err != nil {
		c.respond(0, unix.ESRCH)
		return
	}
	if !cr.mayOpen(st, flags) {
		c.respond(0, unix.EACCES)
		return
	}
	d := c.s.mgr.LookupMinor(minor)
	if d == nil {
		c.respond(0, unix.ENXIO)
		return
	}
	maj, min, ok := c.s.mgr.Exported(d)
	if !ok {
		// No live table, so no block device to hand out.
		c.respond(0, unix.ENXIO)
		return
	}
	node, err := c.s.nodeFor(d, maj, min)
	if err != nil {
		c.s.logf("exec: node for %s: %v", d.Name(), err)
		c.respond(0, unix.ENXIO)
		return
	}
	keep := uint64(unix.O_ACCMODE | unix.O_DIRECT | unix.O_SYNC | unix.O_DSYNC | unix.O_EXCL | unix.O_NONBLOCK | unix.O_NOATIME | unix.O_LARGEFILE)
	fd, err := unix.Open(node, int(flags&keep)|unix.O_CLOEXEC, 0)
	if err != nil {
		c.respond(0, errnoOf(err))
		return
	}
	c.installFD(fd, flags&unix.O_CLOEXEC != 0)
	unix.Close(fd)
}

// errnoOf returns the errno of err (0 for nil), EIO if it has none.
func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.EIO
}
