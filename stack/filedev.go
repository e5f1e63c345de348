package stack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fileDev is a backing file or block device, used with pread/pwrite, fdatasync
// and fallocate (ioctls for block devices).
type fileDev struct {
	f      *os.File
	fd     int
	name   string // as table prints it: absolute path or MAJOR:MINOR
	size   int64
	block  bool
	memory bool // a file in memory (tmpfs, ramfs): a sync never waits for a disk
	// asyncRead: io_uring reads the file without a worker thread (the
	// file's system takes non-blocking reads: a block device, ext4, xfs,
	// btrfs), which FileRead needs to beat pread.
	asyncRead bool
	rdev      uint64 // a block device's number
	// mm is the file mapped in memory (filemap.go): a file in memory
	// (tmpfs, ramfs) up to maxMapped, whose reads and plain writes are
	// copies from and into it; nil otherwise.
	mm []byte
	// excl is the device's exclusive claim, writable, for discards and
	// write-zeroes (claim.go); -1 for a file or a read-only device.
	excl   int
	limits Limits
	key    any // DeviceKey's answer
}

var (
	_ BlockDevice = (*fileDev)(nil)
	_ Limiter     = (*fileDev)(nil)
)

// OpenFile opens a regular file or a block device as a BlockDevice. name is
// how tables print it. A block device is held exclusively (O_EXCL, one
// claim per device and process, shared by every handle OpenFile returns
// for it) until its last handle is closed; one someone else holds
// exclusively, such as a mounted file system's, fails with EBUSY.
func OpenFile(path, name string, readOnly bool) (BlockDevice, error) {
	flags := os.O_RDWR
	if readOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	// A regular file takes both, as a loop device over it does
	// (drivers/block/loop.c advertises discard and write-zeroes for files
	// whose file system has fallocate; fileDev falls back by itself where
	// ZERO_RANGE is missing). A block device takes what its queue says.
	d := &fileDev{f: f, fd: int(f.Fd()), name: name, excl: -1, limits: Limits{Discard: true, WriteZeroes: true}}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		d.key = fileKey{dev: sys.Dev, ino: sys.Ino}
	}
	switch {
	case st.Mode().IsRegular():
		d.size = st.Size()
		var fs unix.Statfs_t
		if unix.Fstatfs(d.fd, &fs) == nil {
			d.memory = fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.RAMFS_MAGIC
			if d.memory {
				d.mm = mapFile(d.fd, d.size, readOnly)
			}
			switch fs.Type {
			case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC:
				d.asyncRead = true
			}
		}
	case st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0:
		var sz uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&sz))); e != 0 {
			f.Close()
			return nil, fmt.Errorf("%s: BLKGETSIZE64: %w", path, e)
		}
		d.size, d.block, d.asyncRead = int64(sz), true, true
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			d.rdev = sys.Rdev
			d.key = blockKey(sys.Rdev)
			d.limits = blockLimits(unix.Major(uint64(sys.Rdev)), unix.Minor(uint64(sys.Rdev)))
			// Tables print a block device by its number, as the kernel's
			// do, whatever path named it.
			d.name = fmt.Sprintf("%d:%d", unix.Major(uint64(sys.Rdev)), unix.Minor(uint64(sys.Rdev)))
		}
		// Held exclusively while a table uses it, as dm holds it (claim.go).
		if d.excl, err = claimBlock(d.fd, d.rdev); err != nil {
			f.Close()
			return nil, &os.PathError{Op: "claim", Path: path, Err: err}
		}
	default:
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file or block device", path)
	}
	return d, nil
}

func (d *fileDev) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if m := d.mapped(off, len(p)); m != nil && copyMapped(p, m) {
		return len(p), nil
	}
	if d.block {
		// A block device's read sleeps until the disk answers; a regular
		// file's is usually a copy from the page cache.
		Waiting(ctx)
	}
	n := 0
	for n < len(p) {
		k, err := unix.Pread(d.fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			// Past the end of a backing file that shrank: reads as zeros,
			// as a sparse hole would.
			clear(p[n:])
			return len(p), nil
		}
		n += k
	}
	return n, nil
}

