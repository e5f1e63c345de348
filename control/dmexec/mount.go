package dmexec

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// mount answers mount(source, target, fstype, flags, data). A mount whose
// source is a node of one of the daemon's devices is made by the
// supervisor, in the caller's mount namespace, with the caller's root and
// working directory: for the length of the call the device's node is a
// bind mount of the loop device the device is exported as, so that the
// kernel opens that block device while the mount table keeps the source as
// the caller named it (/dev/mapper/NAME, /dev/VG/LV), which is what mount
// and umount, e2fsprogs and fsadm look for. Every other mount runs as made.
func (c *call) mount(sourceAddr, targetAddr, fstypeAddr, flags, dataAddr uint64) {
	if sourceAddr == 0 || flags&(unix.MS_BIND|unix.MS_MOVE|unix.MS_REMOUNT|unix.MS_SHARED|unix.MS_PRIVATE|unix.MS_SLAVE|unix.MS_UNBINDABLE) != 0 {
		c.proceed()
		return
	}
	source, err := c.cstring(sourceAddr, unix.PathMax)
	if err != nil || source == "" {
		c.proceed()
		return
	}
	st, err := c.statIn(unix.AT_FDCWD, source, true)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != c.s.mgr.Major() {
		c.proceed()
		return
	}
	target, err1 := c.cstring(targetAddr, unix.PathMax)
	fstype, err2 := c.cstring(fstypeAddr, 255)
	var data string
	var err3 error
	if dataAddr != 0 {
		data, err3 = c.cstring(dataAddr, 4095)
	}
	if err1 != nil || err2 != nil || err3 != nil {
		c.respond(0, unix.EFAULT)
		return
	}
	cr, err := c.creds()
	if err != nil || !cr.capable(unix.CAP_SYS_ADMIN) {
		c.respond(0, unix.EPERM)
		return
	}
	d := c.s.mgr.LookupMinor(unix.Minor(st.Rdev))
	if d == nil {
		c.respond(0, unix.ENXIO)
		return
	}
	maj, min, ok := c.s.mgr.Exported(d)
	if !ok {
		c.respond(0, unix.ENXIO)
		return
	}
	node, err := c.s.nodeFor(d, maj, min)
	if err != nil {
		c.respond(0, unix.ENXIO)
		return
	}
	if !c.valid() {
		return
	}
	err = c.inNamespace(func() error {
		// The node the source resolves to, as the caller resolves it.
		real, err := resolveHere(source)
		if err != nil {
			return err
		}
		if err := unix.Mount(node, real, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		defer unix.Unmount(real, unix.MNT_DETACH)
		return unix.Mount(source, target, fstype, uintptr(flags), data)
	})
	c.respond(0, errnoOf(err))
	if err == nil {
		c.s.logf("exec: mounted %s (%s) on %s", source, d.Name(), target)
	}
}

// inNamespace runs f on a thread of its own in the caller's mount
// namespace, with its root and working directory, and ends that thread.
func (c *call) inNamespace(f func() error) error {
	done := make(chan error, 1)
	go func() {
		// The thread is never given back: it leaves with the goroutine.
		runtime.LockOSThread()
		done <- func() error {
			root, err := unix.Open(fmt.Sprintf("/proc/%d/root", c.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(root)
			cwd, err := unix.Open(fmt.Sprintf("/proc/%d/cwd", c.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(cwd)
			ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", c.pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(ns)
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return err
			}
			if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Fchdir(root); err != nil {
				return err
			}
			if err := unix.Chroot("."); err != nil {
				return err
			}
			if err := unix.Fchdir(cwd); err != nil {
				return err
			}
			return f()
		}()
	}()
	return <-done
}

// resolveHere returns path with every symbolic link resolved, from this
// thread's root and working directory.
func resolveHere(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	return fdPath(fd)
}

// fdPath returns the path an O_PATH descriptor of this thread stands for.
func fdPath(fd int) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlink(fmt.Sprintf("/proc/thread-self/fd/%d", fd), buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
