package thin

import (
	"context"
	"errors"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/thin/metadata"
)

// The I/O paths. A thin device's I/O never crosses a data block (MaxIO).
// Each virtual block has a reader/writer lock (striped over the pool): a
// read, or a write to a mapped block that is not shared, holds it shared
// and goes straight to the data device; provisioning a block, breaking
// its sharing and unmapping it hold it exclusively, so concurrent writes
// to one unprovisioned block provision it once and no I/O runs on a block
// while its mapping changes. A data block freed by an unmap or a break of
// sharing is not reused before the next commit, and commits wait for
// changes in progress (commitMu), so no I/O ever lands on a block that
// was handed to another mapping.

// zeros is a buffer of zeros that writes of zeros share; never written.
var zeros = make([]byte, 1<<20)

// copyBufs are buffers for copying blocks.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// errPoolGone: the pool has no table any more.
var errPoolGone = errors.New("thin-pool has no table")

func (p *pool) dataRead(ctx context.Context, b []byte, off int64) (int, error) {
	d := p.acquire()
	if d == nil {
		return 0, syscall.EIO
	}
	defer d.release()
	return d.data.ReadAt(ctx, b, off)
}

func (p *pool) dataWrite(ctx context.Context, b []byte, off int64) (int, error) {
	d := p.acquire()
	if d == nil {
		return 0, syscall.EIO
	}
	defer d.release()
	return d.data.WriteAt(ctx, b, off)
}

func (p *pool) dataDiscard(ctx context.Context, off, n int64) error {
	d := p.acquire()
	if d == nil {
		return syscall.EIO
	}
	defer d.release()
	return d.data.Discard(ctx, off, n)
}

// split returns the virtual block of byte offset off and the offset in it.
func (p *pool) split(off int64) (uint64, int64) {
	return uint64(off / p.blockBytes), off % p.blockBytes
}

// ReadAt reads mapped blocks from the data device and unmapped ones as
// zeros or from the external origin.
func (t *Target) ReadAt(ctx context.Context, b []byte, off int64) (int, error) {
	p := t.pool
	if p.getMode() == modeFail {
		return 0, syscall.EIO
	}
	v, o := p.split(off)
	l := p.blockLock(t.id, v)
	l.RLock()
	defer l.RUnlock()
	d, _, err := t.td.Find(v)
	switch {
	case err == nil:
		return p.dataRead(ctx, b, int64(d)*p.blockBytes+o)
	case errors.Is(err, metadata.ErrNotFound):
		return t.readUnmapped(ctx, b, off)
	}
	return 0, syscall.EIO
}

// readUnmapped reads b at off of a block that has no mapping: from the
// origin below its size, zeros elsewhere.
func (t *Target) readUnmapped(ctx context.Context, b []byte, off int64) (int, error) {
	osz := t.originSize.Load()
	if t.origin == nil || off >= osz {
		clear(b)
		return len(b), nil
	}
	in := b
	if end := off + int64(len(b)); end > osz {
		clear(b)
		in = b[:osz-off]
	}
	if _, err := t.origin.ReadAt(ctx, in, off); err != nil {
		return 0, err
	}
	return len(b), nil
}

// WriteAt writes to the block's data block; a block that is unmapped or
// shared gets a new data block first (provision_block, break_sharing).
// A FUA write on a device that changed in this transaction commits.
func (t *Target) WriteAt(ctx context.Context, b []byte, off int64) (int, error) {
	p := t.pool
	if p.getMode() == modeFail {
		return 0, syscall.EIO
	}
	v, o := p.split(off)
	l := p.blockLock(t.id, v)
	l.RLock()
	d, shared, err := t.td.Find(v)
	if err == nil && !shared {
		n, err := p.dataWrite(ctx, b, int64(d)*p.blockBytes+o)
		l.RUnlock()
		return t.afterWrite(ctx, n, err)
	}
	l.RUnlock()
	if err != nil && !errors.Is(err, metadata.ErrNotFound) {
		return 0, syscall.EIO
	}
	return t.writeSlow(ctx, b, v, o)
}

// afterWrite commits after a FUA write on a changed device (the kernel's
// bio_triggers_commit).
func (t *Target) afterWrite(ctx context.Context, n int, err error) (int, error) {
	if err != nil || !stack.FUA(ctx) || !t.td.Changed() {
		return n, err
	}
	if err := t.pool.commit(); err != nil {
		return 0, syscall.EIO
	}
	return n, nil
}

