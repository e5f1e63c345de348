package stack

// Listener follows the devices of a Manager (Manager.Subscribe): the fs
// layer's files and the exporter's block devices are listeners.
type Listener struct {
	// OnChange, if set, runs after a device's live table or its name
	// changed, and after a device is created with a table.
	OnChange func(*Device)
	// OnRemove, if set, runs after a device is removed: it has left the
	// manager's table of names already (Lookup no longer finds it), and the
	// command that removed it has not returned yet.
	OnRemove func(*Device)
}

// Subscribe adds l to the manager's listeners and returns the function
// that removes it. OnChange runs in the order listeners subscribed and
// OnRemove in the reverse order, so that a listener that builds on an
// earlier one (a block device over the fs layer's file) follows a new
// table after it and lets go of a removed device before it. Both run with
// no manager lock held (stack/doc.go, Locks); subscribe before devices are
// created.
func (m *Manager) Subscribe(l Listener) (unsubscribe func()) {
	p := &l
	m.mu.Lock()
	m.listeners = append(m.listeners[:len(m.listeners):len(m.listeners)], p)
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for i, q := range m.listeners {
			if q == p {
				m.listeners = append(m.listeners[:i:i], m.listeners[i+1:]...)
				return
			}
		}
	}
}

// subscribers returns the listeners; the slice is never written in place.
func (m *Manager) subscribers() []*Listener {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.listeners
}

// changed tells the listeners that d's live table or name changed.
func (m *Manager) changed(d *Device) {
	for _, l := range m.subscribers() {
		if l.OnChange != nil {
			l.OnChange(d)
		}
	}
}

// removed tells the listeners, last subscribed first, that d is gone.
func (m *Manager) removed(d *Device) {
	ls := m.subscribers()
	for i := len(ls) - 1; i >= 0; i-- {
		if ls[i].OnRemove != nil {
			ls[i].OnRemove(d)
		}
	}
}
