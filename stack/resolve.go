package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DevArg is a device argument resolved, by the rules of the device
// arguments of tables (a mapped device's name, MAJOR:MINOR or a path), to
// what identifies the device it names, without opening it: dm's dev_t. A
// target that takes a device in a message (multipath's fail_path) finds
// which of the devices its table opened it names with Matches.
type DevArg struct {
	arg    string
	mapped string // a mapped device name
	rdev   uint64 // MAJOR:MINOR as given, or a block device node's number; 0 if none
	dev    uint64 // st_dev and st_ino of a file or block device node
	ino    uint64
	stated bool
	abs    string // the path made absolute
}

// ResolveDevArg resolves a device argument. A relative path is made
// absolute against the daemon's working directory. It fails for a
// MAJOR:MINOR out of range ("bad MAJOR:MINOR") and for a path that cannot
// be made absolute or does not exist (the error of stat), with the reason
// alone: the caller names the argument in its own words.
func ResolveDevArg(arg string) (DevArg, error) {
	k := DevArg{arg: arg}
	if mm := majMin.FindStringSubmatch(arg); mm != nil {
		maj, err1 := strconv.ParseUint(mm[1], 10, 32)
		min, err2 := strconv.ParseUint(mm[2], 10, 32)
		if err1 != nil || err2 != nil {
			return k, errors.New("bad MAJOR:MINOR")
		}
		k.rdev = unix.Mkdev(uint32(maj), uint32(min))
		return k, nil
	}
	if !strings.Contains(arg, "/") {
		k.mapped = arg
		return k, nil
	}
	p, err := filepath.Abs(arg)
	if err != nil {
		return k, err
	}
	k.abs = p
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return k, err
	}
	k.stated, k.dev, k.ino = true, st.Dev, st.Ino
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		k.rdev = st.Rdev
	}
	return k, nil
}

// Matches reports whether d, a device a table opened, is the device k
// names: the same mapped device (by name or number), the same block device,
// or the same file.
func (k DevArg) Matches(d BlockDevice) bool {
	switch d := d.(type) {
	case *mappedRef:
		return k.mapped != "" && d.Device.Name() == k.mapped || k.rdev != 0 && k.rdev == unix.Mkdev(d.major, d.minor)
	case *fileDev:
		var st unix.Stat_t
		if err := unix.Fstat(d.fd, &st); err != nil {
			return d.name == k.arg || d.name == k.abs
		}
		if k.rdev != 0 && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == k.rdev {
			return true
		}
		return k.stated && st.Dev == k.dev && st.Ino == k.ino
	}
	return d.Name() == k.arg || k.abs != "" && d.Name() == k.abs
}

var majMin = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)

// openArg resolves one device argument of a table of device self: a name
// without '/' is a mapped device, MAJOR:MINOR a block device (253:N the
// mapped device of minor N), anything else a path (relative to dir). A
// block device or path that another device of m is exported as resolves to
// that device in-process. With ManagerOptions.Open set, every argument that
// names no device of m goes to it instead.
func (m *Manager) openArg(self *Device, arg string, ro bool, dir string) (BlockDevice, error) {
	mm := majMin.FindStringSubmatch(arg)
	var maj, min uint64
	if mm != nil {
		maj, _ = strconv.ParseUint(mm[1], 10, 32)
		min, _ = strconv.ParseUint(mm[2], 10, 32)
	}
	if mm != nil && maj == uint64(m.major) || mm == nil && !strings.Contains(arg, "/") {
		if bd, ok, err := m.openMapped(self, arg, mm != nil, uint32(min)); ok {
			return bd, err
		}
		if m.open == nil {
			return nil, Errorf("Device lookup failed: %s: no such mapped device", arg)
		}
	}
	if m.open != nil {
		return m.open(arg)
	}
	if mm != nil {
		if e := m.getExporter(); e != nil {
			if d := e.Lookup(uint32(maj), uint32(min)); d != nil {
				return m.useExported(self, d, arg)
			}
		}
		bd, err := OpenFile(blockNode(uint32(maj), uint32(min)), arg, ro)
		if err != nil {
			return nil, lookupFailed(arg, err)
		}
		return bd, nil
	}
	p := arg
	if !filepath.IsAbs(p) && dir != "" {
		p = filepath.Join(dir, p)
	}
	p, err := filepath.Abs(p)
	if err != nil {
		return nil, Errorf("Device lookup failed: %s: %v", arg, err)
	}
	if d := m.exportedAt(p); d != nil {
		return m.useExported(self, d, arg)
	}
	bd, err := OpenFile(p, p, ro)
	if err != nil {
		return nil, lookupFailed(arg, err)
	}
	return bd, nil
}

// openMapped resolves arg to the device of m called arg, or with byMinor
// to the device of that minor; ok is false when there is none.
func (m *Manager) openMapped(self *Device, arg string, byMinor bool, minor uint32) (bd BlockDevice, ok bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.byName[arg]
	if byMinor {
		d = m.byMinor[minor]
	}
	if d == nil {
		return nil, false, nil
	}
	bd, err = m.useMapped(self, d)
	return bd, true, err
}

