package stack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// Major is the major number dmfuse devices report, as device-mapper's.
const Major = 253

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
	// manager builds in place of its own lookup of paths, MAJOR:MINOR and
	// mapped device names, so that tables can be built over devices that are
	// not files (stacktest.Opener serves memory devices). What it returns is
	// closed with the table if it has a Close method.
	Open func(arg string) (BlockDevice, error)

	// Memory, when set, is the daemon's account of the memory targets hold
	// beyond requests in flight (Ctor.Memory).
	Memory func(n int64)
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
	return &Manager{reg: o.Registry, clock: o.Clock, ctx: o.Context, core: o.CoreMessage, open: o.Open, memory: o.Memory,
		byName: map[string]*Device{}, byMinor: map[uint32]*Device{}, nextIno: 100}
}

// Registry returns the manager's target types.
func (m *Manager) Registry() *Registry { return m.reg }

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

// CreateOptions describes a device to create.
type CreateOptions struct {
	// Name and UUID must pass ValidName and ValidUUID.
	Name, UUID string
	// Minor is the minor to use; negative picks the lowest free one.
	Minor    int
	ReadOnly bool
	// Table is the table text; empty with NoTable creates a device without one.
	Table   string
	NoTable bool
	// Dir is the folder relative device paths are resolved against.
	Dir string
}

// Create makes a device and, unless NoTable, loads and resumes its table. It
// is all-or-nothing: on any failure nothing is left behind.
func (m *Manager) Create(o CreateOptions) (*Device, error) {
	var lines []Line
	if !o.NoTable {
		var err error
		if lines, err = ParseTable(o.Table); err != nil {
			return nil, &DeviceError{Name: o.Name, Err: err}
		}
	}
	m.mu.Lock()
	if _, ok := m.byName[o.Name]; ok {
		m.mu.Unlock()
		return nil, &DeviceError{Name: o.Name, Err: &ArgError{Reason: "device already exists", Errno: syscall.EBUSY}}
	}
	if o.UUID != "" {
		for _, d := range m.byName {
			if d.UUID() == o.UUID {
				m.mu.Unlock()
				return nil, &DeviceError{Name: o.Name, Err: &ArgError{Reason: "uuid " + o.UUID + " already in use", Errno: syscall.EBUSY}}
			}
		}
	}
	minor := uint32(0)
	if o.Minor >= 0 {
		minor = uint32(o.Minor)
		if _, ok := m.byMinor[minor]; ok {
			m.mu.Unlock()
			return nil, &DeviceError{Name: o.Name, Err: &ArgError{Reason: fmt.Sprintf("minor %d already in use", minor), Errno: syscall.EBUSY}}
		}
	} else {
		for m.byMinor[minor] != nil {
			minor++
		}
	}
	m.nextIno++
	d := newDevice(o.Name, o.UUID, minor, m.nextIno, o.ReadOnly, m.clock)
	d.onChange = m.changed
	// Nobody can run a control operation on d before its table is live.
	d.ctl.Lock()
	m.byName[o.Name] = d
	m.byMinor[minor] = d
	m.mu.Unlock()

	if !o.NoTable {
		m.graph.Lock()
		t, err := m.build(d, lines, o.ReadOnly, o.Dir)
		if err == nil {
			d.loadLocked(t)
		}
		m.graph.Unlock()
		if err == nil {
			_, err = d.resumeLocked()
		}
		if err != nil {
			m.unlink(d)
			d.destroy()
			d.ctl.Unlock()
			return nil, &DeviceError{Name: o.Name, Err: err}
		}
	}
	d.ctl.Unlock()
	if !o.NoTable {
		m.changed(d)
	}
	return d, nil
}

// unlink takes d out of the manager's maps.
func (m *Manager) unlink(d *Device) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unlinkLocked(d)
}

func (m *Manager) unlinkLocked(d *Device) {
	name := d.Name()
	if m.byName[name] == d {
		delete(m.byName, name)
	}
	if m.byMinor[d.minor] == d {
		delete(m.byMinor, d.minor)
	}
}

// Build parses and constructs a table for device d without loading it.
func (m *Manager) Build(d *Device, text string, dir string) (*Table, error) {
	lines, err := ParseTable(text)
	if err != nil {
		return nil, err
	}
	return m.build(d, lines, d.ReadOnly(), dir)
}

func (m *Manager) build(d *Device, lines []Line, ro bool, dir string) (*Table, error) {
	open := m.open
	if open == nil {
		open = func(arg string) (BlockDevice, error) { return m.openArg(d, arg, ro, dir) }
	}
	return Build(lines, BuildOptions{
		Registry: m.reg, ReadOnly: ro, Clock: m.clock, Context: m.ctx, Previous: d.Live(), Event: d.RaiseEvent, Memory: m.memory, Shared: &m.shared,
		Open: open, Device: d,
	})
}

