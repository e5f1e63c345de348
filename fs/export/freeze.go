package export

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/stack"
)

// Ioctls of include/uapi/linux/fs.h that x/sys does not name.
const (
	fiFreeze = 0xc0045877 // FIFREEZE: _IOWR('X', 119, int)
	fiThaw   = 0xc0045878 // FITHAW: _IOWR('X', 120, int)
)

// frozenFS is a file system Freeze froze, held through a detached clone of
// its mount (open_tree with OPEN_TREE_CLONE): the clone is a mount of the
// same super block that no path reaches, so the file system may be
// unmounted where it was frozen and the super block stays alive, still
// frozen, until Thaw thaws it through the clone and lets the clone go. The
// kernel's dm freezes and thaws the block device's super block
// (bdev_freeze, bdev_thaw) and gets the same: an unmount between suspend
// and resume changes nothing. Thawing by path instead would reach the
// folder under the mount point and leave the super block frozen, and its
// block device held, for good.
type frozenFS struct {
	tree  int    // the detached clone of the mount
	root  int    // its root, opened: the descriptor FIFREEZE and FITHAW take
	where string // the mount point it was frozen through
}

// freezeMount freezes the file system mounted at where. A file system
// frozen already (by someone else) is reported as errFrozen.
func freezeMount(where string) (*frozenFS, error) {
	tree, err := unix.OpenTree(unix.AT_FDCWD, where, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("freezing %s: open_tree: %w", where, err)
	}
	root, err := unix.Openat(tree, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(tree)
		return nil, fmt.Errorf("freezing %s: opening its clone: %w", where, err)
	}
	fz := &frozenFS{tree: tree, root: root, where: where}
	if err := unix.IoctlSetInt(root, fiFreeze, 0); err != nil {
		fz.release()
		if errors.Is(err, unix.EBUSY) {
			return nil, errFrozen
		}
		return nil, fmt.Errorf("freezing %s: %w", where, err)
	}
	return fz, nil
}

// errFrozen says that a file system was frozen already.
var errFrozen = errors.New("frozen already")

// thaw thaws the file system. One that is no longer frozen (someone thawed
// it with FITHAW of their own, as `fsfreeze -u` does) has nothing left to
// thaw: the kernel answers EINVAL, and thaw nil.
func (fz *frozenFS) thaw() error {
	if err := unix.IoctlSetInt(fz.root, fiThaw, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("thawing the file system frozen at %s: %w", fz.where, err)
	}
	return nil
}

// release lets the clone go: once the file system is unmounted everywhere
// else too, its super block is shut down and its block device released.
func (fz *frozenFS) release() {
	unix.Close(fz.root)
	unix.Close(fz.tree)
}

// Freeze implements stack.Exporter: it freezes the file system mounted on
// d's loop device (FIFREEZE through a clone of its mount, frozenFS), or
// syncs the loop device if none is, as bdev_freeze does for dm's lock_fs.
// A file system someone else froze already stays theirs to thaw.
func (l *Loops) Freeze(d *stack.Device) error {
	l.mu.Lock()
	e := l.byDev[d]
	l.mu.Unlock()
	if e == nil {
		return nil
	}
	mounts := MountsOf(e.loop.rdev)
	if len(mounts) == 0 {
		fd, err := unix.Open(e.loop.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("syncing %s: %w", e.loop.path, err)
		}
		defer unix.Close(fd)
		if err := unix.Fsync(fd); err != nil {
			return fmt.Errorf("syncing %s: %w", e.loop.path, err)
		}
		return nil
	}
	fz, err := freezeMount(mounts[0])
	if err == errFrozen {
		return nil
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	if e.frozen != nil {
		// Frozen by an earlier suspend whose thaw failed: this freeze
		// cannot have succeeded, so fz is of another super block.
		e.frozen.release()
	}
	e.frozen = fz
	l.mu.Unlock()
	return nil
}

// Thaw implements stack.Exporter: it thaws what Freeze froze, whether the
// file system is still mounted or not. When the thaw fails, the clone is
// kept, so that the next resume or the removal tries again.
func (l *Loops) Thaw(d *stack.Device) error {
	l.mu.Lock()
	e := l.byDev[d]
	var fz *frozenFS
	if e != nil {
		fz, e.frozen = e.frozen, nil
	}
	l.mu.Unlock()
	if fz == nil {
		return nil
	}
	if err := fz.thaw(); err != nil {
		l.mu.Lock()
		if e.frozen == nil {
			e.frozen = fz
		} else {
			fz.release()
		}
		l.mu.Unlock()
		return err
	}
	fz.release()
	return nil
}

// thawLocked thaws what e has frozen, if anything, when its device goes,
// and lets the clone go even if the thaw failed, so that the loop device
// is freed. The caller holds l.mu.
func (l *Loops) thawLocked(name string, e *export) {
	if e.frozen == nil {
		return
	}
	if err := e.frozen.thaw(); err != nil {
		l.logf("%s: %v", name, err)
	}
	e.frozen.release()
	e.frozen = nil
}
