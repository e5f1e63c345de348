package thin

import (
	"context"
	"errors"
	"fmt"
	"log"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/thin/metadata"
)

// poolMode is the kernel's enum pool_mode, best to worst.
type poolMode int32

const (
	modeWrite poolMode = iota
	modeOutOfDataSpace
	modeOutOfMetadataSpace
	modeReadOnly
	modeFail
)

// readOnlyMode reports whether m keeps the metadata unchanged
// (is_read_only_pool_mode).
func (m poolMode) readOnly() bool { return m == modeOutOfMetadataSpace || m == modeReadOnly }

func (m poolMode) String() string {
	switch m {
	case modeWrite:
		return "write"
	case modeOutOfDataSpace:
		return "out-of-data-space"
	case modeOutOfMetadataSpace, modeReadOnly:
		return "read-only"
	}
	return "fail"
}

// features are a pool's features (struct pool_features).
type features struct {
	mode           poolMode // modeWrite, or modeReadOnly for read_only
	zero           bool     // zero_new_blocks
	discard        bool     // discard_enabled
	passdown       bool     // discard_passdown
	errorIfNoSpace bool
}

// defaultFeatures is pool_features_init.
func defaultFeatures() features {
	return features{zero: true, discard: true, passdown: true}
}

// Kernel limits.
const (
	minBlockSectors   = 128     // DATA_DEV_BLOCK_SIZE_MIN_SECTORS
	maxBlockSectors   = 2097152 // DATA_DEV_BLOCK_SIZE_MAX_SECTORS
	maxDevID          = 1<<24 - 1
	metadataBlockSize = 4096
	maxMetadataBlocks = 255 * 16320 // DM_SM_METADATA_MAX_BLOCKS
	commitPeriod      = int64(time.Second)
	prisonMaxRange    = 1024 // BIO_PRISON_MAX_RANGE
	nLocks            = 4096 // per-block lock stripes of a pool
)

// DefaultNoSpaceTimeout is the kernel's default no_space_timeout.
const DefaultNoSpaceTimeout = 60 * time.Second

// SetNoSpaceTimeout sets, for the pools of the Manager whose shared set is
// set (stack.Manager.Shared), how long I/O that needs a new block waits when
// a pool is out of data space before it fails with ENOSPC: the kernel's
// dm_thin_pool module parameter no_space_timeout, DefaultNoSpaceTimeout
// unless set; 0 waits for ever, and a negative d is 0. It applies to pools
// that run out of space after the call. It fails only when the set is
// closed.
func SetNoSpaceTimeout(set *stack.SharedSet, d time.Duration) error {
	if set == nil {
		return errors.New("thin: no_space_timeout: no shared set (a table built without a Manager has the default)")
	}
	reg, err := sharedPools(set)
	if err != nil {
		return fmt.Errorf("thin: no_space_timeout %v: %w", d, err)
	}
	reg.setNoSpaceTimeout(d)
	return nil
}

// NoSpaceTimeout returns the no_space_timeout of the pools of the Manager
// whose shared set is set: DefaultNoSpaceTimeout unless SetNoSpaceTimeout
// changed it.
func NoSpaceTimeout(set *stack.SharedSet) (time.Duration, error) {
	if set == nil {
		return DefaultNoSpaceTimeout, nil
	}
	reg, err := sharedPools(set)
	if err != nil {
		return 0, fmt.Errorf("thin: no_space_timeout: %w", err)
	}
	return time.Duration(reg.noSpaceTimeout.Load()), nil
}

// poolDevs are the metadata and data devices of one pool table. A pool
// object outlives the table that created it (a reload reuses it), and each
// table closes its own devices, so I/O takes the devices of a live table
// under mu (shared), and a table's Close hands the pool another table's
// devices, then waits for the I/O on its own.
type poolDevs struct {
	mu         sync.RWMutex
	meta, data stack.BlockDevice
	closed     bool
}

