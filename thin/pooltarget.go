package thin

import (
	"context"
	"strconv"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/thin/metadata"
)

// OpenFunc opens a pool's metadata store over its metadata device.
type OpenFunc func(dev metadata.Device, o metadata.Options) (metadata.Store, error)

// Version is the kernel's version of both target types.
var Version = [3]int{1, 24, 0}

// NewTypes returns the thin-pool and thin target types over the metadata
// stores open makes.
func NewTypes(open OpenFunc) (pool, thin *stack.TargetType) {
	pool = &stack.TargetType{Name: "thin-pool", Version: Version, Singleton: true, Immutable: true,
		New: func(c *stack.Ctor, args []string) (stack.Target, error) { return newPool(c, open, args) }}
	thin = &stack.TargetType{Name: "thin", Version: Version,
		New: func(c *stack.Ctor, args []string) (stack.Target, error) { return newThin(c, args) }}
	return pool, thin
}

// PoolType and Type are the thin-pool and thin target types over the
// kernel's on-disk metadata format (metadata.Open).
var PoolType, Type = NewTypes(func(d metadata.Device, o metadata.Options) (metadata.Store, error) {
	return metadata.Open(d, o)
})

// PoolTarget is a constructed thin-pool target (struct pool_c).
type PoolTarget struct {
	data      stack.BlockDevice // I/O to the pool device goes here 1:1
	pool      *pool
	devs      *poolDevs
	c         *stack.Ctor
	metaDev   stack.BlockDevice
	requested features // what the table asked for (requested_pf)
	adjusted  features // what it gets (adjusted_pf)
	lowWater  uint64
	closed    bool
}

// discardPool is a pool target that takes discards (discard and passdown
// both on), passing them to the data device.
type discardPool struct{ *PoolTarget }

var (
	_ stack.Target          = (*PoolTarget)(nil)
	_ stack.Flusher         = (*PoolTarget)(nil)
	_ stack.Messager        = (*PoolTarget)(nil)
	_ stack.Presuspender    = (*PoolTarget)(nil)
	_ stack.Postsuspender   = (*PoolTarget)(nil)
	_ stack.Preresumer      = (*PoolTarget)(nil)
	_ stack.Resumer         = (*PoolTarget)(nil)
	_ stack.NoFlushStatuser = (*PoolTarget)(nil)
	_ stack.Discarder       = discardPool{}
	_ stack.DiscardOwner    = discardPool{}
)

// parseFeatures reads the optional feature group (parse_pool_features).
func parseFeatures(a *stack.Args, pf *features) error {
	if a.Len() == 0 {
		return nil
	}
	n, err := a.Group(0, 4, "Invalid number of pool feature arguments")
	if err != nil {
		return err
	}
	for range n {
		w, _ := a.Next()
		switch strings.ToLower(w) {
		case "skip_block_zeroing":
			pf.zero = false
		case "ignore_discard":
			pf.discard = false
		case "no_discard_passdown":
			pf.passdown = false
		case "read_only":
			pf.mode = modeReadOnly
		case "error_if_no_space":
			pf.errorIfNoSpace = true
		default:
			return stack.Errorf("Unrecognised pool feature requested")
		}
	}
	return nil
}

// ParseBlockSize reads a data block size in sectors as pool_ctr does:
// kstrtoul base 10, from 128 to 2097152 and a multiple of 128.
func ParseBlockSize(s string) (uint32, bool) {
	v, err := stack.ParseUint64(s)
	if err != nil || v < minBlockSectors || v > maxBlockSectors || v%minBlockSectors != 0 {
		return 0, false
	}
	return uint32(v), true
}

