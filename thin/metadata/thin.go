package metadata

import (
	"errors"
	"fmt"

	"github.com/dmfuse/dmfuse/persistent/btree"
)

// thinDev is an open thin device.
type thinDev struct {
	p      *DiskStore
	st     *devState
	closed bool
}

var _ Thin = (*thinDev)(nil)

// ID is the device's id.
func (t *thinDev) ID() uint32 { return t.st.id }

// root returns the device's mapping tree root; called with p.mu held,
// shared or exclusively.
func (t *thinDev) root() (uint64, error) {
	if t.closed {
		return 0, fmt.Errorf("thin device %d is closed", t.st.id)
	}
	st := t.st
	if st.gone {
		return 0, fmt.Errorf("thin device %d: %w", st.id, ErrNoDevice)
	}
	gen := t.p.topGen
	if st.rootGen.Load() == gen {
		return st.root.Load(), nil
	}
	r, err := t.p.subtreeRoot(st.id)
	if err != nil {
		return 0, err
	}
	st.root.Store(r)
	st.rootGen.Store(gen)
	return r, nil
}

// Find returns the data block v maps to and whether it may be shared
// (mapped before the device's last snapshot).
func (t *thinDev) Find(v uint64) (uint64, bool, error) {
	p := t.p
	p.mu.RLock()
	defer p.mu.RUnlock()
	root, err := t.root()
	if err != nil {
		return 0, false, err
	}
	var val [8]byte
	ok, err := btree.Lookup(&p.bottom, root, v, val[:])
	if err != nil {
		return 0, false, err
	}
	if !ok {
		return 0, false, ErrNotFound
	}
	d, tm := unpackBlockTime(le.Uint64(val[:]))
	return d, t.st.d.snapshottedTime > tm, nil
}

// FindMappedRange returns the first run of mapped blocks in [begin, end)
// with consecutive data blocks and one sharing state.
func (t *thinDev) FindMappedRange(begin, end uint64) (vbegin, dbegin, n uint64, shared bool, err error) {
	p := t.p
	p.mu.RLock()
	defer p.mu.RUnlock()
	root, err := t.root()
	if err != nil {
		return 0, 0, 0, false, err
	}
	var val [8]byte
	k, ok, err := btree.LookupNext(&p.bottom, root, begin, val[:])
	if err != nil {
		return 0, 0, 0, false, err
	}
	if !ok || k >= end {
		return 0, 0, 0, false, ErrNotFound
	}
	d, tm := unpackBlockTime(le.Uint64(val[:]))
	vbegin, dbegin, n, shared = k, d, 1, t.st.d.snapshottedTime > tm
	for vbegin+n < end {
		k, ok, err := btree.LookupNext(&p.bottom, root, vbegin+n, val[:])
		if err != nil {
			return 0, 0, 0, false, err
		}
		d, tm := unpackBlockTime(le.Uint64(val[:]))
		if !ok || k != vbegin+n || d != dbegin+n || (t.st.d.snapshottedTime > tm) != shared {
			break
		}
		n++
	}
	return vbegin, dbegin, n, shared, nil
}

// update changes the device's mapping tree through fn, which returns the
// tree's new root; the top-level path is shadowed first, so that a
// shared top level gives its references to the device trees before one
// of them changes.
func (t *thinDev) update(fn func(root uint64) (uint64, error)) error {
	p := t.p
	if _, err := t.root(); err != nil {
		return err
	}
	var err error
	p.topGen++
	p.root, err = btree.Update(&p.top, p.root, uint64(t.st.id), func(val []byte) error {
		nr, err := fn(le.Uint64(val))
		if err != nil {
			return err
		}
		le.PutUint64(val, nr)
		return nil
	})
	if errors.Is(err, btree.ErrNotFound) {
		return fmt.Errorf("thin device %d: %w", t.st.id, ErrNoDevice)
	}
	return err
}

// Insert maps v to data block d.
func (t *thinDev) Insert(v, d uint64) error {
	p := t.p
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	if n := p.dsm.NrBlocks(); d >= n {
		return fmt.Errorf("map block %d of thin device %d to data block %d: the pool has %d", v, t.st.id, d, n)
	}
	p.changed = true
	inserted := false
	var val [8]byte
	le.PutUint64(val[:], packBlockTime(d, p.time))
	err := t.update(func(root uint64) (uint64, error) {
		nr, ins, err := btree.Insert(&p.bottom, root, v, val[:])
		inserted = ins
		return nr, err
	})
	if err != nil {
		return err
	}
	t.st.changed = true
	if inserted {
		t.st.d.mappedBlocks++
	}
	return nil
}

// Remove unmaps v and drops its data block's reference.
func (t *thinDev) Remove(v uint64) error {
	p := t.p
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	return t.remove(v)
}

func (t *thinDev) remove(v uint64) error {
	p := t.p
	root, err := t.root()
	if err != nil {
		return err
	}
	if ok, err := btree.Lookup(&p.bottom, root, v, nil); err != nil {
		return err
	} else if !ok {
		return ErrNotFound
	}
	p.changed = true
	err = t.update(func(root uint64) (uint64, error) { return btree.Remove(&p.bottom, root, v) })
	if err != nil {
		return err
	}
	t.st.changed = true
	t.st.d.mappedBlocks--
	return nil
}

// RemoveRange unmaps [begin, end).
func (t *thinDev) RemoveRange(begin, end uint64) error {
	p := t.p
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	for begin < end {
		root, err := t.root()
		if err != nil {
			return err
		}
		k, ok, err := btree.LookupNext(&p.bottom, root, begin, nil)
		if err != nil {
			return err
		}
		if !ok || k >= end {
			return nil
		}
		if err := t.remove(k); err != nil {
			return err
		}
		begin = k + 1
	}
	return nil
}

// HighestMapped is the highest mapped virtual block.
func (t *thinDev) HighestMapped() (uint64, bool, error) {
	p := t.p
	p.mu.RLock()
	defer p.mu.RUnlock()
	root, err := t.root()
	if err != nil {
		return 0, false, err
	}
	return btree.FindHighest(&p.bottom, root, nil)
}

// MappedCount is the number of mapped blocks.
func (t *thinDev) MappedCount() (uint64, error) {
	p := t.p
	p.mu.RLock()
	defer p.mu.RUnlock()
	if t.st.gone {
		return 0, fmt.Errorf("thin device %d: %w", t.st.id, ErrNoDevice)
	}
	return t.st.d.mappedBlocks, nil
}

// Changed says whether the device changed in this transaction.
func (t *thinDev) Changed() bool {
	p := t.p
	p.mu.RLock()
	defer p.mu.RUnlock()
	return t.st.changed
}

// Close releases the device.
func (t *thinDev) Close() error {
	p := t.p
	p.mu.Lock()
	defer p.unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	t.st.open--
	if t.st.open == 0 && !t.st.changed {
		if cur, ok := p.devs[t.st.id]; ok && cur == t.st {
			delete(p.devs, t.st.id)
		}
	}
	return nil
}