// pool is the kernel's struct pool: the object that one pool's tables and
// thin targets share, keyed by the metadata device and by the pool's
// mapped device.
type pool struct {
	reg              *pools
	metaKey, dataKey any
	owner            *stack.Device
	sectorsPerBlock  uint32
	blockBytes       int64
	clock            stack.Clock
	store            metadata.Store

	devs    atomic.Pointer[poolDevs]
	devList []*poolDevs // guarded by reg.mu

	refs int // guarded by reg.mu

	// commitMu orders commits against metadata changes in progress: a
	// provisioning, break of sharing or discard holds it shared from the
	// allocation (or unmapping) until its mapping is in place (or its
	// passdown done), so no commit publishes an allocated block without
	// its mapping or a discarded block as free while its discard runs.
	// Lock order: commitMu, then a block lock.
	commitMu sync.RWMutex
	locks    [nLocks]sync.RWMutex

	suspended atomic.Bool
	mode      atomic.Int32 // poolMode

	mu                sync.Mutex
	pf                features // in effect (pool->pf)
	requestedENS      bool     // the bound table's error_if_no_space
	lowWater          uint64
	lowWaterTriggered bool
	metaThreshold     uint64 // metadata low water, in blocks
	metaBelow         bool   // free metadata is at or below it
	outOfDataSpace    bool
	noSpaceDeadline   int64 // clock time, 0 when not armed
	lastCommit        int64
	event             func()
	name              string
	wake              chan struct{} // closed and replaced on every change waiters look at
	kick              chan struct{} // tells the waker to look at noSpaceDeadline again

	stop chan struct{}
	done chan struct{}
}

// pools is the kernel's dm_thin_pool_table: the pool objects, by
// metadata device, by pool device and by data device, and their
// references; and the module parameter no_space_timeout. A Manager has one
// (in its stack.SharedSet), as a kernel has one dm_thin_pool module.
type pools struct {
	mu      sync.Mutex
	byMeta  map[any]*pool
	byOwner map[*stack.Device]*pool
	byData  map[any]*pool

	// noSpaceTimeout is no_space_timeout in nanoseconds; 0 queues for
	// ever.
	noSpaceTimeout atomic.Int64
}

func newPools() *pools {
	t := &pools{byMeta: map[any]*pool{}, byOwner: map[*stack.Device]*pool{}, byData: map[any]*pool{}}
	t.noSpaceTimeout.Store(int64(DefaultNoSpaceTimeout))
	return t
}

func (t *pools) setNoSpaceTimeout(d time.Duration) {
	t.noSpaceTimeout.Store(int64(max(d, 0)))
}

// poolsKey keys a Manager's pool table in its shared set.
type poolsKey struct{}

// sharedPools returns the pool table kept in set, making it on first
// use. A nil set shares nothing: each call makes a new table.
func sharedPools(set *stack.SharedSet) (*pools, error) {
	v, err := set.Get(poolsKey{}, func() (any, error) { return newPools(), nil })
	if err != nil {
		return nil, err
	}
	return v.(*pools), nil
}

// poolsFor returns the pool table a pool constructor works in: its
// Manager's (Ctor.Shared). A table built without a Manager has a pool table
// of its own, as it shares nothing (its pool is never reused by a reload,
// which needs a Manager's device). It fails when the Manager is closed.
func poolsFor(c *stack.Ctor) (*pools, error) {
	reg, err := sharedPools(c.Shared)
	if err != nil {
		return nil, stack.Errorf("Error finding the pool table: %v", err)
	}
	return reg, nil
}

// errnoOf returns the errno err carries, or def.
func errnoOf(err error, def syscall.Errno) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return def
}

// storeErrno maps an error of the metadata store to the kernel's errno.
func storeErrno(err error) syscall.Errno {
	switch {
	case errors.Is(err, metadata.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, metadata.ErrNoDevice):
		return syscall.ENODATA
	case errors.Is(err, metadata.ErrNoSpace):
		return syscall.ENOSPC
	case errors.Is(err, metadata.ErrReadOnly):
		return syscall.EPERM
	case errors.Is(err, metadata.ErrBusy):
		return syscall.EBUSY
	case errors.Is(err, metadata.ErrCorrupt):
		return errnoOf(err, syscall.EILSEQ)
	}
	return errnoOf(err, syscall.EINVAL)
}

