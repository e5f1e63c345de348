// Package export makes the devices of a dmfuse daemon real block devices: a
// loop device with direct I/O over each device's file on the daemon's
// mount, and a node MAPPER/NAME with the loop device's number, as dm's
// /dev/mapper/NAME. The daemon owns them: a device's loop device is
// attached when its first table goes live, follows the live table's size,
// and is detached when the device is removed, whoever drives the device.
//
// Loops is the stack.Exporter a Manager consults: the number a device
// reports is its loop device's, the users of the loop device (mounts, open
// descriptors, holders) count towards the device's open count, a table
// argument naming the loop device or the node resolves to the device
// in-process, and a suspend freezes a file system mounted on it.
package export

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/stack"
)

// Ioctls of include/uapi/linux/fs.h that x/sys does not name.
const (
	fiFreeze = 0xc0045877 // FIFREEZE: _IOWR('X', 119, int)
	fiThaw   = 0xc0045878 // FITHAW: _IOWR('X', 120, int)
)

// Loops exports the devices of a stack.Manager as loop devices.
type Loops struct {
	mgr    *stack.Manager
	mount  string // the daemon's mount point: device files are MOUNT/NAME
	mapper string // the folder of the nodes
	state  string // the file listing the nodes made, for a later cleanup
	logf   func(format string, a ...any)
	gid    int // group of the nodes (disk)

	mu    sync.Mutex
	byDev map[*stack.Device]*export
	byNo  map[uint64]*stack.Device
}

// export is one device's block device.
type export struct {
	loop *loopDev
	node string // the node's name in the mapper folder ("" if none)
	ro   bool
	// frozen is the mount point Freeze froze, "" if none.
	frozen string
}

var _ stack.Exporter = (*Loops)(nil)

// New returns the exporter of mgr's devices, whose files are on mount,
// with nodes in mapper (created if missing). state is a file that lists the
// nodes made, so that Cleanup can remove them after a daemon died. logf
// receives what goes wrong outside a command (a node that cannot be made,
// a loop device that cannot be resized).
func New(mgr *stack.Manager, mount, mapper, state string, logf func(string, ...any)) (*Loops, error) {
	if err := os.MkdirAll(mapper, 0o755); err != nil {
		return nil, err
	}
	gid := 0
	if g, err := user.LookupGroup("disk"); err == nil {
		gid, _ = strconv.Atoi(g.Gid)
	}
	return &Loops{mgr: mgr, mount: mount, mapper: mapper, state: state, logf: logf, gid: gid,
		byDev: map[*stack.Device]*export{}, byNo: map[uint64]*stack.Device{}}, nil
}

// DevNo implements stack.Exporter: the loop device's number.
func (l *Loops) DevNo(d *stack.Device) (uint32, uint32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.byDev[d]; e != nil {
		return unix.Major(e.loop.rdev), unix.Minor(e.loop.rdev), true
	}
	return 0, 0, false
}

// Lookup implements stack.Exporter.
func (l *Loops) Lookup(major, minor uint32) *stack.Device {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byNo[unix.Mkdev(major, minor)]
}

// Users implements stack.Exporter: the loop device's users; the loop
// device's own handle of the device file is the exporter's.
func (l *Loops) Users(d *stack.Device) (int32, int32) {
	l.mu.Lock()
	e := l.byDev[d]
	l.mu.Unlock()
	if e == nil {
		return 0, 0
	}
	return e.loop.users(), 1
}

// Listener is what the exporter subscribes to its manager with
// (stack.Manager.Subscribe), after the fs layer: a device's loop device is
// attached after its file shows the new table, and detached before the
// file goes.
func (l *Loops) Listener() stack.Listener {
	return stack.Listener{OnChange: l.Changed, OnRemove: l.Removed}
}

// BlockDevice returns the loop device d is exported as ("" if none).
func (l *Loops) BlockDevice(d *stack.Device) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.byDev[d]; e != nil {
		return e.loop.path
	}
	return ""
}

