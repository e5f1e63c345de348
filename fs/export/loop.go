package export

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Loop device flags (include/uapi/linux/loop.h).
const (
	loFlagsReadOnly = 1
	loFlagsDirectIO = 16
)

// loopDev is an attached loop device.
type loopDev struct {
	path string // /dev/loopN
	rdev uint64
}

// attachLoop attaches a free loop device to the file at path with direct
// I/O (LOOP_CONFIGURE with LO_FLAGS_DIRECT_IO, 512-byte blocks), read-only
// if ro. A loop device taken by someone else between LOOP_CTL_GET_FREE and
// LOOP_CONFIGURE is skipped.
//
// The file is opened with open(2) itself, not os.OpenFile: the Go runtime
// adds what os.OpenFile opens to its epoll set, and epoll_ctl on a FUSE
// file asks the FUSE server (FUSE_POLL), which for a file of the daemon's
// own mount is this process.
func attachLoop(path string, ro bool) (*loopDev, error) {
	flags := unix.O_RDWR
	if ro {
		flags = unix.O_RDONLY
	}
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/dev/loop-control", Err: err}
	}
	defer unix.Close(ctl)
	for tries := 0; ; tries++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lf, err := openLoop(dev, n)
		if err != nil {
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(fd), Size: 512}
		cfg.Info.Flags = loFlagsDirectIO
		if ro {
			cfg.Info.Flags |= loFlagsReadOnly
		}
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		var st unix.Stat_t
		if err == nil {
			err = unix.Fstat(int(lf.Fd()), &st)
		}
		if err == nil {
			// The block device's own read-only flag (BLKROSET) outlives
			// the loop device's attachments: one that a former user of
			// this loop device set would make it read-only still.
			err = blkROSet(int(lf.Fd()), ro)
		}
		lf.Close()
		if errors.Is(err, syscall.EBUSY) && tries < 16 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: LOOP_CONFIGURE: %w", dev, err)
		}
		return &loopDev{path: dev, rdev: st.Rdev}, nil
	}
}

// openLoop opens /dev/loopN, making the node if devtmpfs has not yet.
func openLoop(dev string, n int) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		if e := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); e == nil || errors.Is(e, os.ErrExist) {
			f, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		}
	}
	return f, err
}

// detachLoop detaches the loop device at dev (LOOP_CLR_FD). If something
// still has it open (a mount), the kernel detaches it at its last close.
func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, syscall.ENXIO) {
		return fmt.Errorf("%s: LOOP_CLR_FD: %w", dev, err)
	}
	return nil
}

// setCapacity makes the loop device at dev take its backing file's size
// again (LOOP_SET_CAPACITY).
func setCapacity(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("%s: LOOP_SET_CAPACITY: %w", dev, err)
	}
	return nil
}

// setReadOnly sets the loop device's read-only flag (BLKROSET).
func setReadOnly(dev string, ro bool) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := blkROSet(int(f.Fd()), ro); err != nil {
		return fmt.Errorf("%s: %w", dev, err)
	}
	return nil
}

// blkROSet sets the read-only flag of the block device open on fd.
func blkROSet(fd int, ro bool) error {
	v := int32(0)
	if ro {
		v = 1
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKROSET, uintptr(unsafe.Pointer(&v))); e != 0 {
		return fmt.Errorf("BLKROSET: %w", e)
	}
	return nil
}
