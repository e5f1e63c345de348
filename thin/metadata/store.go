package metadata

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/dmfuse/dmfuse/persistent"
	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/btree"
	"github.com/dmfuse/dmfuse/persistent/sm"
	"github.com/dmfuse/dmfuse/persistent/tm"
)

// DiskStore is a Store on the kernel's on-disk format.
type DiskStore struct {
	mu   rwLock
	dev  Device
	opts Options

	bm  *block.Manager
	tm  *tm.TM
	msm *sm.Metadata
	dsm *sm.Disk

	top, bottom, details btree.Info

	sb          superblock // as last committed
	root        uint64     // mapping tree root
	topGen      uint64     // raised by every change of the mapping tree's top level
	detailsRoot uint64
	time        uint32
	transID     uint64
	flags       uint32
	heldRoot    uint64

	devs     map[uint32]*devState
	changed  bool
	readOnly bool

	// The space maps' counts as the last change left them, published
	// before the lock is released, so that reading them takes no lock.
	freeData, nrData, freeMeta, nrMeta atomic.Uint64
}

var _ Store = (*DiskStore)(nil)

// devState is an open or changed thin device (the kernel's
// dm_thin_device).
type devState struct {
	id      uint32
	open    int
	changed bool
	gone    bool
	d       deviceDetails

	// root is the device's mapping tree root as the top level held it
	// when DiskStore.topGen was rootGen: Find looks it up once per change of
	// the top level, not on every call. Lookups under the shared lock
	// store root before rootGen, and all of them store the same values
	// for one rootGen.
	root, rootGen atomic.Uint64
}

// Open opens the pool metadata on dev: a device whose first 4 KiB are
// zero becomes a new pool when o.Format is set; anything else must be
// valid metadata of the kernel's format. A device that is too small, of
// another format or damaged is refused with an error wrapping ErrCorrupt,
// and nothing is written to it.
func Open(dev Device, o Options) (*DiskStore, error) {
	nr := uint64(dev.Size()) / block.Size
	if nr == 0 {
		return nil, fmt.Errorf("%w: metadata device of %d bytes is too small", ErrCorrupt, dev.Size())
	}
	buf := make([]byte, block.Size)
	if n, err := dev.ReadAt(context.Background(), buf, 0); err != nil || n != block.Size {
		return nil, fmt.Errorf("read metadata superblock: %d bytes: %w", n, err)
	}
	p := &DiskStore{dev: dev, opts: o, devs: make(map[uint32]*devState)}
	if !slices.ContainsFunc(buf, func(c byte) bool { return c != 0 }) {
		if o.ReadOnly {
			return nil, fmt.Errorf("cannot format a new pool on a read-only metadata device: %w", ErrReadOnly)
		}
		if !o.Format {
			return nil, fmt.Errorf("%w: metadata device holds no pool (its first 4 KiB are zero)", ErrCorrupt)
		}
		if err := p.format(nr); err != nil {
			return nil, err
		}
		p.publish()
		return p, nil
	}
	if m := le.Uint64(buf[32:]); m != block.Magic {
		return nil, fmt.Errorf("%w: not thin-pool metadata: superblock magic %d, want %d", ErrCorrupt, m, block.Magic)
	}
	if err := p.load(); err != nil {
		return nil, err
	}
	p.publish()
	return p, nil
}

// publish stores the space maps' counts for the readers that take no
// lock; called with the lock held exclusively.
func (p *DiskStore) publish() {
	if p.dsm != nil {
		p.freeData.Store(p.dsm.NrFree())
		p.nrData.Store(p.dsm.NrBlocks())
	}
	if p.msm != nil {
		p.freeMeta.Store(p.msm.NrFree())
		p.nrMeta.Store(p.msm.NrBlocks())
	}
}

// unlock publishes the counts and releases the exclusive lock.
func (p *DiskStore) unlock() {
	p.publish()
	p.mu.Unlock()
}

