package stack

import (
	"context"
	"syscall"

	"github.com/dmfuse/dmfuse/stats"
)

// Request kinds the table maps.
type ioKind uint8

const (
	ioRead ioKind = iota
	ioWrite
	ioDiscard
	ioZeroes
)

var kindOp = [...]stats.Op{ioRead: stats.Read, ioWrite: stats.Write, ioDiscard: stats.Discard, ioZeroes: stats.Write}

// rw maps [off, off+len(p)) through the table, splitting at segment
// boundaries and at each target's MaxIO, and accounts each piece in disk. The
// range must lie inside the table. It stops at the first failing piece and
// returns its error; n counts the bytes of the pieces that succeeded before it.
func (t *Table) rw(ctx context.Context, disk *stats.Disk, k ioKind, p []byte, off int64) (n int, err error) {
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
			op := kindOp[k]
			start := disk.Now()
			rr := disk.StartAt(op, start, off, m)
			got, err = s.targetRW(ctx, k, p[:m], rel)
			if err == nil && int64(got) != m {
				err = syscall.EIO
			}
			disk.DoneAt(op, uint64((m+SectorSize-1)/SectorSize), start, rr)
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
func (s *segment) targetRW(ctx context.Context, k ioKind, p []byte, off int64) (int, error) {
	if k == ioRead {
		return s.target.ReadAt(ctx, p, off)
	}
	return s.target.WriteAt(ctx, p, off)
}

// mapRW hands one piece to a MapAccounter target, which decides when its
// accounting starts (StartAccounting) or that it is killed at map time.
func (s *segment) mapRW(ctx context.Context, disk *stats.Disk, k ioKind, p []byte, off int64) (int, error) {
	pc := newPiece(ctx, disk, kindOp[k])
	pc.at = [2]int64{s.start + off, int64(len(p))}
	got, err := s.targetRW(pc, k, p, off)
	if err == nil && got != len(p) {
		err = syscall.EIO
	}
	pc.finish(int64(len(p)), err)
	return got, err
}

// span applies a discard or write-zeroes to [off, off+length), one piece per
// segment.
func (t *Table) span(ctx context.Context, disk *stats.Disk, k ioKind, off, length int64) error {
	for length > 0 {
		s := &t.segs[t.find(off)]
		m := min(length, s.end-off)
		pc := newPiece(ctx, disk, kindOp[k])
		pc.at = [2]int64{off, m}
		if !s.atMap {
			pc.startAcct()
		}
		var err error
		switch tg := s.target.(type) {
		case Discarder:
			if k == ioDiscard {
				err = tg.Discard(pc, off-s.start, m)
				break
			}
			err = zeroes(pc, s.target, off-s.start, m)
		default:
			if k == ioDiscard {
				err = syscall.EOPNOTSUPP
			} else {
				err = zeroes(pc, s.target, off-s.start, m)
			}
		}
		pc.finish(m, err)
		if err != nil {
			return err
		}
		off, length = off+m, length-m
	}
	return nil
}

func zeroes(ctx context.Context, tg Target, off, n int64) error {
	if z, ok := tg.(ZeroWriter); ok {
		return z.WriteZeroes(ctx, off, n)
	}
	return syscall.EOPNOTSUPP
}

// flush sends one empty flush to every target that takes flushes; it is
// accounted once, as a write of 0 sectors.
func (t *Table) flush(ctx context.Context, disk *stats.Disk) error {
	pc := newPiece(ctx, disk, stats.Flush)
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
