package stack

import (
	"context"
	"errors"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

// rw maps [off, off+len(p)) through the table, splitting at segment
// boundaries and at each target's MaxIO, and accounts each piece in disk. The
// range must lie inside the table. It stops at the first failing piece and
// returns its error; n counts the bytes of the pieces that succeeded before it.
func (t *Table) rw(ctx context.Context, disk *stats.Disk, k ioop.Op, p []byte, off int64) (n int, err error) {
	for len(p) > 0 {
		s := &t.segs[t.find(off)]
		rel := off - s.start
		m := int64(len(p))
		if lim := s.end - off; m > lim {
			m = lim
		}
		if s.maxIO > 0 {
			if lim := s.maxIO - rel%s.maxIO; m > lim {
				m = lim
			}
		}
		var got int
		if s.atMap {
			got, err = s.mapRW(ctx, disk, k, p[:m], rel)
		} else {
			// Accounting starts before the target is called and always
			// ends; nothing below looks for this piece, so it needs no
			// pooled state, only its start time.
			start := disk.Now()
			rr := disk.StartAt(k, start, off, m)
			got, err = s.targetRW(ctx, k, p[:m], rel)
			if err == nil && int64(got) != m {
				err = syscall.EIO
			}
			disk.DoneAt(k, uint64((m+SectorSize-1)/SectorSize), start, rr)
		}
		if err != nil {
			return n, err
		}
		n += got
		p, off = p[m:], off+m
	}
	return n, nil
}

// targetRW hands one piece to the segment's target.
func (s *segment) targetRW(ctx context.Context, k ioop.Op, p []byte, off int64) (int, error) {
	if k == ioop.Read {
		return s.target.ReadAt(ctx, p, off)
	}
	return s.target.WriteAt(ctx, p, off)
}

// mapRW hands one piece to a MapAccounter target, which decides when its
// accounting starts (StartAccounting) or that it is killed at map time.
func (s *segment) mapRW(ctx context.Context, disk *stats.Disk, k ioop.Op, p []byte, off int64) (int, error) {
	pc := newPiece(ctx, disk, k)
	pc.at = [2]int64{s.start + off, int64(len(p))}
	got, err := s.targetRW(pc, k, p, off)
	if err == nil && got != len(p) {
		err = syscall.EIO
	}
	pc.finish(int64(len(p)), err)
	return got, err
}

// span applies a discard or write-zeroes to [off, off+length) as the kernel
// does for fallocate on a dm device (block/fops.c: blkdev_fallocate):
//
//   - A discard on a table that does not take discards (Table.Limits) fails
//     with EOPNOTSUPP before any target sees it (block/blk-lib.c:
//     blkdev_issue_discard on a queue whose max_discard_sectors is 0).
//   - Write-zeroes on a table that does not take them, or that a target or
//     device answers with EOPNOTSUPP, becomes ordinary writes of zeros
//     (block/blk-lib.c: blkdev_issue_zeroout without
//     BLKDEV_ZERO_NOFALLBACK falls back to blkdev_issue_zero_pages).
func (t *Table) span(ctx context.Context, disk *stats.Disk, k ioop.Op, off, length int64) error {
	switch {
	case k == ioop.Discard && !t.limits.Discard:
		return syscall.EOPNOTSUPP
	case k == ioop.Zeroes && !t.limits.WriteZeroes:
		return t.zeroOut(ctx, disk, off, length)
	}
	err := t.pieces(ctx, disk, k, off, length)
	if k == ioop.Zeroes && errors.Is(err, syscall.EOPNOTSUPP) {
		return t.zeroOut(ctx, disk, off, length)
	}
	return err
}

// pieces hands a discard or write-zeroes to the targets, one piece per
// segment: the core splits these at segment ends only (drivers/md/dm.c:
// __process_abnormal_io and __send_changing_extent_only leave
// ti->max_io_len out). It stops at the first failing piece.
func (t *Table) pieces(ctx context.Context, disk *stats.Disk, k ioop.Op, off, length int64) error {
	for length > 0 {
		s := &t.segs[t.find(off)]
		m := min(length, s.end-off)
		pc := newPiece(ctx, disk, k)
		pc.at = [2]int64{off, m}
		if !s.atMap {
			pc.startAcct()
		}
		// Limits guarantees the target takes the operation.
		var err error
		if k == ioop.Discard {
			err = s.target.(Discarder).Discard(pc, off-s.start, m)
		} else {
			err = s.target.(ZeroWriter).WriteZeroes(pc, off-s.start, m)
		}
		pc.finish(m, err)
		if err != nil {
			return err
		}
		off, length = off+m, length-m
	}
	return nil
}

// zeroChunk is the most zeros one fallback write carries: a bio of
// BIO_MAX_VECS pages, as block/blk-lib.c: __blkdev_issue_zero_pages builds.
const zeroChunk = 1 << 20

// zeroPage is the data of the fallback writes. Targets never write into the
// buffer of a write (io.WriterAt's contract), so one shared buffer serves.
var zeroPage [zeroChunk]byte

// zeroOut writes zeros over [off, off+length) as ordinary writes of at most
// zeroChunk bytes each, the fallback of block/blk-lib.c:
// blkdev_issue_zeroout (blkdev_issue_zero_pages). As there, every write is
// issued even when one fails (the bios are chained and waited for
// together), and the first error is returned.
func (t *Table) zeroOut(ctx context.Context, disk *stats.Disk, off, length int64) error {
	var first error
	for length > 0 {
		m := min(length, zeroChunk)
		if _, err := t.rw(ctx, disk, ioop.Write, zeroPage[:m], off); err != nil && first == nil {
			first = err
		}
		off, length = off+m, length-m
	}
	return first
}

// flush sends one empty flush to every target that takes flushes; it is
// accounted once, as a write of 0 sectors.
func (t *Table) flush(ctx context.Context, disk *stats.Disk) error {
	pc := newPiece(ctx, disk, ioop.Flush)
	pc.startAcct()
	var first error
	for i := range t.segs {
		if f, ok := t.segs[i].target.(Flusher); ok {
			if err := f.Flush(pc); err != nil && first == nil {
				first = err
			}
		}
	}
	pc.finish(0, first)
	return first
}
