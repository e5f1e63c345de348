package stack

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// gateShards is the number of in-flight shards of a gate; a power of two.
const gateShards = 16

// gate holds new I/O while a device is suspended and lets suspend wait for the
// I/O already inside. Entering and leaving touch one randomly chosen,
// cache-line-padded shard, so concurrent I/O shares no written cache line; only
// suspend sums the shards, as the kernel sums its per-CPU md->pending_io counts
// only when a suspend waits (drivers/md/dm.c: dm_wait_for_completion).
type gate struct {
	blocked atomic.Bool
	shards  [gateShards]struct {
		n atomic.Int64
		_ [56]byte
	}
	mu   sync.Mutex
	cond sync.Cond // signalled on exit while blocked, and on open
}

func (g *gate) init() { g.cond.L = &g.mu }

// enter admits one I/O, waiting while the gate is closed; it returns the
// shard to pass to exit.
func (g *gate) enter(ctx context.Context) (int, error) {
	for {
		i := int(rand.Uint32() & (gateShards - 1))
		g.shards[i].n.Add(1)
		if !g.blocked.Load() {
			return i, nil
		}
		g.exit(i)
		Waiting(ctx)
		if err := g.wait(ctx); err != nil {
			return 0, err
		}
	}
}

// tryEnter admits one I/O unless the gate is closed; it never waits.
func (g *gate) tryEnter() (int, bool) {
	i := int(rand.Uint32() & (gateShards - 1))
	g.shards[i].n.Add(1)
	if !g.blocked.Load() {
		return i, true
	}
	g.exit(i)
	return 0, false
}

// exit lets one I/O out.
func (g *gate) exit(i int) {
	g.shards[i].n.Add(-1)
	if g.blocked.Load() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

// wait blocks until the gate opens or ctx ends.
func (g *gate) wait(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.blocked.Load() {
		if err := ctx.Err(); err != nil {
			return err
		}
		g.cond.Wait()
	}
	return nil
}

// inside returns the number of I/Os inside the gate.
func (g *gate) inside() int64 {
	var n int64
	for i := range g.shards {
		n += g.shards[i].n.Load()
	}
	return n
}

// close stops new I/O and waits until none is inside.
func (g *gate) close() {
	g.blocked.Store(true)
	g.mu.Lock()
	for g.inside() > 0 {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

// open releases held I/O.
func (g *gate) open() {
	g.mu.Lock()
	g.blocked.Store(false)
	g.cond.Broadcast()
	g.mu.Unlock()
}

// block stops new I/O without waiting for the I/O inside; close waits.
func (g *gate) block() { g.blocked.Store(true) }
