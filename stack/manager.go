package stack

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// DefaultMajor is the block major dmfuse's devices report unless
// ManagerOptions.Major gives another: the first of the majors Linux keeps for
// local and experimental use (240-254, Documentation/admin-guide/devices.txt),
// which the kernel hands out to drivers that ask for a dynamic major last
// (it counts down from 254). device-mapper itself takes a dynamic major (253
// on most machines, zram's on some), so no fixed number is the kernel's.
const DefaultMajor = 240

// DeviceError is a failed control operation on one device; it prints as
// "NAME: line N: TARGET: reason", the parts that apply.
type DeviceError struct {
	Name string
	Err  error
}

func (e *DeviceError) Error() string {
	if e.Name == "" {
		return e.Err.Error()
	}
	return e.Name + ": " + e.Err.Error()
}

func (e *DeviceError) Unwrap() error { return e.Err }

// Manager owns the devices of one daemon: their names, minors and the
// dependency graph, and resolves device arguments in tables. It is built
// whole from ManagerOptions; components that follow its devices subscribe
// to it (Subscribe).
type Manager struct {
	reg   *Registry
	clock Clock
	ctx   context.Context
	// major is the block major every device reports (ManagerOptions.Major).
	major uint32
	// core, open and memory are ManagerOptions.CoreMessage, Open and Memory.
	core   func(d *Device, args []string) (string, error)
	open   func(arg string) (BlockDevice, error)
	memory func(n int64)

	// shared holds what the targets share (Ctor.Shared); Close closes it.
	shared SharedSet

	// graph serialises building and installing tables, so that two
	// concurrent loads cannot make devices stack on each other in a loop. It
	// is taken after a device's control lock and before mu.
	graph sync.Mutex

	// global is device-mapper's global event number (dm_global_event_nr):
	// it moves on every device event and on every create, remove and
	// rename, and wakes the waiters of WaitGlobal.
	global  atomic.Uint32
	globalW eventWaiters

	mu      sync.Mutex
	byName  map[string]*Device
	byMinor map[uint32]*Device
	nextIno uint64
	// exporter, if set, exports devices as block devices (export.go).
	exporter Exporter
	// reaping is set while a goroutine removes deferred devices (deferred.go).
	reaping bool
	// listeners are the subscribers, in the order they subscribed
	// (listeners.go).
	listeners []*Listener
}

// ManagerOptions is what a Manager is built from.
type ManagerOptions struct {
	// Registry holds the target types tables may use (required).
	Registry *Registry
	// Clock is the clock of the devices' accounting; nil is
	// stats.SystemClock.
	Clock Clock
	// Context lives as long as the daemon: targets that run goroutines and
	// pending deferred removals end with it. nil is context.Background().
	Context context.Context

	// CoreMessage handles messages whose first word starts with `@` (dm's
	// core messages, such as `@stats_create`; DMStatsMessage answers
	// dm-stats'), for any device state. It is called without the device's
	// control lock, so it may suspend and resume the device itself. nil
	// fails every such message with "Unsupported message sent to DM core"
	// (EINVAL), except `@cancel_deferred_remove`, which the manager answers.
	CoreMessage func(d *Device, args []string) (string, error)

	// Open, when set, resolves the device arguments of every table the
	// manager builds that name none of its own devices, in place of its
	// lookup of paths and block devices, so that tables can be built over
	// devices that are not files (stacktest.Opener serves memory devices)
	// and still stack on the manager's devices. What it returns is closed
	// with the table if it has a Close method.
	Open func(arg string) (BlockDevice, error)

	// Memory, when set, is the daemon's account of the memory targets hold
	// beyond requests in flight (Ctor.Memory).
	Memory func(n int64)

	// Major is the block major the devices report, with their minor, from
	// their creation on (0: DefaultMajor); MAJOR:MINOR of that major names
	// the device of that minor in tables and requests.
	Major uint32
}

// NewManager returns a manager built from o.
func NewManager(o ManagerOptions) *Manager {
	if o.Registry == nil {
		panic("stack.NewManager: no Registry")
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	if o.Context == nil {
		o.Context = context.Background()
	}
	if o.Major == 0 {
		o.Major = DefaultMajor
	}
	return &Manager{reg: o.Registry, clock: o.Clock, ctx: o.Context, major: o.Major, core: o.CoreMessage, open: o.Open, memory: o.Memory,
		byName: map[string]*Device{}, byMinor: map[uint32]*Device{}, nextIno: 100}
}

// Registry returns the manager's target types.
func (m *Manager) Registry() *Registry { return m.reg }

// Major returns the block major the manager's devices report.
func (m *Manager) Major() uint32 { return m.major }

// ValidName checks that name can name a device: 1 to 127 bytes, none of the
// names the mount uses itself (stats, diskstats, ., ..), and no '/',
// whitespace, ',', ';' or ':'. The Manager takes names as given: control
// requests and config files are checked where they are read.
func ValidName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty device name")
	case len(name) > 127:
		return fmt.Errorf("device name %q: longer than 127 bytes", name)
	case name == "stats" || name == "diskstats" || name == "." || name == "..":
		return fmt.Errorf("device name %q: reserved", name)
	case strings.ContainsAny(name, "/,;: \t\n\r\v\f"):
		return fmt.Errorf("device name %q: must not contain '/', whitespace, ',', ';' or ':'", name)
	}
	return nil
}

