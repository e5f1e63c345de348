package metadata

import (
	"errors"
	"fmt"

	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/btree"
	"github.com/dmfuse/dmfuse/persistent/sm"
)

func le64(v uint64) []byte {
	var b [8]byte
	le.PutUint64(b[:], v)
	return b[:]
}

func (p *DiskStore) lookupDetails(id uint32) (deviceDetails, bool, error) {
	var v [detailsSize]byte
	ok, err := btree.Lookup(&p.details, p.detailsRoot, uint64(id), v[:])
	if err != nil || !ok {
		return deviceDetails{}, false, err
	}
	return unpackDetails(v[:]), true, nil
}

// device returns the state of thin device id (__open_device without
// create): ok false when there is none.
func (p *DiskStore) device(id uint32) (*devState, bool, error) {
	if st, ok := p.devs[id]; ok {
		return st, !st.gone, nil
	}
	d, ok, err := p.lookupDetails(id)
	if err != nil || !ok {
		return nil, false, err
	}
	st := &devState{id: id, d: d}
	p.devs[id] = st
	return st, true, nil
}

func checkID(id uint32) error {
	if id > maxDevID {
		return fmt.Errorf("device id %d is over %d", id, maxDevID)
	}
	return nil
}

// subtreeRoot is the root of device id's mapping tree.
func (p *DiskStore) subtreeRoot(id uint32) (uint64, error) {
	var v [8]byte
	ok, err := btree.Lookup(&p.top, p.root, uint64(id), v[:])
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("device %d: %w", id, ErrNoDevice)
	}
	return le.Uint64(v[:]), nil
}

func (p *DiskStore) newDevice(id uint32, d deviceDetails) {
	st, ok := p.devs[id]
	if !ok {
		st = &devState{id: id}
		p.devs[id] = st
	}
	st.d, st.gone, st.changed = d, false, true
}

// checkNew checks that a device id may be created (what names the
// operation in the error): a valid id, a writable pool, no such device yet.
func (p *DiskStore) checkNew(id uint32, what string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := p.writable(); err != nil {
		return err
	}
	if _, ok, err := p.device(id); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("%s %d: %w", what, id, ErrExists)
	}
	return nil
}

// CreateThin adds an empty thin device.
func (p *DiskStore) CreateThin(id uint32) error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.checkNew(id, "create thin"); err != nil {
		return err
	}
	p.changed = true
	sub, err := btree.Empty(&p.bottom)
	if err != nil {
		return err
	}
	p.topGen++
	if p.root, _, err = btree.Insert(&p.top, p.root, uint64(id), le64(sub)); err != nil {
		return err
	}
	p.newDevice(id, deviceDetails{transactionID: p.transID, creationTime: p.time, snapshottedTime: p.time})
	return nil
}

// CreateSnap adds thin device id sharing every mapping of origin: the
// origin's mapping tree gains a reference and both devices point to it.
func (p *DiskStore) CreateSnap(id, origin uint32) error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.checkNew(id, "create snapshot"); err != nil {
		return err
	}
	sub, err := p.subtreeRoot(origin)
	if err != nil {
		return fmt.Errorf("create snapshot %d of %d: %w", id, origin, err)
	}
	ost, ok, err := p.device(origin)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("create snapshot %d: origin %d: %w", id, origin, ErrNoDevice)
	}
	if p.time >= maxTime {
		return fmt.Errorf("create snapshot %d: pool time %d would overflow 24 bits", id, p.time)
	}
	p.changed = true
	if err := p.tm.Inc(sub); err != nil {
		return err
	}
	p.topGen++
	if p.root, _, err = btree.Insert(&p.top, p.root, uint64(id), le64(sub)); err != nil {
		return err
	}
	p.time++
	p.newDevice(id, deviceDetails{mappedBlocks: ost.d.mappedBlocks, transactionID: p.transID,
		creationTime: p.time, snapshottedTime: p.time})
	ost.d.snapshottedTime = p.time
	ost.changed = true
	return nil
}

// DeleteThin removes a thin device and drops its mapping tree.
func (p *DiskStore) DeleteThin(id uint32) error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	st, ok, err := p.device(id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("delete thin %d: %w", id, ErrNoDevice)
	}
	if st.open > 0 {
		return fmt.Errorf("delete thin %d: %w", id, ErrBusy)
	}
	p.changed = true
	delete(p.devs, id)
	dr, err := btree.Remove(&p.details, p.detailsRoot, uint64(id))
	switch {
	case err == nil:
		p.detailsRoot = dr
	case !errors.Is(err, btree.ErrNotFound):
		return err
	}
	p.topGen++
	r, err := btree.Remove(&p.top, p.root, uint64(id))
	if err != nil {
		if errors.Is(err, btree.ErrNotFound) {
			return fmt.Errorf("delete thin %d: %w", id, ErrNoDevice)
		}
		return err
	}
	p.root = r
	return nil
}

// TransactionID is the user's transaction id.
func (p *DiskStore) TransactionID() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.transID
}

// SetTransactionID sets the transaction id to new if it is old.
func (p *DiskStore) SetTransactionID(old, new uint64) error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	if p.transID != old {
		return fmt.Errorf("mismatched transaction id: have %d, given %d", p.transID, old)
	}
	p.transID = new
	p.changed = true
	return nil
}

