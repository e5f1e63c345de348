package snapshot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
)

// The persistent store's on-disk format (drivers/md/dm-snap-persistent.c),
// little-endian:
//
//	chunk 0          header: magic "SnAp" (0x70416e53), valid, version 1,
//	                 chunk size in sectors; the rest of the chunk zero
//	chunk 1+i*(E+1)  metadata area i: E = chunk bytes / 16 entries of
//	                 (old_chunk u64, new_chunk u64); new_chunk 0 ends the
//	                 list, and the whole store
//	the E chunks after area i: the data chunks its entries point at
//
// A magic of 0 is a new store: the header is written and area 0 zeroed when
// the table is loaded. Entries are written in allocation order; an area is
// written (after a flush, with FUA) when no prepared exception is
// outstanding or it is full, and a full area's successor is zeroed first, so
// that a crash loses only exceptions not yet committed, whose chunks stay
// unreferenced.
const (
	// Magic is the header's magic, SNAP_MAGIC.
	Magic = 0x70416e53
	// DiskVersion is SNAPSHOT_DISK_VERSION.
	DiskVersion = 1
	// DefaultChunk is DM_CHUNK_SIZE_DEFAULT_SECTORS, the chunk size of a
	// new persistent store whose table gives 0.
	DefaultChunk = 32

	headerSize = 16
	entrySize  = 16
)

// errNotSnapshot is a header with another magic: the kernel's -ENXIO,
// "Invalid or corrupt snapshot".
var errNotSnapshot = fmt.Errorf("invalid or corrupt snapshot: %w", syscall.ENXIO)

// areaLocation is the COW chunk of metadata area i.
func areaLocation(e, i uint64) uint64 { return 1 + (e+1)*i }

// persistent is the P store.
type persistent struct {
	mu        sync.Mutex
	cow       stack.BlockDevice
	cs        uint32 // sectors; 0 until read picks it
	blockSize int64
	e         uint64 // exceptions per area
	valid     bool

	area            []byte // the current area
	currentArea     uint64
	currentCommit   uint64 // entries of the current area in use
	nextFree        uint64 // the next COW chunk to hand out
	pendingCount    int    // prepared, not yet applied
	nextSeq, applyQ uint64 // prepare's sequence and the next to apply
	// queued are commits that arrived before an earlier prepare's.
	queued map[uint64]commitReq
	// callbacks wait for the area write that makes their entries durable.
	callbacks []func(bool)
	// seqOf maps a prepared chunk to its sequence number.
	seqOf map[uint64]uint64
}

type commitReq struct {
	old, new uint64
	ok       bool
	done     func(bool)
}

func (p *persistent) chunk() uint32  { return p.cs }
func (p *persistent) typeChar() byte { return 'P' }

func (p *persistent) chunkBytes() int64 { return int64(p.cs) * stack.SectorSize }

// io reads or writes the whole chunk c: metadata, with a flush before and
// FUA for writes (REQ_PREFLUSH | REQ_FUA), as chunk_io and area_io do.
func (p *persistent) chunkIO(c uint64, buf []byte, write, flush bool) error {
	ctx := context.Background()
	off := int64(c) * p.chunkBytes()
	if !write {
		return readFull(ctx, p.cow, buf, off)
	}
	if flush {
		if err := p.cow.Flush(ctx); err != nil {
			return err
		}
		ctx = stack.WithFUA(ctx)
	}
	return writeFull(ctx, p.cow, buf, off)
}

// header is the store's header chunk.
func (p *persistent) header(valid bool) []byte {
	b := make([]byte, p.chunkBytes())
	le := binary.LittleEndian
	le.PutUint32(b[0:], Magic)
	v := uint32(0)
	if valid {
		v = 1
	}
	le.PutUint32(b[4:], v)
	le.PutUint32(b[8:], DiskVersion)
	le.PutUint32(b[12:], p.cs)
	return b
}

// read is persistent_read_metadata: read_header (formatting a new store),
// then read_exceptions.
func (p *persistent) read(add func(old, new uint64)) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fresh, valid, err := p.readHeader()
	if err != nil {
		return false, err
	}
	p.e = uint64(p.cs) * stack.SectorSize / entrySize
	p.area = make([]byte, p.chunkBytes())
	p.seqOf, p.queued = map[uint64]uint64{}, map[uint64]commitReq{}
	if fresh {
		p.valid = true
		if err := p.chunkIO(0, p.header(true), true, false); err != nil {
			kernelLog("write_header failed")
			return false, err
		}
		if err := p.chunkIO(areaLocation(p.e, 0), p.area, true, true); err != nil {
			kernelLog("zero_disk_area(0) failed")
			return false, err
		}
		p.nextFree = 2
		return true, nil
	}
	if !valid {
		return false, nil
	}
	p.valid = true
	p.nextFree = 2
	for area := uint64(0); ; area++ {
		if err := p.chunkIO(areaLocation(p.e, area), p.area, false, false); err != nil {
			return false, err
		}
		p.currentArea = area
		full := true
		for i := uint64(0); i < p.e; i++ {
			old, nw := p.entry(i)
			if nw == 0 {
				p.currentCommit = i
				full = false
				break
			}
			if nw+1 > p.nextFree {
				p.nextFree = nw + 1
			}
			add(old, nw&chunkMask)
		}
		if !full {
			break
		}
	}
	p.skipMetadata()
	return true, nil
}