// ValidUUID checks that uuid can be a device's uuid: at most 128 bytes, as
// dm's DM_UUID_LEN leaves room for; "" means none. Like names, uuids are
// checked where requests and config files are read.
func ValidUUID(uuid string) error {
	if len(uuid) > 128 {
		return errors.New("uuid longer than 128 bytes")
	}
	return nil
}

// Lookup finds a device by name.
func (m *Manager) Lookup(name string) *Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byName[name]
}

// LookupUUID finds a device by uuid (a non-empty one).
func (m *Manager) LookupUUID(uuid string) *Device {
	if uuid == "" {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.byName {
		if d.UUID() == uuid {
			return d
		}
	}
	return nil
}

// LookupMinor finds a device by minor.
func (m *Manager) LookupMinor(minor uint32) *Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byMinor[minor]
}

// GlobalEvent returns device-mapper's global event number: it moves on
// every device event and on every create, remove and rename, as
// dm_issue_global_event does, so that a poller of the control node wakes.
func (m *Manager) GlobalEvent() uint32 { return m.global.Load() }

// WaitGlobal blocks until the global event number differs from n or ctx
// ends, and returns it.
func (m *Manager) WaitGlobal(ctx context.Context, n uint32) uint32 {
	for {
		ch := m.globalW.channel()
		if g := m.global.Load(); g != n {
			return g
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return m.global.Load()
		}
	}
}

// raiseGlobal moves the global event number.
func (m *Manager) raiseGlobal() {
	m.global.Add(1)
	m.globalW.wake()
}

// Devices returns every device sorted by name (strcmp order).
func (m *Manager) Devices() []*Device {
	m.mu.Lock()
	out := make([]*Device, 0, len(m.byName))
	for _, d := range m.byName {
		out = append(out, d)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// NoSuchDevice is the error of a command naming a device that does not
// exist: "NAME: no such device" (ENXIO).
func NoSuchDevice(name string) error {
	return &DeviceError{Name: name, Err: &ArgError{Reason: "no such device", Errno: syscall.ENXIO}}
}

// acquire finds the device called name and takes its control lock; the
// caller unlocks d.ctl.
func (m *Manager) acquire(name string) (*Device, error) {
	d := m.Lookup(name)
	if d == nil {
		return nil, NoSuchDevice(name)
	}
	d.ctl.Lock()
	if d.isRemoved() || d.Name() != name {
		// Removed or renamed while we waited for the lock.
		d.ctl.Unlock()
		return nil, NoSuchDevice(name)
	}
	return d, nil
}

// acquireDev takes the control lock of d, which the caller found, unless it
// was removed meanwhile (then "no such device", ENXIO); the caller unlocks
// d.ctl.
func (m *Manager) acquireDev(d *Device) error {
	d.ctl.Lock()
	if d.isRemoved() {
		d.ctl.Unlock()
		return NoSuchDevice(d.Name())
	}
	return nil
}

// Flags are what dm passes with a control command as flags: the variants
// of Suspend, Resume, Remove and RemoveAll. A flag a verb does not take is
// ignored by it.
type Flags struct {
	// NoFlush (suspend, resume) keeps I/O that a target pushes back queued
	// until resume (DM_NOFLUSH_FLAG); it also skips freezing the file
	// system.
	NoFlush bool
	// NoLockFS (suspend, resume) skips freezing the file system on the
	// device's exported block device (DM_SKIP_LOCKFS_FLAG).
	NoLockFS bool
	// Force (remove) first replaces the live table with an error table of
	// the same size, as `dmsetup remove --force` does.
	Force bool
	// Deferred (remove, remove_all) flags a device that is in use for
	// removal once its last user is gone instead of failing with EBUSY
	// (DM_DEFERRED_REMOVE).
	Deferred bool
}

// teardown removes every device, upper devices before the ones they stack
// on, ignoring open handles (Close). Listeners are not told.
func (m *Manager) teardown() {
	for {
		devs := m.Devices()
		if len(devs) == 0 {
			return
		}
		progress := false
		for _, d := range devs {
			if d.holders.Load() == 0 {
				m.forceDrop(d, true)
				progress = true
			}
		}
		if !progress {
			for _, d := range devs {
				m.forceDrop(d, false)
			}
			return
		}
	}
}

// forceDrop removes d without any check, suspending it first if asked.
func (m *Manager) forceDrop(d *Device, suspend bool) {
	d.ctl.Lock()
	defer d.ctl.Unlock()
	if d.isRemoved() {
		return
	}
	if suspend {
		d.suspendLocked(false)
	}
	m.drop(d)
}

// Shared returns the objects the manager's targets share (Ctor.Shared), so
// that the daemon can set a target package's per-manager settings (such as
// thin.SetNoSpaceTimeout) before it builds tables.
func (m *Manager) Shared() *SharedSet { return &m.shared }

// Close removes every device, upper devices before the ones they stack on,
// ignoring open handles and without telling the listeners (daemon
// shutdown), then closes the objects their targets shared
// (SharedSet.Close). Tables loaded after Close cannot make shared objects.
func (m *Manager) Close() error {
	m.teardown()
	return m.shared.Close()
}