var majMin = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)

// openArg resolves one device argument of a table of device self: MAJOR:MINOR
// (253:N is the mapped device of minor N), a name without '/' (a mapped
// device), or a path (relative to dir).
func (m *Manager) openArg(self *Device, arg string, ro bool, dir string) (BlockDevice, error) {
	if mm := majMin.FindStringSubmatch(arg); mm != nil {
		maj, _ := strconv.ParseUint(mm[1], 10, 32)
		min, _ := strconv.ParseUint(mm[2], 10, 32)
		if maj == Major {
			m.mu.Lock()
			defer m.mu.Unlock()
			d := m.byMinor[uint32(min)]
			if d == nil {
				return nil, Errorf("Device lookup failed: %s: no such mapped device", arg)
			}
			return m.useMapped(self, d)
		}
		if e := m.getExporter(); e != nil {
			if d := e.Lookup(uint32(maj), uint32(min)); d != nil {
				return m.useExported(self, d, arg)
			}
		}
		bd, err := OpenFile(fmt.Sprintf("/dev/block/%d:%d", maj, min), arg, ro)
		if err != nil {
			return nil, lookupFailed(arg, err)
		}
		return bd, nil
	}
	if !strings.Contains(arg, "/") {
		m.mu.Lock()
		defer m.mu.Unlock()
		d := m.byName[arg]
		if d == nil {
			return nil, Errorf("Device lookup failed: %s: no such mapped device", arg)
		}
		return m.useMapped(self, d)
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
	if d.Live() == nil {
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

// Lookup finds a device by name.
func (m *Manager) Lookup(name string) *Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byName[name]
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

// Load builds a table for the device called name from text and puts it in the
// inactive slot, replacing any table there (drivers/md/dm-ioctl.c: table_load).
// Constructors run now, so argument errors are reported now; on failure an
// older inactive table is kept. Relative paths in text resolve against dir.
func (m *Manager) Load(name, text, dir string) error {
	lines, err := ParseTable(text)
	if err != nil {
		return &DeviceError{Name: name, Err: err}
	}
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	defer d.ctl.Unlock()
	m.graph.Lock()
	t, err := m.build(d, lines, d.ReadOnly(), dir)
	if err == nil {
		d.loadLocked(t)
	}
	m.graph.Unlock()
	if err != nil {
		return &DeviceError{Name: name, Err: err}
	}
	return nil
}

// Clear destroys the inactive table of the device called name, if any.
func (m *Manager) Clear(name string) error {
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	defer d.ctl.Unlock()
	d.loadLocked(nil)
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

// Remove removes the device called name. It refuses (EBUSY) a device that is
// open or that another table stacks on. A device that is not suspended is
// suspended first (its presuspend and postsuspend hooks run, as in dm).
//
// With f.Force, as dmsetup does, it first replaces the live table with an
// `error` table of the same size (load and resume), so that outstanding and
// new I/O fails, and then removes the device if nothing holds it; if
// something still does, the error table stays live and the removal fails
// with EBUSY.
//
// With f.Deferred, a device that is open or that another table stacks on
// is flagged instead (its info shows "DEFERRED REMOVE") and the call
// succeeds; the manager removes it once nothing uses it, checking every
// ReapInterval, until the message @cancel_deferred_remove clears the flag.
//
// The listeners' OnRemove runs after the device has left the table of
// names, before Remove returns.
func (m *Manager) Remove(name string, f Flags) error {
	return m.removeWith(name, f, false)
}

// removeWith is Remove; with onlyDeferred it removes the device only if a
// deferred removal is pending and nothing uses it any more, and is silent
// otherwise.
func (m *Manager) removeWith(name string, o Flags, onlyDeferred bool) error {
	force := o.Force
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	if onlyDeferred && !d.DeferredRemove() {
		d.ctl.Unlock()
		return nil
	}
	swapped := false
	if force {
		if live := d.Live(); live != nil {
			t, err := Build([]Line{{N: 1, Start: 0, Len: uint64(live.Sectors()), Type: Error.Name}},
				BuildOptions{Registry: m.reg, ReadOnly: d.ReadOnly(), Clock: m.clock, Context: m.ctx, Previous: live, Event: d.RaiseEvent, Memory: m.memory, Shared: &m.shared})
			if err == nil {
				d.loadLocked(t)
				swapped, err = d.resumeLocked()
			}
			if err != nil {
				d.ctl.Unlock()
				if swapped {
					m.changed(d)
				}
				return &DeviceError{Name: name, Err: err}
			}
		}
	}
	// The users of an exported block device are counted before m.mu is
	// taken: counting them reads /proc.
	users := m.openers(d) - d.opens.Load()
	m.mu.Lock()
	busy := ""
	switch {
	case d.holders.Load() > 0:
		busy = "device is in use by another table"
	case d.opens.Load()+users > 0:
		busy = "device is open"
	default:
		m.unlinkLocked(d)
	}
	m.mu.Unlock()
	if busy != "" && o.Deferred {
		// As drivers/md/dm-ioctl.c: dev_remove with DM_DEFERRED_REMOVE:
		// flag the device, succeed, and remove it once it is unused.
		d.mu.Lock()
		d.mu.deferred = true
		d.mu.Unlock()
		d.ctl.Unlock()
		if swapped {
			m.changed(d)
		}
		m.startReaper()
		return nil
	}
	if busy != "" {
		d.ctl.Unlock()
		if swapped {
			m.changed(d)
		}
		if onlyDeferred {
			return nil
		}
		return &DeviceError{Name: name, Err: &ArgError{Reason: busy, Errno: syscall.EBUSY}}
	}
	d.suspendLocked(false)
	d.destroy()
	d.RaiseEvent()
	d.ctl.Unlock()
	m.removed(d)
	return nil
}

// Rename gives the device called name the name newName, which must pass
// ValidName (EBUSY if a device of that name exists). The device's event
// counter goes up.
func (m *Manager) Rename(name, newName string) error {
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	// Let the fs layer forget the old name's entry first.
	m.changed(d)
	m.mu.Lock()
	if _, ok := m.byName[newName]; ok {
		m.mu.Unlock()
		d.ctl.Unlock()
		return &DeviceError{Name: name, Err: &ArgError{Reason: "device " + newName + " already exists", Errno: syscall.EBUSY}}
	}
	delete(m.byName, name)
	m.byName[newName] = d
	d.mu.Lock()
	d.mu.name = newName
	d.mu.Unlock()
	m.mu.Unlock()
	d.RaiseEvent()
	d.ctl.Unlock()
	m.changed(d)
	return nil
}

// SetUUID sets the uuid of the device called name to uuid, which must be
// non-empty and pass ValidUUID. As in dm, a uuid can be set only if none was
// set before (EINVAL), and must be unique (EBUSY). The device's event
// counter goes up.
func (m *Manager) SetUUID(name, uuid string) error {
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	defer d.ctl.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if d.UUID() != "" {
		return &DeviceError{Name: name, Err: &ArgError{Reason: "uuid already set to " + d.UUID() + "; it cannot be changed"}}
	}
	for _, o := range m.byName {
		if o.UUID() == uuid {
			return &DeviceError{Name: name, Err: &ArgError{Reason: "uuid " + uuid + " already in use", Errno: syscall.EBUSY}}
		}
	}
	d.mu.Lock()
	d.mu.uuid = uuid
	d.mu.Unlock()
	d.RaiseEvent()
	return nil
}

// Message sends a message to the device called name, as
// drivers/md/dm-ioctl.c: target_message does: a message of no words fails
// ("Empty message received", EINVAL); one whose first word starts with `@`
// goes to CoreMessage; any other goes to the target of the live table that
// covers sector, and returns the target's response. A device with no live
// table (none, or only an inactive one) takes such a message without an
// error and answers nothing, as dm does when dm_get_live_table finds no
// table; a suspended device keeps its live table and its targets get the
// message.
func (m *Manager) Message(ctx context.Context, name string, sector uint64, args []string) (string, error) {
	d := m.Lookup(name)
	if d == nil {
		return "", NoSuchDevice(name)
	}
	fail := func(err error) (string, error) { return "", &DeviceError{Name: name, Err: err} }
	if len(args) == 0 {
		return fail(Errorf("Empty message received"))
	}
	if strings.EqualFold(args[0], "@cancel_deferred_remove") {
		if err := m.cancelDeferred(d, len(args)); err != nil {
			return fail(err)
		}
		return "", nil
	}
	if len(args[0]) > 0 && args[0][0] == '@' {
		if m.core == nil {
			return fail(Errorf("Unsupported message sent to DM core"))
		}
		out, err := m.core(d, args)
		if err != nil {
			return fail(err)
		}
		return out, nil
	}
	var out string
	var err error
	d.WithTables(func(live, _ *Table) {
		if live == nil {
			return
		}
		if sector > uint64(live.Sectors()) {
			sector = uint64(live.Sectors())
		}
		var tg Target
		var typ *TargetType
		if tg, typ, err = live.TargetAt(int64(sector)); err != nil {
			return
		}
		ms, ok := tg.(Messager)
		if !ok {
			err = &TableError{Target: typ.Name, Err: ErrNoMessages}
			return
		}
		out, err = ms.Message(ctx, args)
		if err != nil {
			err = &TableError{Target: typ.Name, Err: err}
		}
	})
	if err != nil {
		return fail(err)
	}
	return out, nil
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
	m.unlink(d)
	if suspend {
		d.suspendLocked(false)
	}
	d.destroy()
}