// ReserveMetadataSnap commits, then copies the superblock to a new block
// whose trees share the live ones (__reserve_metadata_snap). The next
// Commit publishes it as the superblock's held root.
func (p *DiskStore) ReserveMetadataSnap() error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	if p.heldRoot != 0 {
		return fmt.Errorf("reserve metadata snapshot: one is held at block %d: %w", p.heldRoot, ErrBusy)
	}
	if err := p.commit(); err != nil {
		return err
	}
	p.changed = true
	if err := p.tm.Inc(superblockLocation); err != nil {
		return err
	}
	b, _, err := p.tm.Shadow(superblockLocation, block.Superblock)
	if err != nil {
		return err
	}
	held := b.Loc()
	d := b.Data()
	clear(d[64 : 64+2*128])
	le.PutUint64(d[56:], 0)
	mr, dr := le.Uint64(d[320:]), le.Uint64(d[328:])
	p.tm.Unlock(b)
	if err := p.tm.Inc(mr); err != nil {
		return err
	}
	if err := p.tm.Inc(dr); err != nil {
		return err
	}
	p.heldRoot = held
	return nil
}

// ReleaseMetadataSnap drops the metadata snapshot and its references.
func (p *DiskStore) ReleaseMetadataSnap() error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	held := p.heldRoot
	if held == 0 {
		return errors.New("release metadata snapshot: none is held")
	}
	b, err := p.tm.ReadLock(held, block.Superblock)
	if err != nil {
		return err
	}
	mr, dr := le.Uint64(b.Data()[320:]), le.Uint64(b.Data()[328:])
	p.tm.Unlock(b)
	p.changed = true
	p.heldRoot = 0
	p.topGen++
	if err := btree.Del(&p.top, mr); err != nil {
		return err
	}
	if err := btree.Del(&p.details, dr); err != nil {
		return err
	}
	return p.tm.Dec(held)
}

// MetadataSnap is the metadata snapshot's block (0: none).
func (p *DiskStore) MetadataSnap() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.heldRoot
}

// OpenThin opens thin device id.
func (p *DiskStore) OpenThin(id uint32) (Thin, error) {
	p.mu.Lock()
	defer p.unlock()
	st, ok, err := p.device(id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("open thin %d: %w", id, ErrNoDevice)
	}
	st.open++
	return &thinDev{p: p, st: st}, nil
}

// AllocDataBlock takes a free data block with one reference.
func (p *DiskStore) AllocDataBlock() (uint64, error) {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return 0, err
	}
	b, err := p.dsm.NewBlock()
	if err == nil {
		p.changed = true
	}
	return b, err
}

// IncDataRange adds a reference to data blocks [begin, end).
func (p *DiskStore) IncDataRange(begin, end uint64) error {
	return p.dataRange(begin, end, (*sm.Disk).Inc)
}

// DecDataRange drops a reference to data blocks [begin, end).
func (p *DiskStore) DecDataRange(begin, end uint64) error {
	return p.dataRange(begin, end, (*sm.Disk).Dec)
}

func (p *DiskStore) dataRange(begin, end uint64, fn func(*sm.Disk, uint64) error) error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	for b := begin; b < end; b++ {
		p.changed = true
		if err := fn(p.dsm, b); err != nil {
			return err
		}
	}
	return nil
}

// BlockIsShared says whether data block b has more than one reference.
func (p *DiskStore) BlockIsShared(b uint64) (bool, error) {
	p.mu.Lock()
	defer p.unlock()
	c, err := p.dsm.Count(b)
	return c > 1, err
}

// FreeDataBlocks is the number of data blocks without a reference.
func (p *DiskStore) FreeDataBlocks() (uint64, error) {
	return p.freeData.Load(), nil
}

// DataBlocks is the size of the data space map.
func (p *DiskStore) DataBlocks() (uint64, error) {
	return p.nrData.Load(), nil
}

// FreeMetadataBlocks is the number of metadata blocks without a
// reference.
func (p *DiskStore) FreeMetadataBlocks() (uint64, error) {
	return p.freeMeta.Load(), nil
}

// MetadataBlocks is the size of the metadata space map.
func (p *DiskStore) MetadataBlocks() (uint64, error) {
	return p.nrMeta.Load(), nil
}

// ResizeData grows the data space map to n blocks.
func (p *DiskStore) ResizeData(n uint64) error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	cur := p.dsm.NrBlocks()
	switch {
	case n < cur:
		return fmt.Errorf("pool target (%d blocks) too small: expected %d", n, cur)
	case n == cur:
		return nil
	}
	p.changed = true
	return p.dsm.Extend(n)
}

// ResizeMetadata grows the metadata space map to n blocks (at most the
// device's size and the format's limit).
func (p *DiskStore) ResizeMetadata(n uint64) error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.writable(); err != nil {
		return err
	}
	n = min(n, sm.MaxMetadataBlocks)
	cur := p.msm.NrBlocks()
	switch {
	case n < cur:
		return fmt.Errorf("metadata device (%d blocks) too small: expected %d", n, cur)
	case n == cur:
		return nil
	}
	if dev := p.bm.Refresh(); n > dev {
		return fmt.Errorf("metadata device of %d blocks cannot hold %d", dev, n)
	}
	p.changed = true
	return p.msm.Extend(n)
}