// findPool is the kernel's __pool_find: the pool object using the metadata
// device, or the one bound to the pool's mapped device, or a new one. It
// takes a reference; created says the object is new.
func findPool(c *stack.Ctor, open OpenFunc, meta, data stack.BlockDevice, bs uint32, readOnly bool) (p *pool, created bool, err error) {
	mk, dk := stack.StorageKey(meta), stack.StorageKey(data)
	registry, err := poolsFor(c)
	if err != nil {
		return nil, false, err
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if p = registry.byMeta[mk]; p != nil {
		if p.owner != c.Device {
			return nil, false, &stack.ArgError{Reason: "metadata device already in use by a pool", Errno: syscall.EBUSY}
		}
		if p.dataKey != dk {
			return nil, false, &stack.ArgError{Reason: "data device already in use by a pool", Errno: syscall.EBUSY}
		}
		p.refs++
		return p, false, nil
	}
	if c.Device != nil {
		if p = registry.byOwner[c.Device]; p != nil {
			// Its metadata device differs, or byMeta had found it.
			return nil, false, stack.Errorf("different pool cannot replace a pool")
		}
	}
	if registry.byData[dk] != nil {
		return nil, false, &stack.ArgError{Reason: "data device already in use by a pool", Errno: syscall.EBUSY}
	}
	p = &pool{
		reg: registry, metaKey: mk, dataKey: dk, owner: c.Device, sectorsPerBlock: bs,
		blockBytes: int64(bs) * stack.SectorSize, clock: c.Clock, refs: 1,
		wake: make(chan struct{}), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if c.Device != nil {
		p.name = c.Device.Name()
	}
	p.suspended.Store(true) // a new pool is suspended until its first resume
	d := &poolDevs{meta: meta, data: data}
	p.devs.Store(d)
	p.devList = []*poolDevs{d}
	st, err := open(metaDevice{p}, metadata.Options{DataBlockSize: bs, Format: !readOnly, ReadOnly: readOnly})
	if err != nil {
		return nil, false, &stack.ArgError{Reason: "Error creating metadata object: " + err.Error(), Errno: storeErrno(err)}
	}
	p.store = st
	p.lastCommit = p.now()
	registry.byMeta[mk] = p
	registry.byData[dk] = p
	if c.Device != nil {
		registry.byOwner[c.Device] = p
	}
	go p.waker()
	return p, true, nil
}

// get takes a reference on a pool that a table still holds; it fails once
// the last reference is gone.
func (p *pool) get() bool {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	if p.refs == 0 {
		return false
	}
	p.refs++
	return true
}

// put drops a reference (__pool_dec); the last one commits and closes the
// metadata.
func (p *pool) put() {
	p.reg.mu.Lock()
	p.refs--
	last := p.refs == 0
	if last {
		delete(p.reg.byMeta, p.metaKey)
		delete(p.reg.byData, p.dataKey)
		if p.owner != nil && p.reg.byOwner[p.owner] == p {
			delete(p.reg.byOwner, p.owner)
		}
	}
	p.reg.mu.Unlock()
	if !last {
		return
	}
	close(p.stop)
	<-p.done
	if p.getMode() < modeOutOfMetadataSpace {
		_ = p.commit()
	}
	if err := p.store.Close(); err != nil {
		p.logf("closing the metadata: %v", err)
	}
}

// addDevs registers the devices of one more pool table of p.
func (p *pool) addDevs(meta, data stack.BlockDevice) *poolDevs {
	d := &poolDevs{meta: meta, data: data}
	p.reg.mu.Lock()
	p.devList = append(p.devList, d)
	p.reg.mu.Unlock()
	return d
}

// dropDevs is called when the table that owns d closes: the pool moves to
// another table's devices, and d is closed once no I/O uses it.
func (p *pool) dropDevs(d *poolDevs) {
	p.reg.mu.Lock()
	for i, x := range p.devList {
		if x == d {
			p.devList = append(p.devList[:i], p.devList[i+1:]...)
			break
		}
	}
	if p.devs.Load() == d && len(p.devList) > 0 {
		p.devs.Store(p.devList[len(p.devList)-1])
	}
	p.reg.mu.Unlock()
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
}

// acquire returns the devices I/O may use now, held shared; nil when the
// pool has no table any more. The caller calls release.
func (p *pool) acquire() *poolDevs {
	for {
		d := p.devs.Load()
		d.mu.RLock()
		if !d.closed {
			return d
		}
		d.mu.RUnlock()
		if p.devs.Load() == d {
			return nil
		}
		runtime.Gosched()
	}
}

func (d *poolDevs) release() { d.mu.RUnlock() }

// metaDevice is the metadata device of a pool, whichever table's handle
// is current.
type metaDevice struct{ p *pool }

var errNoTable = fmt.Errorf("thin-pool has no table: %w", syscall.EIO)

func (m metaDevice) ReadAt(ctx context.Context, b []byte, off int64) (int, error) {
	d := m.p.acquire()
	if d == nil {
		return 0, errNoTable
	}
	defer d.release()
	return d.meta.ReadAt(ctx, b, off)
}

func (m metaDevice) WriteAt(ctx context.Context, b []byte, off int64) (int, error) {
	d := m.p.acquire()
	if d == nil {
		return 0, errNoTable
	}
	defer d.release()
	return d.meta.WriteAt(ctx, b, off)
}

func (m metaDevice) Flush(ctx context.Context) error {
	d := m.p.acquire()
	if d == nil {
		return errNoTable
	}
	defer d.release()
	return d.meta.Flush(ctx)
}

func (m metaDevice) Size() int64 {
	d := m.p.acquire()
	if d == nil {
		return 0
	}
	defer d.release()
	return d.meta.Size()
}

func (p *pool) now() int64 {
	if p.clock == nil {
		return clock.Now()
	}
	return p.clock.Nanotime()
}

func (p *pool) logf(format string, a ...any) {
	log.Printf("thin-pool %s: "+format, append([]any{p.name}, a...)...)
}

func (p *pool) getMode() poolMode { return poolMode(p.mode.Load()) }

// changed wakes every waiter (mode, space, suspend changes); p.mu held.
func (p *pool) changedLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// waitChan returns the channel the next change closes.
func (p *pool) waitChan() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wake
}

// raise raises a table event on the pool's device.
func (p *pool) raise() {
	if p.event != nil {
		p.event()
	}
}

// setMode is the kernel's set_pool_mode; p.mu held.
func (p *pool) setModeLocked(m poolMode) {
	needsCheck := p.store.NeedsCheck()
	old := p.getMode()
	if m == modeWrite && needsCheck {
		p.logf("unable to switch pool to write mode until repaired.")
		if old != m {
			m = old
		} else {
			m = modeReadOnly
		}
	}
	if old == modeFail {
		m = old
	}
	switch m {
	case modeFail, modeOutOfMetadataSpace, modeReadOnly:
		p.store.SetReadOnly()
	case modeOutOfDataSpace:
		p.outOfDataSpace = true
		if t := p.reg.noSpaceTimeout.Load(); !p.pf.errorIfNoSpace && t > 0 {
			p.noSpaceDeadline = p.now() + t
			select {
			case p.kick <- struct{}{}:
			default:
			}
		}
	case modeWrite:
		p.noSpaceDeadline = 0
		p.outOfDataSpace = false
		p.pf.errorIfNoSpace = p.requestedENS
		if err := p.store.SetReadWrite(); err != nil {
			p.logf("cannot make the metadata writable: %v", err)
		}
	}
	p.pf.mode = m
	p.mode.Store(int32(m))
	if old != m {
		suffix := ""
		if m == modeOutOfDataSpace {
			suffix = " (queue IO)"
			if p.pf.errorIfNoSpace {
				suffix = " (error IO)"
			}
		}
		p.logf("switching pool to %s%s mode", m, suffix)
		p.raise()
	}
	p.changedLocked()
}

func (p *pool) setMode(m poolMode) {
	p.mu.Lock()
	p.setModeLocked(m)
	p.mu.Unlock()
}

// metadataFailed is metadata_operation_failed: abort the transaction, set
// needs_check and go read-only (fail when that fails too).
func (p *pool) metadataFailed(op string, err error) {
	p.logf("metadata operation '%s' failed: error = %v", op, err)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.getMode() >= modeReadOnly {
		return
	}
	if e := p.store.Abort(); e != nil {
		p.logf("aborting the current metadata transaction failed: %v", e)
		p.setModeLocked(modeFail)
	}
	if e := p.store.SetNeedsCheck(); e != nil {
		p.logf("failed to set 'needs_check' flag in metadata: %v", e)
		p.setModeLocked(modeFail)
	}
	p.setModeLocked(modeReadOnly)
}

// errNotCommitted is commit's answer in a mode that writes no metadata.
var errNotCommitted = fmt.Errorf("pool metadata is read-only: %w", syscall.EINVAL)

// commit makes the metadata durable (the kernel's commit): the data device
// is flushed first, so every block a mapping points to is on it.
func (p *pool) commit() error {
	p.commitMu.Lock()
	defer p.commitMu.Unlock()
	return p.commitLocked()
}

// commitLocked commits; the caller holds commitMu exclusively.
func (p *pool) commitLocked() error {
	if p.getMode() >= modeOutOfMetadataSpace {
		return errNotCommitted
	}
	if !p.store.Changed() {
		return nil
	}
	err := p.flushData()
	if err == nil {
		err = p.store.Commit()
	}
	if err != nil {
		p.metadataFailed("dm_pool_commit_metadata", err)
		return fmt.Errorf("commit: %w", syscall.EIO)
	}
	p.mu.Lock()
	p.lastCommit = p.now()
	p.mu.Unlock()
	p.checkSpace()
	return nil
}

// checkSpace is check_for_metadata_space and check_for_data_space.
func (p *pool) checkSpace() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if free, err := p.freeMetadata(); err == nil && free == 0 && p.getMode() < modeOutOfMetadataSpace {
		p.logf("No free metadata blocks")
		p.setModeLocked(modeOutOfMetadataSpace)
	}
	if p.getMode() != modeOutOfDataSpace {
		return
	}
	if free, err := p.store.FreeDataBlocks(); err == nil && free > 0 {
		p.setModeLocked(modeWrite)
	}
}