// Changed follows a change of d's live table or name (OnChange of
// Listener): the first live table attaches a loop device and makes the
// node, a new size is passed to the loop device, a new name renames the
// node, a new read-only mode sets the loop device's.
func (l *Loops) Changed(d *stack.Device) {
	if d.Live() == nil || l.mgr.Lookup(d.Name()) != d {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byDev[d]
	name := d.Name()
	file := filepath.Join(l.mount, name)
	if e == nil {
		lp, err := attachLoop(file, d.ReadOnly())
		if err != nil {
			l.logf("%s: cannot attach a loop device: %v", name, err)
			return
		}
		e = &export{loop: lp, ro: d.ReadOnly()}
		l.byDev[d] = e
		l.byNo[lp.rdev] = d
		l.makeNode(e, name)
		return
	}
	if e.node != name {
		l.removeNode(e)
		l.makeNode(e, name)
	}
	// The kernel's inode size is refreshed by a stat (fs invalidated its
	// attributes); LOOP_SET_CAPACITY then reads it.
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err == nil {
		var bsz uint64
		if f, err := os.Open(e.loop.path); err == nil {
			bsz, _ = blockSize(f)
			f.Close()
		}
		if bsz != uint64(st.Size) {
			if err := setCapacity(e.loop.path); err != nil {
				l.logf("%s: %v", name, err)
			}
		}
	}
	if ro := d.ReadOnly(); ro != e.ro {
		if err := setReadOnly(e.loop.path, ro); err != nil {
			l.logf("%s: %v", name, err)
		}
		e.ro = ro
	}
}

// blockSize is BLKGETSIZE64.
func blockSize(f *os.File) (uint64, error) {
	return unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
}

// Removed detaches d's loop device and removes its node (OnRemove of
// Listener). A file system still frozen is thawed first.
func (l *Loops) Removed(d *stack.Device) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byDev[d]
	if e == nil {
		return
	}
	delete(l.byDev, d)
	delete(l.byNo, e.loop.rdev)
	l.thawLocked(e)
	l.removeNode(e)
	if err := detachLoop(e.loop.path); err != nil {
		l.logf("%s: %v", d.Name(), err)
	}
}

// makeNode makes MAPPER/name, a block node with the loop device's number,
// mode 0660, group disk, replacing whatever is there.
func (l *Loops) makeNode(e *export, name string) {
	p := filepath.Join(l.mapper, name)
	os.Remove(p)
	if err := unix.Mknod(p, unix.S_IFBLK|0o660, int(e.loop.rdev)); err != nil {
		l.logf("%s: %v", p, err)
		return
	}
	os.Chown(p, 0, l.gid)
	unix.Chmod(p, 0o660)
	e.node = name
	l.saveState()
}

// removeNode removes e's node if it is still the one made for it.
func (l *Loops) removeNode(e *export) {
	if e.node == "" {
		return
	}
	p := filepath.Join(l.mapper, e.node)
	var st unix.Stat_t
	if unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == e.loop.rdev {
		os.Remove(p)
	}
	e.node = ""
	l.saveState()
}

// saveState writes the nodes made, one "NAME MAJ:MIN LOOPDEV" per line.
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

// Freeze implements stack.Exporter: it freezes the file system mounted on
// d's loop device (FIFREEZE), or syncs the loop device if none is, as
// bdev_freeze does for dm's lock_fs. A file system someone else froze
// already stays theirs to thaw.
func (l *Loops) Freeze(d *stack.Device) error {
	l.mu.Lock()
	e := l.byDev[d]
	l.mu.Unlock()
	if e == nil {
		return nil
	}
	mounts := MountsOf(e.loop.rdev)
	if len(mounts) == 0 {
		f, err := os.OpenFile(e.loop.path, os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	}
	f, err := os.Open(mounts[0])
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), fiFreeze, 0); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil
		}
		return fmt.Errorf("freezing %s: %w", mounts[0], err)
	}
	l.mu.Lock()
	e.frozen = mounts[0]
	l.mu.Unlock()
	return nil
}

// Thaw implements stack.Exporter: it thaws what Freeze froze.
func (l *Loops) Thaw(d *stack.Device) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.byDev[d]; e != nil {
		l.thawLocked(e)
	}
}

func (l *Loops) thawLocked(e *export) {
	if e.frozen == "" {
		return
	}
	f, err := os.Open(e.frozen)
	if err == nil {
		err = unix.IoctlSetInt(int(f.Fd()), fiThaw, 0)
		f.Close()
	}
	if err != nil {
		l.logf("thawing %s: %v", e.frozen, err)
	}
	e.frozen = ""
}

// Cleanup clears what a daemon that died left behind: the nodes it listed
// in state (if they still have their loop device's number), the loop
// devices backed by files under mount (a file system still mounted on one
// is lazily unmounted, since its device is gone), and the mount itself. It
// returns one line per thing it did.
func Cleanup(mount, mapper, state string) []string {
	var did []string
	loops := LoopsUnder(mount)
	if b, err := os.ReadFile(state); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			maj, min, ok := parseDevNo(f[1])
			p := filepath.Join(mapper, f[0])
			var st unix.Stat_t
			if ok && unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == unix.Mkdev(maj, min) {
				if os.Remove(p) == nil {
					did = append(did, "removed "+p)
				}
			}
		}
		os.Remove(state)
	}
	for _, lp := range loops {
		for _, m := range MountsOf(lp.Rdev) {
			if unix.Unmount(m, unix.MNT_DETACH) == nil {
				did = append(did, fmt.Sprintf("unmounted %s (on %s)", m, lp.Path))
			}
		}
		if err := detachLoop(lp.Path); err == nil {
			did = append(did, "detached "+lp.Path)
		}
	}
	if Mounted(mount) {
		if err := unix.Unmount(mount, unix.MNT_DETACH); err == nil {
			did = append(did, "unmounted "+mount)
		}
	}
	return did
}
