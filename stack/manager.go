package stack

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/stats"
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
// dependency graph, and resolves device arguments in tables.
type Manager struct {
	reg   *Registry
	clock Clock
	ctx   context.Context

	mu      sync.Mutex
	byName  map[string]*Device
	byMinor map[uint32]*Device
	nextIno uint64

	// Hooks the fs layer sets before devices are created.
	OnAdd    func(*Device)
	OnRemove func(*Device)
	OnChange func(*Device)
}

// NewManager returns a manager that builds tables with reg. ctx lives as long
// as the daemon.
func NewManager(ctx context.Context, reg *Registry, clock Clock) *Manager {
	if clock == nil {
		clock = stats.SystemClock
	}
	return &Manager{reg: reg, clock: clock, ctx: ctx, byName: map[string]*Device{}, byMinor: map[uint32]*Device{}, nextIno: 100}
}

// Registry returns the manager's target types.
func (m *Manager) Registry() *Registry { return m.reg }

// ValidName checks a device name against interface.md §2.
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

// CreateOptions describes a device to create.
type CreateOptions struct {
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
	if err := ValidName(o.Name); err != nil {
		return nil, &DeviceError{Name: o.Name, Err: &ArgError{Reason: err.Error()}}
	}
	if len(o.UUID) > 128 {
		return nil, &DeviceError{Name: o.Name, Err: &ArgError{Reason: "uuid longer than 128 bytes"}}
	}
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
	m.byName[o.Name] = d
	m.byMinor[minor] = d
	m.mu.Unlock()

	if !o.NoTable {
		t, err := m.build(d, lines, o.ReadOnly, o.Dir)
		if err == nil {
			d.Load(t)
			err = d.Resume()
		}
		if err != nil {
			m.drop(d)
			return nil, &DeviceError{Name: o.Name, Err: err}
		}
	}
	if m.OnAdd != nil {
		m.OnAdd(d)
	}
	return d, nil
}

// drop forgets a device without any check and destroys its tables.
func (m *Manager) drop(d *Device) {
	m.mu.Lock()
	name := d.Name()
	if m.byName[name] == d {
		delete(m.byName, name)
	}
	if m.byMinor[d.minor] == d {
		delete(m.byMinor, d.minor)
	}
	m.mu.Unlock()
	d.mu.Lock()
	d.mu.removed = true
	in := d.mu.inactive
	d.mu.inactive = nil
	d.mu.Unlock()
	if in != nil {
		in.Close()
	}
	if t := d.live.Swap(nil); t != nil {
		t.Close()
	}
	d.gate.open()
}

func (m *Manager) changed(d *Device) {
	if m.OnChange != nil {
		m.OnChange(d)
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
	return Build(lines, BuildOptions{
		Registry: m.reg, ReadOnly: ro, Clock: m.clock, Context: m.ctx, Previous: d.Live(), Event: d.RaiseEvent,
		Open: func(arg string) (BlockDevice, error) { return m.open(d, arg, ro, dir) },
	})
}

var majMin = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)

// open resolves one device argument of a table of device self (interface.md §4).
func (m *Manager) open(self *Device, arg string, ro bool, dir string) (BlockDevice, error) {
	if mm := majMin.FindStringSubmatch(arg); mm != nil {
		maj, _ := strconv.ParseUint(mm[1], 10, 32)
		min, _ := strconv.ParseUint(mm[2], 10, 32)
		if maj == Major {
			m.mu.Lock()
			d := m.byMinor[uint32(min)]
			m.mu.Unlock()
			if d == nil {
				return nil, Errorf("Device lookup failed: %s: no such mapped device", arg)
			}
			return m.useMapped(self, d)
		}
		bd, err := OpenFile(fmt.Sprintf("/dev/block/%d:%d", maj, min), arg, ro)
		if err != nil {
			return nil, Errorf("Device lookup failed: %s: %v", arg, unwrapPath(err))
		}
		return bd, nil
	}
	if !strings.Contains(arg, "/") {
		m.mu.Lock()
		d := m.byName[arg]
		m.mu.Unlock()
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
	bd, err := OpenFile(p, p, ro)
	if err != nil {
		return nil, Errorf("Device lookup failed: %s: %v", arg, unwrapPath(err))
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

// useMapped checks that d may be stacked on by self's table.
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

// Remove removes a device. It refuses (EBUSY) a device that is open or that
// another table stacks on.
func (m *Manager) Remove(name string) error {
	d := m.Lookup(name)
	if d == nil {
		return &DeviceError{Name: name, Err: &ArgError{Reason: "no such device", Errno: syscall.ENXIO}}
	}
	if n := d.holders.Load(); n > 0 {
		return &DeviceError{Name: name, Err: &ArgError{Reason: "device is in use by another table", Errno: syscall.EBUSY}}
	}
	if d.opens.Load() > 0 {
		return &DeviceError{Name: name, Err: &ArgError{Reason: "device is open", Errno: syscall.EBUSY}}
	}
	d.Suspend(false)
	m.drop(d)
	if m.OnRemove != nil {
		m.OnRemove(d)
	}
	return nil
}

// RemoveAll removes every device, upper devices before the ones they stack
// on, ignoring open handles (daemon shutdown).
func (m *Manager) RemoveAll() {
	for {
		devs := m.Devices()
		if len(devs) == 0 {
			return
		}
		progress := false
		for _, d := range devs {
			if d.holders.Load() == 0 {
				d.Suspend(false)
				m.drop(d)
				progress = true
			}
		}
		if !progress {
			for _, d := range devs {
				m.drop(d)
			}
			return
		}
	}
}