func (p *DiskStore) setupInfos() {
	p.bottom = btree.Info{TM: p.tm, VT: btree.ValueType{
		Size: 8,
		Inc: func(vals []byte, n int) error {
			for i := 0; i < n; i++ {
				b, _ := unpackBlockTime(le.Uint64(vals[8*i:]))
				if err := p.dsm.Inc(b); err != nil {
					return err
				}
			}
			return nil
		},
		Dec: func(vals []byte, n int) error {
			for i := 0; i < n; i++ {
				b, _ := unpackBlockTime(le.Uint64(vals[8*i:]))
				if err := p.dsm.Dec(b); err != nil {
					return err
				}
			}
			return nil
		},
		Equal: func(a, b []byte) bool { return le.Uint64(a)>>24 == le.Uint64(b)>>24 },
	}}
	p.top = btree.Info{TM: p.tm, VT: btree.ValueType{
		Size: 8,
		Inc: func(vals []byte, n int) error {
			for i := 0; i < n; i++ {
				if err := p.tm.Inc(le.Uint64(vals[8*i:])); err != nil {
					return err
				}
			}
			return nil
		},
		Dec: func(vals []byte, n int) error {
			for i := 0; i < n; i++ {
				if err := btree.Del(&p.bottom, le.Uint64(vals[8*i:])); err != nil {
					return err
				}
			}
			return nil
		},
	}}
	p.details = btree.Info{TM: p.tm, VT: btree.ValueType{Size: detailsSize}}
}

// minFormatBlocks is a generous bound of the blocks a new pool needs.
func minFormatBlocks(nrMeta, nrData uint64) uint64 {
	dataBitmaps := (nrData + sm.EntriesPerBlock - 1) / sm.EntriesPerBlock
	metaBitmaps := (nrMeta + sm.EntriesPerBlock - 1) / sm.EntriesPerBlock
	return 16 + metaBitmaps + dataBitmaps + 2*(dataBitmaps/56+1)
}

func (p *DiskStore) format(nr uint64) error {
	o := p.opts
	if o.DataBlockSize == 0 {
		return errors.New("format pool metadata: data block size 0")
	}
	nrMeta := min(nr, sm.MaxMetadataBlocks)
	if need := minFormatBlocks(nrMeta, o.DataBlocks); nrMeta < need {
		return fmt.Errorf("%w: metadata device of %d blocks is too small for %d data blocks (at least %d blocks)",
			ErrCorrupt, nrMeta, o.DataBlocks, need)
	}
	p.bm = block.NewManager(p.dev, o.CacheBlocks)
	msm, err := sm.NewMetadata(nrMeta)
	if err != nil {
		return err
	}
	p.msm = msm
	p.tm = tm.New(p.bm, msm)
	if err := msm.Init(p.tm); err != nil {
		return p.formatErr(err)
	}
	if p.dsm, err = sm.NewDisk(p.tm, o.DataBlocks); err != nil {
		return p.formatErr(err)
	}
	p.setupInfos()
	p.topGen++
	if p.root, err = btree.Empty(&p.top); err != nil {
		return p.formatErr(err)
	}
	if p.detailsRoot, err = btree.Empty(&p.details); err != nil {
		return p.formatErr(err)
	}
	p.sb = superblock{
		magic:             block.Magic,
		version:           thinVersion,
		dataBlockSize:     o.DataBlockSize,
		metadataBlockSize: metadataBlockSize,
		metadataNrBlocks:  nrMeta,
	}
	p.changed = true
	return p.commit()
}

func (p *DiskStore) formatErr(err error) error {
	if errors.Is(err, ErrNoSpace) {
		return fmt.Errorf("%w: metadata device too small: %v", ErrCorrupt, err)
	}
	return fmt.Errorf("format pool metadata: %w", err)
}

// load opens the committed superblock and checks what can be checked
// without walking every mapping: the space maps, the top-level mapping
// tree and the details tree.
func (p *DiskStore) load() error {
	p.bm = block.NewManager(p.dev, p.opts.CacheBlocks)
	if err := p.loadFrom(); err != nil {
		return fmt.Errorf("open pool metadata: %w", err)
	}
	if p.opts.ReadOnly {
		p.bm.SetReadOnly(true)
	}
	return nil
}