// freeMetadata is dm_pool_get_free_metadata_block_count: the metadata
// space map's free blocks less the reserve that commits need,
// min(4096, total/10) (__set_metadata_reserve).
func (p *pool) freeMetadata() (uint64, error) {
	free, err := p.store.FreeMetadataBlocks()
	if err != nil {
		return 0, err
	}
	total, err := p.store.MetadataBlocks()
	if err != nil {
		return 0, err
	}
	reserve := min(4096, total/10)
	return free - min(free, reserve), nil
}

// flushData flushes the data device.
func (p *pool) flushData() error {
	d := p.acquire()
	if d == nil {
		return errNoTable
	}
	defer d.release()
	return d.data.Flush(bg)
}

// waker is the kernel's do_waker and no_space_timeout work: once a
// commitPeriod it commits when a period has passed since the last commit,
// and at the no-space deadline, when one is armed, it fires the timeout.
func (p *pool) waker() {
	defer close(p.done)
	t := time.NewTimer(time.Duration(commitPeriod))
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
			t.Stop()
		case <-t.C:
			p.tick()
		}
		t.Reset(p.nextTick())
	}
}

// nextTick is how long the waker sleeps: until a commitPeriod after the
// last commit (a whole period if that has passed), or until the no-space
// deadline if it comes first.
func (p *pool) nextTick() time.Duration {
	now := p.now()
	p.mu.Lock()
	d := p.lastCommit + commitPeriod - now
	if d <= 0 {
		d = commitPeriod
	}
	if dl := p.noSpaceDeadline; dl != 0 {
		d = min(d, max(dl-now, 0))
	}
	p.mu.Unlock()
	return time.Duration(d)
}

