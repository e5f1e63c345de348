package multipath

import (
	"context"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/dmarg"
	"github.com/dmfuse/dmfuse/stack"
)

// Message implements Messager (multipath_message).
func (m *multipath) Message(_ context.Context, args []string) (string, error) {
	m.mu.Lock()
	suspended := m.mu.suspended
	m.mu.Unlock()
	if suspended {
		return "", &stack.ArgError{Reason: "multipath messages are refused while the device is suspended", Errno: syscall.EBUSY}
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
		return "", stack.Errorf("Invalid multipath message arguments. Expected 2 arguments, got %d.", len(args))
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
			return "", stack.Errorf("%s %s: no path of this multipath is on that device", strings.ToLower(verb), arg)
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
	return "", stack.Errorf("Unrecognised multipath message received: %s", verb)
}

// groupArg reads a 1-based group number (switch_pg_num, bypass_pg_num).
func (m *multipath) groupArg(verb, arg string) (*priorityGroup, error) {
	n, ok := dmarg.Uint32(arg) // sscanf "%u%c"
	if !ok || n == 0 || int(n) > len(m.pgs) {
		return nil, stack.Errorf("invalid PG number supplied to %s: %q: 1..%d", strings.ToLower(verb), arg, len(m.pgs))
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
		if w := stack.SplitArgs(arg); len(w) == 1 && w[0] != arg {
			if unesc, _ := m.pathsMatching(w[0]); len(unesc) > 0 {
				return unesc, nil
			}
		}
	}
	return paths, err
}

// pathsMatching returns the paths on the device arg resolves to.
func (m *multipath) pathsMatching(arg string) ([]*pgpath, error) {
	key, err := stack.ResolveDevArg(arg)
	if err != nil {
		return nil, stack.Errorf("message: error getting device %s: %v", arg, err)
	}
	var out []*pgpath
	for _, pg := range m.pgs {
		for _, pp := range pg.paths {
			if key.Matches(pp.dev) {
				out = append(out, pp)
			}
		}
	}
	return out, nil
}
