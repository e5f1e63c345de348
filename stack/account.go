package stack

import (
	"context"
	"sync"

	"github.com/dmfuse/dmfuse/stats"
)

// piece is the per-piece accounting state of one I/O as it passes through a
// device. It is itself the context.Context handed to the target, so that a
// MapAccounter target can start accounting with StartAccounting(ctx) without a
// per-I/O allocation: pieces come from a pool.
type piece struct {
	context.Context
	disk    *stats.Disk
	op      stats.Op
	start   int64 // arrival, in the disk clock's ns
	started bool
	mu      sync.Mutex // only taken by StartAccounting, which may run on another goroutine
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

func newPiece(ctx context.Context, disk *stats.Disk, op stats.Op) *piece {
	p := piecePool.Get().(*piece)
	p.Context, p.disk, p.op, p.started = ctx, disk, op, false
	p.start = disk.Now()
	return p
}

// startAcct starts accounting once.
func (p *piece) startAcct() {
	p.mu.Lock()
	if !p.started {
		p.started = true
		p.disk.Start(p.op, p.start)
	}
	p.mu.Unlock()
}

// finish ends accounting by the rules of spec §4.4 and returns p to the pool:
// a piece whose accounting started is counted even when it failed; one that
// never started is counted only when it succeeded (the target completed it
// itself); a piece that failed without starting was killed at map time and
// counts nothing.
func (p *piece) finish(bytes int64, err error) {
	p.mu.Lock()
	started := p.started
	p.mu.Unlock()
	if !started && err == nil {
		p.disk.Start(p.op, p.start)
		started = true
	}
	if started {
		p.disk.Done(p.op, uint64((bytes+SectorSize-1)/SectorSize), p.start)
	}
	p.Context, p.disk = nil, nil
	piecePool.Put(p)
}

// StartAccounting starts the accounting of the I/O piece that ctx belongs to,
// if it has not started yet. MapAccounter targets call it when they pass a
// piece on (or complete it themselves); delay calls it when the wait is over,
// so that in-flight does not include waiting I/O while the time fields do.
func StartAccounting(ctx context.Context) {
	if p, ok := ctx.Value(pieceKey{}).(*piece); ok {
		p.startAcct()
	}
}