// tick does one round of the waker's work at the pool clock's time.
func (p *pool) tick() {
	if p.suspended.Load() {
		return
	}
	now := p.now()
	p.mu.Lock()
	due := now-p.lastCommit >= commitPeriod
	if p.noSpaceDeadline != 0 && now >= p.noSpaceDeadline {
		p.noSpaceDeadline = 0
		if p.getMode() == modeOutOfDataSpace && !p.pf.errorIfNoSpace {
			p.pf.errorIfNoSpace = true
			p.logf("switching pool to %s (error IO) mode", modeOutOfDataSpace)
			p.raise()
			p.changedLocked()
		}
	}
	p.mu.Unlock()
	if due && p.getMode() < modeOutOfMetadataSpace {
		if p.store.Changed() {
			_ = p.commit()
		} else {
			p.mu.Lock()
			p.lastCommit = now
			p.mu.Unlock()
		}
	}
}

// blockLock returns the lock of virtual block v of device id.
func (p *pool) blockLock(id uint32, v uint64) *sync.RWMutex {
	h := (uint64(id)<<40 ^ v) * 0x9e3779b97f4a7c15
	return &p.locks[h>>(64-12)]
}

// errAllocNoSpace says allocation found no free block.
var errAllocNoSpace = errors.New("no free data block")