// WriteAt writes with pwrite; a write marked FUA (WithFUA) is written with
// RWF_DSYNC, so that it is on stable media when it returns.
func (d *fileDev) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	fua := FUA(ctx)
	if m := d.mapped(off, len(p)); !fua && m != nil && copyMapped(m, p) {
		return len(p), nil
	}
	if d.block || fua && !d.memory {
		// A durable write to a file waits for its disk.
		Waiting(ctx)
	}
	n := 0
	for n < len(p) {
		var k int
		var err error
		if fua {
			k, err = unix.Pwritev2(d.fd, [][]byte{p[n:]}, off+int64(n), unix.RWF_DSYNC)
		} else {
			k, err = unix.Pwrite(d.fd, p[n:], off+int64(n))
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

func (d *fileDev) Flush(ctx context.Context) error {
	if !d.memory {
		Waiting(ctx)
	}
	for {
		err := unix.Fdatasync(d.fd)
		if err != unix.EINTR {
			return err
		}
	}
}

// blockRange issues BLKDISCARD or BLKZEROOUT for n bytes at off, from the
// exclusive claim where there is one (claim.go).
func (d *fileDev) blockRange(req uint, off, n int64) error {
	fd := d.fd
	if d.excl >= 0 {
		fd = d.excl
	}
	r := [2]uint64{uint64(off), uint64(n)}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&r))); e != 0 {
		return e
	}
	return nil
}

func (d *fileDev) Discard(_ context.Context, off, n int64) error {
	if d.block {
		return d.blockRange(unix.BLKDISCARD, off, n)
	}
	return unix.Fallocate(d.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

func (d *fileDev) WriteZeroes(_ context.Context, off, n int64) error {
	if d.block {
		return d.blockRange(unix.BLKZEROOUT, off, n)
	}
	err := unix.Fallocate(d.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == unix.EOPNOTSUPP {
		// tmpfs and others: punch a hole (reads back zeros), then allocate
		// it again so later writes do not fail for lack of space.
		if err = unix.Fallocate(d.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err == nil {
			_ = unix.Fallocate(d.fd, unix.FALLOC_FL_KEEP_SIZE, off, n)
		}
	}
	return err
}

// blockLimits reads the discard and write-zeroes limits of block device
// major:minor from sysfs (a partition's are its disk's). A limit that
// cannot be read counts as taken: the ioctl then answers for itself.
func blockLimits(major, minor uint32) Limits {
	dir := fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Join(dir, "..")
	}
	taken := func(attr string) bool {
		b, err := os.ReadFile(filepath.Join(dir, "queue", attr))
		if err != nil {
			return true
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return err != nil || v > 0
	}
	return Limits{Discard: taken("discard_max_bytes"), WriteZeroes: taken("write_zeroes_max_bytes")}
}

// Limits implements Limiter.
func (d *fileDev) Limits() Limits { return d.limits }

func (d *fileDev) Size() int64  { return d.size }
func (d *fileDev) Name() string { return d.name }

// Close closes the file and, for a block device, drops its claim.
func (d *fileDev) Close() error {
	if d.block {
		releaseBlock(d.rdev)
	}
	if d.mm != nil {
		unix.Munmap(d.mm)
		d.mm = nil
	}
	return d.f.Close()
}

// fileKey and blockKey are the identities of a regular file and of a block
// device (DeviceKey).
type (
	fileKey  struct{ dev, ino uint64 }
	blockKey uint64
)

// DeviceKey returns a comparable value that two BlockDevices share exactly
// when they are the same device, however a table named them: a mapped
// device of the manager (by name, number, or its exported block device),
// a block device (by number) or a regular file (by file system and inode).
// Any other BlockDevice is its own key. Targets that must tell devices
// apart use it, as the kernel compares struct block_device pointers (a
// snapshot's origin and COW device).
func DeviceKey(bd BlockDevice) any {
	if d, ok := MappedDevice(bd); ok {
		return d
	}
	if f, ok := bd.(*fileDev); ok && f.key != nil {
		return f.key
	}
	return bd
}