func (p *DiskStore) loadFrom() error {
	sbb, err := p.bm.ReadLock(superblockLocation, block.Superblock)
	if err != nil {
		return err
	}
	sb := unpackSuperblock(sbb.Data())
	p.bm.Unlock(sbb)
	o := p.opts
	if o.DataBlockSize != 0 && sb.dataBlockSize != o.DataBlockSize {
		return fmt.Errorf("changing the data block size (from %d to %d) is not supported", sb.dataBlockSize, o.DataBlockSize)
	}
	if sb.incompat != 0 {
		return fmt.Errorf("could not access metadata due to unsupported optional features (%#x)", sb.incompat)
	}
	if sb.compatRO != 0 && !o.ReadOnly {
		return fmt.Errorf("could not access metadata RDWR due to unsupported optional features (%#x)", sb.compatRO)
	}
	if sb.metaSM.NrBlocks > p.bm.NrBlocks() || sb.metaSM.NrBlocks == 0 {
		return persistent.Corruptf("metadata space map of %d blocks on a device of %d blocks", sb.metaSM.NrBlocks, p.bm.NrBlocks())
	}
	p.tm = tm.New(p.bm, nil)
	if p.msm, err = sm.OpenMetadata(p.tm, sb.metaSM); err != nil {
		return err
	}
	p.tm.SetSM(p.msm)
	if p.dsm, err = sm.OpenDisk(p.tm, sb.dataSM); err != nil {
		return err
	}
	p.setupInfos()
	p.sb = sb
	p.topGen++
	p.root, p.detailsRoot = sb.mappingRoot, sb.detailsRoot
	p.time, p.transID, p.flags, p.heldRoot = sb.time, sb.transID, sb.flags, sb.heldRoot
	if err := p.checkTrees(p.root, p.detailsRoot); err != nil {
		return err
	}
	if p.heldRoot != 0 {
		hb, err := p.bm.ReadLock(p.heldRoot, block.Superblock)
		if err != nil {
			return fmt.Errorf("metadata snapshot: %w", err)
		}
		h := unpackSuperblock(hb.Data())
		p.bm.Unlock(hb)
		if err := p.checkTrees(h.mappingRoot, h.detailsRoot); err != nil {
			return fmt.Errorf("metadata snapshot: %w", err)
		}
	}
	return nil
}

