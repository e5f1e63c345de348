package dmexec

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A stat of a descriptor the supervisor handed out for a device node says
// what a stat of the node says: the device's number, not the loop device's
// (lvm checks that an open device is the one it opened by its number).

// handedOut returns the device number of the node the caller's descriptor
// fd was opened from, and its stat, when it is one the supervisor handed
// out.
func (c *call) handedOut(fd int32) (st unix.Stat_t, no devNo, ok bool) {
	if unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", c.pid, fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return st, no, false
	}
	c.s.mu.Lock()
	no, ok = c.s.mu.byIno[st.Ino]
	c.s.mu.Unlock()
	return st, no, ok
}

// fstat answers fstat(fd, buf).
func (c *call) fstat(fd int32, buf uint64) {
	st, no, ok := c.handedOut(fd)
	if !ok {
		c.proceed()
		return
	}
	c.writeStat(st, no, buf)
}

// fstatat answers newfstatat(dirfd, path, buf, flags) with AT_EMPTY_PATH: a
// stat of dirfd when path is empty.
func (c *call) fstatat(dirfd int32, pathAddr, buf uint64) {
	if path, err := c.cstring(pathAddr, unix.PathMax); err != nil || path != "" {
		c.proceed()
		return
	}
	c.fstat(dirfd, buf)
}

func (c *call) writeStat(st unix.Stat_t, no devNo, buf uint64) {
	st.Rdev = unix.Mkdev(no.major, no.minor)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&st)), unsafe.Sizeof(st))
	if err := (mem{c: c, base: buf}).WriteAt(b, 0); err != nil {
		c.respond(0, unix.EFAULT)
		return
	}
	c.respond(0, 0)
}

// statx answers statx(dirfd, path, flags, mask, buf) with AT_EMPTY_PATH: of
// dirfd when path is empty.
func (c *call) statx(dirfd int32, pathAddr uint64, mask uint32, buf uint64) {
	if path, err := c.cstring(pathAddr, unix.PathMax); err != nil || path != "" {
		c.proceed()
		return
	}
	_, no, ok := c.handedOut(dirfd)
	if !ok {
		c.proceed()
		return
	}
	var sx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, fmt.Sprintf("/proc/%d/fd/%d", c.pid, dirfd), 0, int(mask), &sx); err != nil {
		c.respond(0, errnoOf(err))
		return
	}
	sx.Rdev_major, sx.Rdev_minor = no.major, no.minor
	b := unsafe.Slice((*byte)(unsafe.Pointer(&sx)), unsafe.Sizeof(sx))
	if err := (mem{c: c, base: buf}).WriteAt(b, 0); err != nil {
		c.respond(0, unix.EFAULT)
		return
	}
	c.respond(0, 0)
}