// chunkMask keeps DM_CHUNK_NUMBER_BITS (56) of an on-disk new_chunk.
const chunkMask = 1<<56 - 1

// readHeader is read_header: it settles the chunk size and reports a new
// store (magic 0) or the header's valid flag.
func (p *persistent) readHeader() (fresh, valid bool, err error) {
	if p.cs == 0 {
		p.cs = max(DefaultChunk, uint32(p.blockSize/stack.SectorSize))
	}
	buf := make([]byte, p.chunkBytes())
	if err := p.chunkIO(0, buf, false, false); err != nil {
		return false, false, err
	}
	le := binary.LittleEndian
	magic, v, version, cs := le.Uint32(buf[0:]), le.Uint32(buf[4:]), le.Uint32(buf[8:]), le.Uint32(buf[12:])
	if magic == 0 {
		return true, true, nil
	}
	if magic != Magic {
		kernelLog("Invalid or corrupt snapshot")
		return false, false, errNotSnapshot
	}
	if cs != p.cs {
		if why := chunkProblem(cs, p.blockSize); why != "" {
			kernelLog("invalid on-disk chunk size %d: %s.", cs, why)
			return false, false, syscall.EINVAL
		}
		kernelLog("chunk size %d in device metadata overrides table chunk size of %d.", cs, p.cs)
		p.cs = cs
	}
	if version != DiskVersion {
		kernelLog("unable to handle snapshot disk version %d", version)
		return false, false, syscall.EINVAL
	}
	return false, v != 0, nil
}

func (p *persistent) entry(i uint64) (old, new uint64) {
	b := p.area[i*entrySize:]
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
}

func (p *persistent) setEntry(i, old, new uint64) {
	b := p.area[i*entrySize:]
	binary.LittleEndian.PutUint64(b, old)
	binary.LittleEndian.PutUint64(b[8:], new)
}

// skipMetadata steps next_free over a metadata area.
func (p *persistent) skipMetadata() {
	if p.nextFree%(p.e+1) == 1 {
		p.nextFree++
	}
}

func (p *persistent) prepare() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	size := uint64(p.cow.Size()) / stack.SectorSize
	if size < (p.nextFree+1)*uint64(p.cs) {
		return 0, errFull
	}
	c := p.nextFree
	p.nextFree++
	p.skipMetadata()
	p.pendingCount++
	p.seqOf[c] = p.nextSeq
	p.nextSeq++
	return c, nil
}

// commit is persistent_commit_exception, applied in the order of the
// prepares: a commit that arrives early waits in queued.
func (p *persistent) commit(old, new uint64, ok bool, done func(bool)) {
	p.mu.Lock()
	seq, known := p.seqOf[new]
	if !known {
		p.mu.Unlock()
		done(false)
		return
	}
	delete(p.seqOf, new)
	p.queued[seq] = commitReq{old, new, ok, done}
	var run []func(bool)
	var valid bool
	for {
		r, ready := p.queued[p.applyQ]
		if !ready {
			break
		}
		delete(p.queued, p.applyQ)
		p.applyQ++
		if cbs, v := p.apply(r); cbs != nil {
			run, valid = append(run, cbs...), v
		}
	}
	p.mu.Unlock()
	for _, f := range run {
		f(valid)
	}
}

// apply records one commit in the area and writes the area when the group
// is complete; it returns the callbacks to run, if it wrote (or gave up).
func (p *persistent) apply(r commitReq) ([]func(bool), bool) {
	if !r.ok {
		p.valid = false
	}
	p.setEntry(p.currentCommit, r.old, r.new)
	p.currentCommit++
	p.callbacks = append(p.callbacks, r.done)
	p.pendingCount--
	full := p.currentCommit == p.e
	if p.pendingCount != 0 && !full {
		return nil, false
	}
	if full {
		// The next area is zeroed before this one is written, so that the
		// store ends there after a crash.
		if err := p.chunkIO(areaLocation(p.e, p.currentArea+1), make([]byte, p.chunkBytes()), true, false); err != nil {
			p.valid = false
		}
	}
	if p.valid {
		if err := p.chunkIO(areaLocation(p.e, p.currentArea), p.area, true, true); err != nil {
			p.valid = false
		}
	}
	if full {
		p.currentCommit = 0
		p.currentArea++
		clear(p.area)
	}
	cbs := p.callbacks
	p.callbacks = nil
	return cbs, p.valid
}