// checkTrees walks the top level of the mapping tree and the details
// tree: every node and every device root must be in range and counted.
func (p *DiskStore) checkTrees(root, details uint64) error {
	counted := func(loc uint64) error {
		c, err := p.msm.Count(loc)
		if err != nil {
			return err
		}
		if c == 0 {
			return persistent.Corruptf("metadata block %d is in use but counted free", loc)
		}
		return nil
	}
	var ids, dids []uint64
	err := btree.WalkNodes(&p.top, root, func(loc uint64, leaf bool, vals []byte, nr int) error {
		if err := counted(loc); err != nil {
			return err
		}
		if leaf {
			for i := 0; i < nr; i++ {
				if err := counted(le.Uint64(vals[8*i:])); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := btree.Walk(&p.top, root, func(k uint64, _ []byte) error { ids = append(ids, k); return nil }); err != nil {
		return err
	}
	err = btree.WalkNodes(&p.details, details, func(loc uint64, _ bool, _ []byte, _ int) error { return counted(loc) })
	if err != nil {
		return err
	}
	if err := btree.Walk(&p.details, details, func(k uint64, _ []byte) error { dids = append(dids, k); return nil }); err != nil {
		return err
	}
	if !slices.Equal(ids, dids) {
		return persistent.Corruptf("devices of the mapping tree %v and of the details tree %v differ", ids, dids)
	}
	return nil
}

// commit makes the transaction durable (__commit_transaction): the
// changed device details, the data space map, the metadata space map,
// every dirty block and a flush, then the superblock and a flush.
func (p *DiskStore) commit() error {
	if err := p.writable(); err != nil {
		return err
	}
	if !p.changed {
		return nil
	}
	ids := make([]uint32, 0, len(p.devs))
	for id, st := range p.devs {
		if st.changed {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var v [detailsSize]byte
	for _, id := range ids {
		st := p.devs[id]
		st.d.pack(v[:])
		var err error
		if p.detailsRoot, _, err = btree.Insert(&p.details, p.detailsRoot, uint64(id), v[:]); err != nil {
			return err
		}
		st.changed = false
	}
	dataRoot, err := p.dsm.Commit()
	if err != nil {
		return err
	}
	metaRoot, err := p.msm.Commit()
	if err != nil {
		return err
	}
	if err := p.bm.Flush(); err != nil {
		return err
	}
	sb := p.sb
	sb.blocknr = superblockLocation
	sb.time, sb.transID, sb.flags, sb.heldRoot = p.time, p.transID, p.flags, p.heldRoot
	sb.mappingRoot, sb.detailsRoot = p.root, p.detailsRoot
	sb.dataSM, sb.metaSM = dataRoot, metaRoot
	if err := p.writeSuperblock(&sb); err != nil {
		return err
	}
	p.sb = sb
	p.tm.Commit()
	p.msm.Committed()
	p.dsm.Committed()
	p.changed = false
	for id, st := range p.devs {
		if st.open == 0 {
			delete(p.devs, id)
		}
	}
	return nil
}

func (p *DiskStore) writeSuperblock(sb *superblock) error {
	b, err := p.bm.WriteLockZero(superblockLocation, block.Superblock)
	if err != nil {
		return err
	}
	sb.pack(b.Data())
	p.bm.Unlock(b)
	return p.bm.Flush()
}

func (p *DiskStore) writable() error {
	if p.opts.ReadOnly || p.readOnly {
		return ErrReadOnly
	}
	return nil
}

// Commit makes the transaction durable.
func (p *DiskStore) Commit() error {
	p.mu.Lock()
	defer p.unlock()
	if err := p.commit(); err != nil {
		return fmt.Errorf("commit pool metadata: %w", err)
	}
	return nil
}

// Abort drops the transaction and reopens the last committed one. Open
// thin devices stay open, with their committed details.
func (p *DiskStore) Abort() error {
	p.mu.Lock()
	defer p.unlock()
	p.bm.Invalidate()
	if err := p.loadFrom(); err != nil {
		return fmt.Errorf("abort: reopen pool metadata: %w", err)
	}
	p.changed = false
	for id, st := range p.devs {
		if st.open == 0 {
			delete(p.devs, id)
			continue
		}
		d, ok, err := p.lookupDetails(id)
		if err != nil {
			return fmt.Errorf("abort: reopen device %d: %w", id, err)
		}
		st.d, st.gone, st.changed = d, !ok, false
	}
	return nil
}

// Changed says whether anything changed since the last Commit.
func (p *DiskStore) Changed() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.changed
}

// NeedsCheck reads the needs_check flag.
func (p *DiskStore) NeedsCheck() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.flags&needsCheckFlag != 0
}

// SetNeedsCheck sets the needs_check flag and writes it at once into the
// last committed superblock.
func (p *DiskStore) SetNeedsCheck() error {
	p.mu.Lock()
	defer p.unlock()
	if p.opts.ReadOnly {
		return ErrReadOnly
	}
	p.flags |= needsCheckFlag
	sb := p.sb
	sb.flags |= needsCheckFlag
	if err := p.writeSuperblock(&sb); err != nil {
		return fmt.Errorf("set needs_check: %w", err)
	}
	p.sb = sb
	return nil
}

// SetReadOnly stops all writes.
func (p *DiskStore) SetReadOnly() {
	p.mu.Lock()
	defer p.unlock()
	p.readOnly = true
}

// SetReadWrite allows writes again (ErrReadOnly when opened read-only).
func (p *DiskStore) SetReadWrite() error {
	p.mu.Lock()
	defer p.unlock()
	if p.opts.ReadOnly {
		return ErrReadOnly
	}
	p.readOnly = false
	return nil
}

// Close releases the store; it commits nothing.
func (p *DiskStore) Close() error {
	p.mu.Lock()
	defer p.unlock()
	p.bm.Invalidate()
	return nil
}

// CacheStats returns the block cache's counters.
func (p *DiskStore) CacheStats() block.Stats { return p.bm.Stats() }
