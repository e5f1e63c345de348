package stack

// Load builds a table for the device called name from text and puts it in the
// inactive slot, replacing any table there (drivers/md/dm-ioctl.c: table_load).
// Constructors run now, so argument errors are reported now; on failure an
// older inactive table is kept. Relative paths in text resolve against dir.
func (m *Manager) Load(name, text, dir string) error {
	d, err := m.acquire(name)
	if err != nil {
		return err
	}
	defer d.ctl.Unlock()
	if err := m.load(d, text, dir); err != nil {
		return &DeviceError{Name: name, Err: err}
	}
	return nil
}

// load parses text, builds it into a table for d and puts it in d's
// inactive slot; the caller holds d.ctl. Building and installing take the
// manager's graph lock, so that two concurrent loads cannot make devices
// stack on each other in a loop.
func (m *Manager) load(d *Device, text, dir string) error {
	lines, err := ParseTable(text)
	if err != nil {
		return err
	}
	return m.loadLines(d, lines, d.ReadOnly(), dir)
}

// loadLines is load of lines already parsed, building a read-only table
// with ro.
func (m *Manager) loadLines(d *Device, lines []Line, ro bool, dir string) error {
	m.graph.Lock()
	defer m.graph.Unlock()
	t, err := m.build(d, lines, ro, dir)
	if err != nil {
		return err
	}
	d.loadLocked(t)
	return nil
}

// LoadLines is Load of device d, found by the caller, with its lines
// already parsed, as DM_TABLE_LOAD hands them over (target specs, each
// with its type and parameter string): ro makes the table read-only (the
// device becomes read-only when it goes live, as dm's DM_READONLY_FLAG
// does at load). Relative paths resolve against the daemon's working
// directory.
func (m *Manager) LoadLines(d *Device, lines []Line, ro bool) error {
	if err := m.acquireDev(d); err != nil {
		return err
	}
	defer d.ctl.Unlock()
	if err := m.loadLines(d, lines, ro, ""); err != nil {
		return &DeviceError{Name: d.Name(), Err: err}
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

// Load puts t in the inactive slot, destroying any table there before. Live
// I/O is not affected.
func (d *Device) Load(t *Table) {
	d.ctl.Lock()
	defer d.ctl.Unlock()
	d.loadLocked(t)
}

// loadLocked fills the inactive slot; the caller holds d.ctl.
func (d *Device) loadLocked(t *Table) {
	d.mu.Lock()
	old := d.mu.inactive
	d.mu.inactive = t
	d.mu.Unlock()
	d.retire(old)
}

// Clear destroys the inactive table, if any.
func (d *Device) Clear() {
	d.Load(nil)
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
		Registry: m.reg, ReadOnly: ro, Clock: m.clock, Context: m.ctx, Previous: d.Live(), Event: d.RaiseEvent, Memory: m.memory, Shared: &m.shared,
		Open: func(arg string) (BlockDevice, error) { return m.openArg(d, arg, ro, dir) }, Device: d,
	})
}
