// Package export makes the devices of a dmfuse daemon real block devices: a
// loop device with direct I/O over each device's file on the daemon's
// mount, and MAPPER/NAME, a symbolic link to the loop device's node, as
// udev leaves dm's /dev/mapper/NAME (mapper.go). The daemon owns them: a device's loop device is
// attached when its first table goes live, follows the live table's size,
// and is detached when the device is removed, whoever drives the device.
//
// Loops is the stack.Exporter a Manager consults: the number a device
// reports is its loop device's, the users of the loop device (mounts, open
// descriptors, holders) count towards the device's open count, a table
// argument naming the loop device or the link resolves to the device
// in-process, and a suspend freezes a file system mounted on it
// (freeze.go).
package export

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/stack"
)

// Loops exports the devices of a stack.Manager as loop devices.
type Loops struct {
	mgr    *stack.Manager
	mount  string // the daemon's mount point: device files are MOUNT/NAME
	mapper string // the folder of the links
	state  string // the file listing the links made, for a later cleanup
	logf   func(format string, a ...any)

	mu    sync.Mutex
	byDev map[*stack.Device]*export
	byNo  map[uint64]*stack.Device
}

// export is one device's block device.
type export struct {
	loop *loopDev
	node string // the link's name in the mapper folder ("" if none)
	ro   bool
	// frozen is the file system Freeze froze, nil if none.
	frozen *frozenFS
}

var _ stack.Exporter = (*Loops)(nil)

// New returns the exporter of mgr's devices, whose files are on mount,
// with links in mapper (created if missing). state is a file that lists the
// links made, so that Cleanup can remove them after a daemon died. logf
// receives what goes wrong outside a command (a link that cannot be made,
// a loop device that cannot be resized).
func New(mgr *stack.Manager, mount, mapper, state string, logf func(string, ...any)) (*Loops, error) {
	if err := os.MkdirAll(mapper, 0o755); err != nil {
		return nil, err
	}
	return &Loops{mgr: mgr, mount: mount, mapper: mapper, state: state, logf: logf,
		byDev: map[*stack.Device]*export{}, byNo: map[uint64]*stack.Device{}}, nil
}

// Block implements stack.Exporter: the loop device's number.
func (l *Loops) Block(d *stack.Device) (uint32, uint32, bool) {
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
// link, a new size is passed to the loop device, a new name renames the
// link, a new read-only mode sets the loop device's.
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

// Removed detaches d's loop device and removes its link (OnRemove of
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
	l.thawLocked(d.Name(), e)
	l.removeNode(e)
	if err := detachLoop(e.loop.path); err != nil {
		l.logf("%s: %v", d.Name(), err)
	}
}

// Cleanup clears what a daemon that died left behind: the links it listed
// in state (if they still have their loop device's number), the loop
// devices backed by files under mount (a file system still mounted on one
// is lazily unmounted, since its device is gone), and the mount itself. It
// returns one line per thing it did.
func Cleanup(mount, mapper, state string) []string {
	var did []string
	loops := LoopsUnder(mount)
	did = append(did, cleanupEntries(mapper, state)...)
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