// waitReady waits while the pool is suspended.
func (t *Target) waitReady(ctx context.Context) error {
	p := t.pool
	for p.suspended.Load() {
		ch := p.waitChan()
		if !p.suspended.Load() {
			break
		}
		if t.requeue.Load() {
			return stack.ErrPushBack
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// waitSpace waits while the pool is out of data space and queues I/O; it
// returns ENOSPC when it errors I/O instead (error_if_no_space, or after
// no_space_timeout), and nil when the I/O should be tried again.
func (t *Target) waitSpace(ctx context.Context) error {
	p := t.pool
	for {
		ch := p.waitChan()
		p.mu.Lock()
		ens := p.pf.errorIfNoSpace
		p.mu.Unlock()
		switch {
		case p.getMode() != modeOutOfDataSpace:
			return nil
		case ens:
			return syscall.ENOSPC
		case t.requeue.Load():
			return stack.ErrPushBack
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// writeSlow writes to a block that needs a new data block.
func (t *Target) writeSlow(ctx context.Context, b []byte, v uint64, o int64) (int, error) {
	p := t.pool
	committed := false
	for {
		if err := t.waitReady(ctx); err != nil {
			return 0, err
		}
		if p.getMode() == modeFail {
			return 0, syscall.EIO
		}
		p.commitMu.RLock()
		l := p.blockLock(t.id, v)
		l.Lock()
		n, again, err := t.provision(ctx, b, v, o, &committed)
		l.Unlock()
		p.commitMu.RUnlock()
		switch again {
		case retryCommit:
			_ = p.commit()
			continue
		case retryWait:
			if err := t.waitSpace(ctx); err != nil {
				return 0, err
			}
			continue
		case retryNow:
			continue
		}
		return t.afterWrite(ctx, n, err)
	}
}

// What provision asks its caller to do before it tries again.
const (
	retryNone = iota
	retryCommit
	retryWait
	retryNow
)

// provision writes b at offset o of virtual block v, which had no
// unshared mapping when the caller looked, holding commitMu shared and the
// block's lock.
func (t *Target) provision(ctx context.Context, b []byte, v uint64, o int64, committed *bool) (int, int, error) {
	p := t.pool
	d, shared, err := t.td.Find(v)
	if err == nil && !shared {
		n, err := p.dataWrite(ctx, b, int64(d)*p.blockBytes+o)
		return n, retryNone, err
	}
	if err != nil && !errors.Is(err, metadata.ErrNotFound) {
		return 0, retryNone, syscall.EIO
	}
	mapped := err == nil
	switch m := p.getMode(); {
	case m.readOnly():
		return 0, retryNone, p.ioError()
	case m == modeOutOfDataSpace:
		return 0, retryWait, nil
	case m == modeFail:
		return 0, retryNone, syscall.EIO
	}
	nb, err := p.allocBlock()
	if errors.Is(err, errAllocNoSpace) {
		if !*committed {
			*committed = true
			return 0, retryCommit, nil
		}
		p.noSpace()
		return 0, retryNow, nil
	}
	if err != nil {
		return 0, retryNone, p.ioError()
	}
	if err := t.prepare(ctx, b, v, o, nb, d, mapped); err != nil {
		// The block was never mapped: give it back.
		_ = p.store.DecDataRange(nb, nb+1)
		if errors.Is(err, errPoolGone) {
			err = syscall.EIO
		}
		return 0, retryNone, err
	}
	if err := t.td.Insert(v, nb); err != nil {
		p.metadataFailed("dm_thin_insert_block", err)
		return 0, retryNone, p.ioError()
	}
	return len(b), retryNone, nil
}

// prepare fills new data block nb for a write of b at offset o of virtual
// block v: the rest of the block is copied from the shared block old (a
// break of sharing), from the external origin, or zeroed (unless
// skip_block_zeroing); then b is written.
func (t *Target) prepare(ctx context.Context, b []byte, v uint64, o int64, nb, old uint64, cow bool) error {
	p := t.pool
	bb := p.blockBytes
	dst := int64(nb) * bb
	end := o + int64(len(b))
	if o > 0 || end < bb {
		p.mu.Lock()
		zero := p.pf.zero
		p.mu.Unlock()
		for _, r := range [2][2]int64{{0, o}, {end, bb}} {
			if r[0] >= r[1] {
				continue
			}
			var err error
			switch {
			case cow:
				err = p.copyData(ctx, int64(old)*bb+r[0], dst+r[0], r[1]-r[0])
			case t.origin != nil && int64(v)*bb+r[0] < t.originSize.Load():
				err = t.copyOrigin(ctx, int64(v)*bb, dst, r[0], r[1], zero)
			case zero:
				err = p.zeroData(ctx, dst+r[0], r[1]-r[0])
			}
			if err != nil {
				return err
			}
		}
	}
	_, err := p.dataWrite(ctx, b, dst+o)
	return err
}

// copyData copies n bytes of the data device from src to dst.
func (p *pool) copyData(ctx context.Context, src, dst, n int64) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	for n > 0 {
		c := min(n, int64(len(*bp)))
		buf := (*bp)[:c]
		if _, err := p.dataRead(ctx, buf, src); err != nil {
			return err
		}
		if _, err := p.dataWrite(ctx, buf, dst); err != nil {
			return err
		}
		src, dst, n = src+c, dst+c, n-c
	}
	return nil
}

// zeroData writes n bytes of zeros to the data device at dst.
func (p *pool) zeroData(ctx context.Context, dst, n int64) error {
	for n > 0 {
		c := min(n, int64(len(zeros)))
		if _, err := p.dataWrite(ctx, zeros[:c], dst); err != nil {
			return err
		}
		dst, n = dst+c, n-c
	}
	return nil
}

// copyOrigin fills [from, to) of the block at vstart (bytes) of the
// device into the data block at dst: the part below the origin's size from
// the origin, the rest zeroed when zero is set.
func (t *Target) copyOrigin(ctx context.Context, vstart, dst, from, to int64, zero bool) error {
	p := t.pool
	inside := min(to, t.originSize.Load()-vstart)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	for x := from; x < inside; {
		c := min(inside-x, int64(len(*bp)))
		buf := (*bp)[:c]
		if _, err := t.origin.ReadAt(ctx, buf, vstart+x); err != nil {
			return err
		}
		if _, err := p.dataWrite(ctx, buf, dst+x); err != nil {
			return err
		}
		x += c
	}
	if zero && inside < to {
		return p.zeroData(ctx, dst+max(inside, from), to-max(inside, from))
	}
	return nil
}

// Flush commits when the device changed in this transaction (the commit
// flushes the data device first); otherwise it flushes the data device.
// Out of data space and in read-only modes a flush is keyed to virtual
// block 0 as the kernel keys an empty bio: with block 0 unmapped it
// queues or fails as a write needing a block would.
func (t *Target) Flush(ctx context.Context) error {
	p := t.pool
	for {
		m := p.getMode()
		if m == modeFail {
			return syscall.EIO
		}
		if m == modeWrite {
			break
		}
		if _, _, err := t.td.Find(0); err == nil {
			if m.readOnly() && t.td.Changed() {
				return syscall.EIO
			}
			break
		}
		if m.readOnly() {
			return syscall.EIO
		}
		if err := t.waitSpace(ctx); err != nil {
			return err
		}
	}
	if t.td.Changed() {
		if err := p.commit(); err != nil {
			return syscall.EIO
		}
		return nil
	}
	if err := p.flushData(); err != nil {
		return err
	}
	return nil
}

// discard unmaps the whole blocks of [off, off+n) (rounded inwards) and,
// with passdown, discards the data blocks no other mapping uses. In
// read-only modes it does nothing.
func (t *Target) discard(ctx context.Context, off, n int64) error {
	p := t.pool
	m := p.getMode()
	if m == modeFail {
		return syscall.EIO
	}
	if m.readOnly() {
		return nil
	}
	bb := p.blockBytes
	begin := uint64((off + bb - 1) / bb)
	end := uint64((off + n) / bb)
	if begin >= end {
		return nil
	}
	if err := t.waitReady(ctx); err != nil {
		return err
	}
	for begin < end {
		e := min(end, (begin/prisonMaxRange+1)*prisonMaxRange)
		if err := t.discardRange(ctx, begin, e); err != nil {
			return err
		}
		begin = e
	}
	return nil
}

// run is a range of data blocks.
type run struct{ begin, end uint64 }

// discardRange discards virtual blocks [begin, end), at most
// BIO_PRISON_MAX_RANGE of them.
func (t *Target) discardRange(ctx context.Context, begin, end uint64) error {
	p := t.pool
	p.commitMu.RLock()
	defer p.commitMu.RUnlock()
	if p.getMode().readOnly() {
		return nil
	}
	p.mu.Lock()
	passdown := p.pf.passdown
	p.mu.Unlock()
	var runs []run
	var held []uint64
	defer func() {
		for _, d := range held {
			_ = p.store.DecDataRange(d, d+1)
		}
	}()
	for v := begin; v < end; {
		vb, _, cnt, _, err := t.td.FindMappedRange(v, end)
		if errors.Is(err, metadata.ErrNotFound) {
			break
		}
		if err != nil {
			p.metadataFailed("dm_thin_find_mapped_range", err)
			return syscall.EIO
		}
		for vv := vb; vv < vb+cnt; vv++ {
			l := p.blockLock(t.id, vv)
			l.Lock()
			d, _, err := t.td.Find(vv)
			if err != nil {
				l.Unlock()
				continue
			}
			if passdown {
				// Held until the passdown is done, so that d is not
				// freed under it (dm_pool_inc_data_range).
				if err := p.store.IncDataRange(d, d+1); err == nil {
					held = append(held, d)
				}
			}
			err = t.td.Remove(vv)
			l.Unlock()
			if err != nil {
				p.metadataFailed("dm_thin_remove_range", err)
				return syscall.EIO
			}
			if !passdown {
				continue
			}
			if shared, err := p.store.BlockIsShared(d); err != nil || shared {
				continue
			}
			if k := len(runs) - 1; k >= 0 && runs[k].end == d {
				runs[k].end++
			} else {
				runs = append(runs, run{d, d + 1})
			}
		}
		v = vb + cnt
	}
	for _, r := range runs {
		// Errors of the passdown are ignored, as the kernel ignores them.
		_ = p.dataDiscard(ctx, int64(r.begin)*p.blockBytes, int64(r.end-r.begin)*p.blockBytes)
	}
	return nil
}
