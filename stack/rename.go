package stack

import "syscall"

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
