package stack

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

// piece is the per-piece accounting state of one I/O handed to a
// MapAccounter target. It is itself the context.Context handed to the target,
// so that the target can start accounting with StartAccounting(ctx) without a
// per-I/O allocation: pieces come from a pool. Pieces for other targets need
// no such state; Table.rw accounts them inline.
type piece struct {
	context.Context
	disk    *stats.Disk
	op      ioop.Op
	start   int64           // arrival, in the disk clock's ns
	started atomic.Bool     // set once, by whichever of StartAccounting and finish comes first
	at      [2]int64        // device bytes [at[0], at[0]+at[1]), for dm-stats regions
	reg     stats.RegionRef // the dm-stats regions the piece started in
}

type pieceKey struct{}

// Value implements context.Context.
func (p *piece) Value(key any) any {
	if _, ok := key.(pieceKey); ok {
		return p
	}
	return p.Context.Value(key)
}

var piecePool = sync.Pool{New: func() any { return new(piece) }}

func newPiece(ctx context.Context, disk *stats.Disk, op ioop.Op) *piece {
	p := piecePool.Get().(*piece)
	p.Context, p.disk, p.op = ctx, disk, op
	p.started.Store(false)
	p.start = disk.Now()
	return p
}

// startAcct starts accounting once.
func (p *piece) startAcct() {
	if p.started.CompareAndSwap(false, true) {
		p.reg = p.disk.StartAt(p.op, p.start, p.at[0], p.at[1])
	}
}

// finish ends accounting as drivers/md/dm.c: __dm_io_complete does and returns
// p to the pool: a piece whose accounting started is counted even when it
// failed; one that never started is counted only when it succeeded (the target
// completed it itself); a piece that failed without starting was killed at map
// time and counts nothing.
func (p *piece) finish(bytes int64, err error) {
	if err == nil && p.started.CompareAndSwap(false, true) {
		p.reg = p.disk.StartAt(p.op, p.start, p.at[0], p.at[1])
	}
	if p.started.Load() {
		p.disk.DoneAt(p.op, uint64((bytes+SectorSize-1)/SectorSize), p.start, p.reg)
	}
	p.Context, p.disk, p.at, p.reg = nil, nil, [2]int64{}, stats.RegionRef{}
	piecePool.Put(p)
}

// StartAccounting starts the accounting of the I/O piece that ctx belongs to,
// if it has not started yet. MapAccounter targets call it when they pass a
// piece on (or complete it themselves); delay calls it when the wait is over,
// so that in-flight does not include waiting I/O while the time fields do.
// Only MapAccounter targets may call it: other targets are accounted by the
// table, and their ctx may belong to the device above.
func StartAccounting(ctx context.Context) {
	if p, ok := ctx.Value(pieceKey{}).(*piece); ok {
		p.startAcct()
	}
}