// newPool constructs a thin-pool target. The table syntax is dm-thin's:
//
//	<metadata dev> <data dev> <data block size> <low water mark> [<#features> <feature>...]
//
// The data block size is in sectors (128 to 2097152, a multiple of 128),
// the low water mark in data blocks; the features are skip_block_zeroing,
// ignore_discard, no_discard_passdown, read_only and error_if_no_space.
// The checks and their errors are pool_ctr's, in its order. The pool's
// data size is the target's length in whole blocks, taken at resume.
func newPool(c *stack.Ctor, open OpenFunc, args []string) (stack.Target, error) {
	if len(args) < 4 {
		return nil, stack.Errorf("Invalid argument count")
	}
	if args[0] == args[1] {
		return nil, stack.Errorf("Error setting metadata or data device")
	}
	pf := defaultFeatures()
	a := stack.NewArgs(args[4:])
	if err := parseFeatures(a, &pf); err != nil {
		return nil, err
	}
	meta, err := c.Open(args[0])
	if err != nil {
		return nil, &stack.ArgError{Reason: "Error opening metadata block device: " + err.Error(), Errno: errnoOf(err, syscall.EINVAL)}
	}
	if meta.Size() > 16<<30 { // warn_if_metadata_device_too_big
		stackLog("Metadata device %s is larger than 33292800 sectors: excess space will not be used.", meta.Name())
	}
	data, err := c.Open(args[1])
	if err != nil {
		return nil, &stack.ArgError{Reason: "Error getting data device: " + err.Error(), Errno: errnoOf(err, syscall.EINVAL)}
	}
	bs, ok := ParseBlockSize(args[2])
	if !ok {
		return nil, stack.Errorf("Invalid block size")
	}
	lw, err := stack.ParseUint64(args[3])
	if err != nil {
		return nil, stack.Errorf("Invalid low water mark")
	}
	p, created, err := findPool(c, open, meta, data, bs, pf.mode == modeReadOnly)
	if err != nil {
		return nil, err
	}
	if !created && pf.discard != p.pf.discard {
		p.put()
		return nil, stack.Errorf("Discard support cannot be disabled once enabled")
	}
	if created {
		p.pf = pf
		p.pf.mode = modeWrite
		p.requestedENS = pf.errorIfNoSpace
	}
	pt := &PoolTarget{
		data: data, pool: p, c: c, metaDev: meta,
		requested: pf, adjusted: pf, lowWater: lw,
	}
	if created {
		pt.devs = p.devs.Load()
	} else {
		pt.devs = p.addDevs(meta, data)
	}
	if pf.discard {
		// disable_discard_passdown_if_not_supported.
		if l, ok := data.(stack.Limiter); ok && !l.Limits().Discard && pf.passdown {
			stackLog("Data device (%s) discard unsupported: Disabling discard passdown.", data.Name())
			pt.adjusted.passdown = false
		}
	}
	if pf.discard && pf.passdown {
		return discardPool{pt}, nil
	}
	return pt, nil
}

// Discard passes a discard to the data device.
func (d discardPool) Discard(ctx context.Context, off, n int64) error {
	if !d.adjusted.passdown {
		return nil
	}
	return d.data.Discard(ctx, off, n)
}

// OwnsDiscards: the pool sets discards_supported.
func (discardPool) OwnsDiscards() {}

// blocks is the pool's data size for this table: its length in whole
// blocks.
func (pt *PoolTarget) blocks() uint64 {
	return uint64(pt.c.Len) / uint64(pt.pool.sectorsPerBlock)
}

// metadataThreshold is calc_metadata_threshold: a quarter of the metadata
// device, at most 1024 blocks.
func (pt *PoolTarget) metadataThreshold() uint64 {
	return min(1024, metadataDevBlocks(pt.metaDev)/4)
}

// metadataDevBlocks is the usable size of a metadata device in blocks.
func metadataDevBlocks(d stack.BlockDevice) uint64 {
	return min(uint64(d.Size()/metadataBlockSize), maxMetadataBlocks)
}

// Status prints the table line (the requested features) or the status
// line, as pool_status does; both end with a space. The status commits
// first unless the pool is suspended.
func (pt *PoolTarget) Status(st stack.StatusType) string {
	return pt.status(st, st != stack.StatusTable)
}

// StatusNoFlush is the status line without the commit before it, as
// pool_status with DM_STATUS_NOFLUSH_FLAG (`dmsetup status --noflush`).
func (pt *PoolTarget) StatusNoFlush() string { return pt.status(stack.StatusInfo, false) }