// allocBlock is alloc_data_block's first half: it raises the low water
// event and takes a free block. With none (errAllocNoSpace) the caller
// drops its locks, commits (blocks freed in this transaction become free
// only then) and tries once more before the pool goes out of data space.
// The caller holds commitMu shared.
func (p *pool) allocBlock() (uint64, error) {
	free, err := p.store.FreeDataBlocks()
	if err != nil {
		p.metadataFailed("dm_pool_get_free_block_count", err)
		return 0, err
	}
	p.mu.Lock()
	if free <= p.lowWater && !p.lowWaterTriggered {
		p.lowWaterTriggered = true
		p.logf("reached low water mark for data device: sending event.")
		p.raise()
	}
	p.mu.Unlock()
	b, err := p.store.AllocDataBlock()
	if errors.Is(err, metadata.ErrNoSpace) {
		return 0, errAllocNoSpace
	}
	if err != nil {
		p.metadataFailed("dm_pool_alloc_data_block", err)
		return 0, err
	}
	p.checkMetadataThreshold()
	return b, nil
}

// checkMetadataThreshold raises the metadata low water event when the
// metadata space map's free blocks fall to the threshold, once until they
// rise above it again (dm-space-map-metadata.c: check_threshold).
func (p *pool) checkMetadataThreshold() {
	free, err := p.store.FreeMetadataBlocks()
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	below := free <= p.metaThreshold
	if below && !p.metaBelow {
		p.logf("reached low water mark for metadata device: sending event.")
		p.raise()
	}
	p.metaBelow = below
}

// noSpace handles an allocation that found no block even after a commit:
// the pool goes out of data space.
func (p *pool) noSpace() {
	p.mu.Lock()
	if p.getMode() == modeWrite {
		p.setModeLocked(modeOutOfDataSpace)
	}
	p.mu.Unlock()
}

// ioError is get_pool_io_error_code.
func (p *pool) ioError() error {
	p.mu.Lock()
	ods := p.outOfDataSpace
	p.mu.Unlock()
	if ods {
		return syscall.ENOSPC
	}
	return syscall.EIO
}

// bg is the context of I/O the pool makes on its own (commits).
var bg = context.Background()

// stackLog logs what the kernel logs with DMWARN and DMINFO outside a pool.
func stackLog(format string, a ...any) { log.Printf("thin: "+format, a...) }
