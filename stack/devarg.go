package stack

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DevArg is a device argument resolved, by the rules of the device
// arguments of tables (a mapped device's name, 253:N, MAJOR:MINOR or a
// path), to what identifies the device it names, without opening it: dm's
// dev_t. A target that takes a device in a message (multipath's fail_path)
// finds which of the devices its table opened it names with Matches.
type DevArg struct {
	arg    string
	mapped string // a mapped device name
	minor  int64  // 253:N; -1 if not given so
	rdev   uint64 // a block device's number; 0 if none
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
	k := DevArg{arg: arg, minor: -1}
	if mm := majMin.FindStringSubmatch(arg); mm != nil {
		maj, err1 := strconv.ParseUint(mm[1], 10, 32)
		min, err2 := strconv.ParseUint(mm[2], 10, 32)
		if err1 != nil || err2 != nil {
			return k, errors.New("bad MAJOR:MINOR")
		}
		if maj == Major {
			k.minor = int64(min)
		} else {
			k.rdev = unix.Mkdev(uint32(maj), uint32(min))
		}
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
// names: the same mapped device, the same block device, or the same file.
func (k DevArg) Matches(d BlockDevice) bool {
	switch d := d.(type) {
	case *mappedRef:
		return k.mapped != "" && d.Name() == k.mapped || k.minor >= 0 && int64(d.Minor()) == k.minor
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