func unwrapPath(err error) error {
	if pe, ok := err.(interface{ Unwrap() error }); ok {
		if e := pe.Unwrap(); e != nil {
			return e
		}
	}
	return err
}

// useMapped checks that d may be stacked on by self's table and counts the
// table as a holder of d. The caller holds m.mu, so that Remove, which checks
// the holders under m.mu, never removes a device a new table just took.
func (m *Manager) useMapped(self, d *Device) (BlockDevice, error) {
	if d == self {
		return nil, Errorf("table may not reference the device itself")
	}
	if d.dependsOn(self) {
		return nil, Errorf("%s already stacks on %s: a loop", d.Name(), self.Name())
	}
	if d.Live() == nil && d.Inactive() == nil {
		return nil, Errorf("Device lookup failed: %s has no live table", d.Name())
	}
	d.holders.Add(1)
	return &mappedRef{Device: d}, nil
}

func (r *mappedRef) mapped() *Device { return r.Device }

// mappedRef is a table's reference to another mapped device; it counts as a
// holder of that device until the table closes.
type mappedRef struct {
	*Device
	closed bool
}

// Name is how a table prints the device: by its number, as the kernel's
// tables name every device (format_dev_t), so that the text names the same
// device whatever it is called later.
func (r *mappedRef) Name() string { return r.Device.DevNo() }

func (r *mappedRef) Close() error {
	if !r.closed {
		r.closed = true
		r.Device.holders.Add(-1)
	}
	return nil
}

// dependsOn reports whether d's live or inactive table stacks, directly or
// not, on other.
func (d *Device) dependsOn(other *Device) bool {
	seen := map[*Device]bool{}
	var walk func(x *Device) bool
	walk = func(x *Device) bool {
		if x == other {
			return true
		}
		if seen[x] {
			return false
		}
		seen[x] = true
		for _, t := range []*Table{x.Live(), x.Inactive()} {
			if t == nil {
				continue
			}
			for _, dep := range t.deps {
				if walk(dep) {
					return true
				}
			}
		}
		return false
	}
	return walk(d)
}

// useExported is useMapped for a device argument that names the block
// device another device of m is exported as (/dev/mapper/NAME, /dev/loopN
// or its MAJOR:MINOR): it resolves in-process, with no round trip through
// the block device.
func (m *Manager) useExported(self, d *Device, arg string) (BlockDevice, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d.isRemoved() || m.byName[d.Name()] != d {
		return nil, Errorf("Device lookup failed: %s: no such mapped device", arg)
	}
	return m.useMapped(self, d)
}

// exported returns the device exported as the block device at path or of
// number major:minor, nil if none.
func (m *Manager) exportedAt(path string) *Device {
	e := m.getExporter()
	if e == nil {
		return nil
	}
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	return e.Lookup(unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// lookupFailed is the error of a device argument that could not be opened:
// "Device lookup failed: ARG: reason", with EBUSY kept (a device held
// exclusively elsewhere, as dm_get_device answers) and EINVAL otherwise.
func lookupFailed(arg string, err error) error {
	e := &ArgError{Reason: fmt.Sprintf("Device lookup failed: %s: %v", arg, unwrapPath(err))}
	if errors.Is(err, syscall.EBUSY) {
		e.Errno = syscall.EBUSY
	}
	return e
}

// StorageKey returns what identifies the storage behind dev, so that two
// devices can be compared as the kernel compares block devices by number:
// the same mapped device, block device or file opened twice gives the same
// key (the device itself, a block device's number, a file's device and
// inode); any other device is its own key.
func StorageKey(dev BlockDevice) any {
	type fileKey struct{ dev, ino, rdev uint64 }
	switch d := dev.(type) {
	case *mappedRef:
		return d.Device
	case *Device:
		return d
	case *fileDev:
		var st unix.Stat_t
		if unix.Fstat(d.fd, &st) != nil {
			return d
		}
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			return fileKey{rdev: st.Rdev}
		}
		return fileKey{dev: st.Dev, ino: st.Ino}
	}
	return dev
}

// blockNode returns a path to the block device major:minor: udev's
// /dev/block/MAJOR:MINOR where it exists, else the node devtmpfs made under
// the kernel's name for it (DEVNAME of its uevent in sysfs), as on a
// machine where no udev runs; the first if neither is there.
func blockNode(major, minor uint32) string {
	byNumber := fmt.Sprintf("/dev/block/%d:%d", major, minor)
	if _, err := os.Stat(byNumber); err == nil {
		return byNumber
	}
	uevent, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", major, minor))
	if err != nil {
		return byNumber
	}
	for _, line := range strings.Split(string(uevent), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			p := filepath.Join("/dev", name)
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == unix.Mkdev(major, minor) {
				return p
			}
		}
	}
	return byNumber
}
