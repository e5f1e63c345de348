package stack

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/dmarg"
	"golang.org/x/sys/unix"
)

// Message implements Messager (multipath_message).
func (m *multipath) Message(_ context.Context, args []string) (string, error) {
	m.mu.Lock()
	suspended := m.mu.suspended
	m.mu.Unlock()
	if suspended {
		return "", &ArgError{Reason: "multipath messages are refused while the device is suspended", Errno: syscall.EBUSY}
	}
	if len(args) == 1 {
		switch {
		case strings.EqualFold(args[0], "queue_if_no_path"):
			m.mu.Lock()
			m.setQueueIfNoPathLocked(true, false)
			m.mu.Unlock()
			return "", nil
		case strings.EqualFold(args[0], "fail_if_no_path"):
			m.mu.Lock()
			m.setQueueIfNoPathLocked(false, false)
			m.mu.Unlock()
			return "", nil
		}
	}
	if len(args) != 2 {
		return "", Errorf("Invalid multipath message arguments. Expected 2 arguments, got %d.", len(args))
	}
	verb, arg := args[0], args[1]
	switch {
	case strings.EqualFold(verb, "disable_group"), strings.EqualFold(verb, "enable_group"):
		pg, err := m.groupArg(verb, arg)
		if err != nil {
			return "", err
		}
		m.mu.Lock()
		pg.bypassed.Store(strings.EqualFold(verb, "disable_group"))
		m.currentPG.Store(nil)
		m.releaseLocked()
		m.mu.Unlock()
		m.event()
		return "", nil
	case strings.EqualFold(verb, "switch_group"):
		pg, err := m.groupArg(verb, arg)
		if err != nil {
			return "", err
		}
		m.mu.Lock()
		for _, g := range m.pgs {
			g.bypassed.Store(false)
		}
		m.currentPG.Store(nil)
		m.nextPG.Store(pg)
		m.releaseLocked()
		m.mu.Unlock()
		m.event()
		return "", nil
	case strings.EqualFold(verb, "fail_path"), strings.EqualFold(verb, "reinstate_path"):
		paths, err := m.pathsOn(arg)
		if err != nil {
			return "", err
		}
		if len(paths) == 0 {
			return "", Errorf("%s %s: no path of this multipath is on that device", strings.ToLower(verb), arg)
		}
		for _, pp := range paths {
			if strings.EqualFold(verb, "fail_path") {
				m.failPath(pp, nil)
			} else if err := m.reinstatePath(pp); err != nil {
				return "", err
			}
		}
		return "", nil
	}
	return "", Errorf("Unrecognised multipath message received: %s", verb)
}

// groupArg reads a 1-based group number (switch_pg_num, bypass_pg_num).
func (m *multipath) groupArg(verb, arg string) (*priorityGroup, error) {
	n, ok := dmarg.Uint32(arg) // sscanf "%u%c"
	if !ok || n == 0 || int(n) > len(m.pgs) {
		return nil, Errorf("invalid PG number supplied to %s: %q: 1..%d", strings.ToLower(verb), arg, len(m.pgs))
	}
	return m.pgs[n-1], nil
}

// pathsOn returns the paths on the device that arg names (action_dev). arg
// is first resolved as it is; if that names none of the paths and arg holds
// a backslash, it is resolved once more as the escaped form that table and
// status print (EscapeArg), which a caller may pass on without splitting it.
func (m *multipath) pathsOn(arg string) ([]*pgpath, error) {
	paths, err := m.pathsMatching(arg)
	if len(paths) == 0 && strings.Contains(arg, `\`) {
		if w := SplitArgs(arg); len(w) == 1 && w[0] != arg {
			if unesc, _ := m.pathsMatching(w[0]); len(unesc) > 0 {
				return unesc, nil
			}
		}
	}
	return paths, err
}

// pathsMatching returns the paths on the device arg resolves to.
func (m *multipath) pathsMatching(arg string) ([]*pgpath, error) {
	key, err := resolveMessageDev(arg)
	if err != nil {
		return nil, err
	}
	var out []*pgpath
	for _, pg := range m.pgs {
		for _, pp := range pg.paths {
			if key.matches(pp.dev) {
				out = append(out, pp)
			}
		}
	}
	return out, nil
}

// devKey identifies the device a message names, resolved by the rules of device
// arguments (Manager's open: a mapped device's name, 253:N, MAJOR:MINOR or a
// path) without opening it.
type devKey struct {
	arg    string
	mapped string // a mapped device name
	minor  int64  // 253:N; -1 if not given so
	rdev   uint64 // a block device's number; 0 if none
	dev    uint64 // st_dev and st_ino of a file or block device node
	ino    uint64
	stated bool
	abs    string // the path made absolute
}

// resolveMessageDev resolves the device argument of fail_path or
// reinstate_path. A relative path is made absolute against the daemon's
// working directory.
func resolveMessageDev(arg string) (devKey, error) {
	k := devKey{arg: arg, minor: -1}
	if mm := majMin.FindStringSubmatch(arg); mm != nil {
		maj, err1 := strconv.ParseUint(mm[1], 10, 32)
		min, err2 := strconv.ParseUint(mm[2], 10, 32)
		if err1 != nil || err2 != nil {
			return k, Errorf("message: error getting device %s: bad MAJOR:MINOR", arg)
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
		return k, Errorf("message: error getting device %s: %v", arg, err)
	}
	k.abs = p
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return k, Errorf("message: error getting device %s: %v", arg, err)
	}
	k.stated, k.dev, k.ino = true, st.Dev, st.Ino
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		k.rdev = st.Rdev
	}
	return k, nil
}

// matches reports whether the path device d is the device k names.
func (k devKey) matches(d BlockDevice) bool {
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