// status prints the table or status line; commit commits first unless the
// pool is suspended.
func (pt *PoolTarget) status(st stack.StatusType, commit bool) string {
	p := pt.pool
	b := make([]byte, 0, 128)
	if st == stack.StatusTable {
		b = append(b, stack.EscapeArg(pt.metaDev.Name())...)
		b = append(b, ' ')
		b = append(b, stack.EscapeArg(pt.data.Name())...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(p.sectorsPerBlock), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, pt.lowWater, 10)
		b = append(b, ' ')
		return string(emitFlags(b, pt.requested))
	}
	if p.getMode() == modeFail {
		return "Fail"
	}
	if commit && !p.suspended.Load() {
		_ = p.commit()
	}
	s := p.store
	fm, err1 := p.freeMetadata()
	tm, err2 := s.MetadataBlocks()
	fd, err3 := s.FreeDataBlocks()
	td, err4 := s.DataBlocks()
	b = strconv.AppendUint(b, s.TransactionID(), 10)
	b = append(b, ' ')
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return string(append(b, "Error"...))
	}
	b = strconv.AppendUint(b, tm-min(fm, tm), 10)
	b = append(b, '/')
	b = strconv.AppendUint(b, tm, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, td-min(fd, td), 10)
	b = append(b, '/')
	b = strconv.AppendUint(b, td, 10)
	b = append(b, ' ')
	if h := s.MetadataSnap(); h != 0 {
		b = strconv.AppendUint(b, h, 10)
		b = append(b, ' ')
	} else {
		b = append(b, "- "...)
	}
	switch m := p.getMode(); {
	case m == modeOutOfDataSpace:
		b = append(b, "out_of_data_space "...)
	case m.readOnly():
		b = append(b, "ro "...)
	default:
		b = append(b, "rw "...)
	}
	p.mu.Lock()
	pf := p.pf
	p.mu.Unlock()
	switch {
	case !pf.discard:
		b = append(b, "ignore_discard "...)
	case pf.passdown:
		b = append(b, "discard_passdown "...)
	default:
		b = append(b, "no_discard_passdown "...)
	}
	if pf.errorIfNoSpace {
		b = append(b, "error_if_no_space "...)
	} else {
		b = append(b, "queue_if_no_space "...)
	}
	if s.NeedsCheck() {
		b = append(b, "needs_check "...)
	} else {
		b = append(b, "- "...)
	}
	b = strconv.AppendUint(b, pt.metadataThreshold(), 10)
	b = append(b, ' ')
	return string(b)
}

// emitFlags appends the feature count and words of pf (emit_flags).
func emitFlags(b []byte, pf features) []byte {
	n := 0
	for _, on := range []bool{!pf.zero, !pf.discard, !pf.passdown, pf.mode == modeReadOnly, pf.errorIfNoSpace} {
		if on {
			n++
		}
	}
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, ' ')
	if !pf.zero {
		b = append(b, "skip_block_zeroing "...)
	}
	if !pf.discard {
		b = append(b, "ignore_discard "...)
	}
	if !pf.passdown {
		b = append(b, "no_discard_passdown "...)
	}
	if pf.mode == modeReadOnly {
		b = append(b, "read_only "...)
	}
	if pf.errorIfNoSpace {
		b = append(b, "error_if_no_space "...)
	}
	return b
}

// ReadAt reads the data device: the pool device maps onto it 1:1
// (pool_map).
func (pt *PoolTarget) ReadAt(ctx context.Context, b []byte, off int64) (int, error) {
	return pt.data.ReadAt(ctx, b, off)
}

// WriteAt writes the data device.
func (pt *PoolTarget) WriteAt(ctx context.Context, b []byte, off int64) (int, error) {
	return pt.data.WriteAt(ctx, b, off)
}

// Flush flushes the data device.
func (pt *PoolTarget) Flush(ctx context.Context) error { return pt.data.Flush(ctx) }

// Presuspend marks the pool suspended: thin I/O that needs the metadata
// waits until it resumes (pool_presuspend).
func (pt *PoolTarget) Presuspend(noflush bool) {
	p := pt.pool
	p.mu.Lock()
	p.suspended.Store(true)
	p.changedLocked()
	p.mu.Unlock()
}