func (p *persistent) usage() (uint64, uint64, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := uint64(p.cs)
	return p.nextFree * cs, uint64(p.cow.Size()) / stack.SectorSize, (p.currentArea + 2) * cs
}

// drop is persistent_drop_snapshot: the header is rewritten invalid.
func (p *persistent) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.valid = false
	if err := p.chunkIO(0, p.header(false), true, false); err != nil {
		kernelLog("write header failed")
	}
}

func (p *persistent) setDevice(cow stack.BlockDevice) {
	p.mu.Lock()
	p.cow = cow
	p.mu.Unlock()
}

// prepareMerge is persistent_prepare_merge.
func (p *persistent) prepareMerge() (uint64, uint64, int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.currentCommit == 0 {
		if p.currentArea == 0 {
			return 0, 0, 0, nil
		}
		p.currentArea--
		if err := p.chunkIO(areaLocation(p.e, p.currentArea), p.area, false, false); err != nil {
			kernelLog("Read error in exception store: shutting down merge")
			return 0, 0, 0, err
		}
		p.currentCommit = p.e
	}
	old, nw := p.entry(p.currentCommit - 1)
	nw &= chunkMask
	n := 1
	for i := int(p.currentCommit) - 2; i >= 0; i-- {
		o, c := p.entry(uint64(i))
		if o != old-uint64(n) || c&chunkMask != nw-uint64(n) {
			break
		}
		n++
	}
	return old, nw, n, nil
}

// commitMerge is persistent_commit_merge: the last n entries are zeroed on
// disk, then forgotten.
func (p *persistent) commitMerge(n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < n; i++ {
		p.setEntry(p.currentCommit-1-uint64(i), 0, 0)
	}
	if err := p.chunkIO(areaLocation(p.e, p.currentArea), p.area, true, true); err != nil {
		kernelLog("Write error in exception store: shutting down merge")
		return err
	}
	p.currentCommit -= uint64(n)
	p.nextFree = areaLocation(p.e, p.currentArea) + p.currentCommit + 1
	return nil
}

// Exception is one entry of a persistent store: origin chunk Old is kept
// in COW chunk New.
type Exception struct{ Old, New uint64 }

// Store is what ReadStore finds on a COW device.
type Store struct {
	// Chunk is the chunk size in sectors.
	Chunk uint32
	// Valid is the header's valid flag.
	Valid bool
	// Exceptions are the entries in the order of the areas.
	Exceptions []Exception
}

// ReadStore reads a persistent store from a COW device of size bytes, as
// the kernel reads it at load: the header, then the areas up to the first
// entry whose new chunk is 0. A COW whose first 4 bytes are zero is an
// empty store (Chunk 0). Errors are the kernel's: a bad magic ENXIO, a bad
// version or chunk size EINVAL, an area past the end EIO.
func ReadStore(cow io.ReaderAt, size int64) (*Store, error) {
	var h [headerSize]byte
	if _, err := cow.ReadAt(h[:], 0); err != nil {
		return nil, fmt.Errorf("header: %w", errors.Join(err, syscall.EIO))
	}
	le := binary.LittleEndian
	magic := le.Uint32(h[0:])
	if magic == 0 {
		return &Store{Valid: true}, nil
	}
	if magic != Magic {
		return nil, errNotSnapshot
	}
	st := &Store{Valid: le.Uint32(h[4:]) != 0, Chunk: le.Uint32(h[12:])}
	if v := le.Uint32(h[8:]); v != DiskVersion {
		return nil, fmt.Errorf("unable to handle snapshot disk version %d: %w", v, syscall.EINVAL)
	}
	if why := chunkProblem(st.Chunk, stack.SectorSize); why != "" {
		return nil, fmt.Errorf("invalid on-disk chunk size %d: %s: %w", st.Chunk, why, syscall.EINVAL)
	}
	if !st.Valid {
		return st, nil
	}
	cb := int64(st.Chunk) * stack.SectorSize
	e := uint64(cb / entrySize)
	area := make([]byte, cb)
	for i := uint64(0); ; i++ {
		off := int64(areaLocation(e, i)) * cb
		if off+cb > size {
			return nil, fmt.Errorf("area %d past the end of the COW device: %w", i, syscall.EIO)
		}
		if _, err := cow.ReadAt(area, off); err != nil {
			return nil, fmt.Errorf("area %d: %w", i, errors.Join(err, syscall.EIO))
		}
		for j := uint64(0); j < e; j++ {
			old, nw := le.Uint64(area[j*entrySize:]), le.Uint64(area[j*entrySize+8:])
			if nw == 0 {
				return st, nil
			}
			st.Exceptions = append(st.Exceptions, Exception{Old: old, New: nw & chunkMask})
		}
	}
}