// Postsuspend waits for metadata changes in progress, stops the no-space
// timer and commits (pool_postsuspend).
func (pt *PoolTarget) Postsuspend() {
	p := pt.pool
	p.mu.Lock()
	p.noSpaceDeadline = 0
	p.mu.Unlock()
	_ = p.commit()
}

// Preresume binds this table to the pool and grows the data and metadata
// space maps to the table's sizes (pool_preresume).
func (pt *PoolTarget) Preresume() error {
	p := pt.pool
	err := pt.preresume()
	if err != nil && p.getMode() == modeFail {
		return nil
	}
	return err
}

func (pt *PoolTarget) preresume() error {
	p := pt.pool
	// bind_control_target.
	p.mu.Lock()
	want := pt.adjusted.mode
	pf := pt.adjusted
	pf.mode = p.getMode()
	p.pf = pf
	p.requestedENS = pt.requested.errorIfNoSpace
	p.lowWater = pt.lowWater
	p.metaThreshold = pt.metadataThreshold()
	p.event = pt.c.Event
	p.setModeLocked(want)
	p.mu.Unlock()
	p.devs.Store(pt.devs)

	p.commitMu.Lock()
	defer p.commitMu.Unlock()
	need := false
	s := p.store
	// maybe_resize_data_dev.
	size := pt.blocks()
	cur, err := s.DataBlocks()
	if err != nil {
		p.logf("failed to retrieve data device size")
		return &stack.ArgError{Reason: "failed to retrieve data device size", Errno: syscall.EIO}
	}
	switch {
	case size < cur:
		return stack.Errorf("pool target (%d blocks) too small: expected %d", size, cur)
	case size > cur && s.NeedsCheck():
		p.logf("unable to grow the data device until repaired.")
	case size > cur:
		if cur != 0 {
			p.logf("growing the data device from %d to %d blocks", cur, size)
		}
		if err := s.ResizeData(size); err != nil {
			p.metadataFailed("dm_pool_resize_data_dev", err)
			return &stack.ArgError{Reason: "dm_pool_resize_data_dev: " + err.Error(), Errno: syscall.EIO}
		}
		need = true
	}
	// maybe_resize_metadata_dev.
	msize := metadataDevBlocks(pt.metaDev)
	mcur, err := s.MetadataBlocks()
	if err != nil {
		return &stack.ArgError{Reason: "failed to retrieve metadata device size", Errno: syscall.EIO}
	}
	switch {
	case msize < mcur:
		return stack.Errorf("metadata device (%d blocks) too small: expected %d", msize, mcur)
	case msize > mcur && s.NeedsCheck():
		p.logf("unable to grow the metadata device until repaired.")
	case msize > mcur:
		p.logf("growing the metadata device from %d to %d blocks", mcur, msize)
		if p.getMode() == modeOutOfMetadataSpace {
			p.setMode(modeWrite)
		}
		if err := s.ResizeMetadata(msize); err != nil {
			p.metadataFailed("dm_pool_resize_metadata_dev", err)
			return &stack.ArgError{Reason: "dm_pool_resize_metadata_dev: " + err.Error(), Errno: syscall.EIO}
		}
		need = true
	}
	if need {
		_ = p.commitLocked()
	}
	return nil
}

// Resume releases the I/O that waited for the pool (requeue_bios), re-arms
// the low water event and clears the suspended state (pool_resume).
func (pt *PoolTarget) Resume() {
	p := pt.pool
	p.mu.Lock()
	p.lowWaterTriggered = false
	p.suspended.Store(false)
	p.changedLocked()
	p.mu.Unlock()
	p.tick()
}

// Close drops the table's reference to the pool object; the last one
// commits and closes the metadata (pool_dtr).
func (pt *PoolTarget) Close() error {
	if pt.closed {
		return nil
	}
	pt.closed = true
	p := pt.pool
	p.reg.mu.Lock()
	last := p.refs == 1
	p.reg.mu.Unlock()
	if last {
		// The last reference commits through these devices.
		p.put()
		p.dropDevs(pt.devs)
		return nil
	}
	p.dropDevs(pt.devs)
	p.put()
	return nil
}
