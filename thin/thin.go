package thin

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/thin/metadata"
)

// Target is a constructed thin target (struct thin_c): one thin device of
// a pool.
type Target struct {
	pool       *pool
	poolDev    stack.BlockDevice
	origin     stack.BlockDevice
	originSize atomic.Int64
	id         uint32
	td         metadata.Thin
	// requeue is set by a noflush suspend: I/O waiting for the pool is
	// pushed back to the device, which issues it again after resume.
	requeue atomic.Bool
	closed  bool
}

// discardThin is a thin target of a pool with discards enabled.
type discardThin struct{ *Target }

var (
	_ stack.Target        = (*Target)(nil)
	_ stack.Flusher       = (*Target)(nil)
	_ stack.MaxIOer       = (*Target)(nil)
	_ stack.Presuspender  = (*Target)(nil)
	_ stack.Postsuspender = (*Target)(nil)
	_ stack.Preresumer    = (*Target)(nil)
	_ stack.Discarder     = discardThin{}
	_ stack.DiscardOwner  = discardThin{}
)

// tables is what a mapped device argument offers to find its targets.
type tables interface {
	Live() *stack.Table
	Inactive() *stack.Table
}

// poolOf returns the pool object bound to the mapped device dev (the
// kernel's __pool_table_lookup of dm_get_md): the pool of a thin-pool
// target in its live or inactive table. ok is false when dev is no mapped
// device.
func poolOf(dev stack.BlockDevice) (p *pool, ok bool) {
	md, ok := dev.(tables)
	if !ok {
		return nil, false
	}
	for _, t := range []*stack.Table{md.Live(), md.Inactive()} {
		if t == nil {
			continue
		}
		t.Targets(func(_, _ int64, _ *stack.TargetType, tg stack.Target) {
			switch x := tg.(type) {
			case *PoolTarget:
				p = x.pool
			case discardPool:
				p = x.pool
			}
		})
		if p != nil {
			return p, true
		}
	}
	return nil, true
}

// newThin constructs a thin target. The table syntax is dm-thin's:
//
//	<pool dev> <dev id> [<external origin dev>]
//
// The pool device is a mapped device with a thin-pool table, the dev id a
// device created by the pool's create_thin or create_snap message (at most
// 2^24-1). Unmapped blocks read from the external origin, when given, and
// as zeros past its end. The checks and their errors are thin_ctr's, in its
// order; the pool must not be suspended.
func newThin(c *stack.Ctor, args []string) (stack.Target, error) {
	if len(args) != 2 && len(args) != 3 {
		return nil, stack.Errorf("Invalid argument count")
	}
	t := &Target{}
	if len(args) == 3 {
		if args[0] == args[2] {
			return nil, stack.Errorf("Error setting origin device")
		}
		o, err := c.Open(args[2])
		if err != nil {
			return nil, &stack.ArgError{Reason: "Error opening origin device: " + err.Error(), Errno: errnoOf(err, syscall.EINVAL)}
		}
		t.origin = o
		t.originSize.Store(o.Size())
	}
	pd, err := c.Open(args[0])
	if err != nil {
		return nil, &stack.ArgError{Reason: "Error opening pool device: " + err.Error(), Errno: errnoOf(err, syscall.EINVAL)}
	}
	t.poolDev = pd
	id, ok := ParseDevID(args[1])
	if !ok {
		return nil, stack.Errorf("Invalid device id")
	}
	t.id = id
	p, mapped := poolOf(pd)
	if p != nil && !p.get() {
		p = nil // its last table closed since poolOf found it
	}
	if !mapped {
		return nil, stack.Errorf("Couldn't get pool mapped device")
	}
	if p == nil {
		return nil, stack.Errorf("Couldn't find pool object")
	}
	if p.getMode() == modeFail {
		p.put()
		return nil, stack.Errorf("Couldn't open thin device, Pool is in fail mode")
	}
	td, err := p.store.OpenThin(id)
	if err != nil {
		p.put()
		return nil, &stack.ArgError{Reason: "Couldn't open thin internal device: " + err.Error(), Errno: storeErrno(err)}
	}
	if p.suspended.Load() {
		_ = td.Close()
		p.put()
		return nil, stack.Errorf("Unable to activate thin device while pool is suspended")
	}
	t.pool, t.td = p, td
	p.mu.Lock()
	discard := p.pf.discard
	p.mu.Unlock()
	if discard {
		return discardThin{t}, nil
	}
	return t, nil
}

// MaxIO is one data block: no piece crosses a block (max_io_len).
func (t *Target) MaxIO() int64 { return t.pool.blockBytes }

// Status prints `<pool dev> <dev id>[ <origin dev>]` for the table, and
// `<mapped sectors> <highest mapped sector>` (`-` with nothing mapped) for
// the status, as thin_status does; neither ends with a space. A failed pool
// prints Fail.
func (t *Target) Status(st stack.StatusType) string {
	p := t.pool
	if p.getMode() == modeFail {
		return "Fail"
	}
	b := make([]byte, 0, 64)
	if st == stack.StatusTable {
		b = append(b, stack.EscapeArg(t.poolDev.Name())...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(t.id), 10)
		if t.origin != nil {
			b = append(b, ' ')
			b = append(b, stack.EscapeArg(t.origin.Name())...)
		}
		return string(b)
	}
	spb := uint64(p.sectorsPerBlock)
	n, err := t.td.MappedCount()
	if err != nil {
		return "Error"
	}
	hi, ok, err := t.td.HighestMapped()
	if err != nil {
		return "Error"
	}
	b = strconv.AppendUint(b, n*spb, 10)
	b = append(b, ' ')
	if !ok {
		return string(append(b, '-'))
	}
	return string(strconv.AppendUint(b, (hi+1)*spb-1, 10))
}

// Presuspend with noflush pushes back the I/O that waits for the pool
// (thin_presuspend's requeue mode).
func (t *Target) Presuspend(noflush bool) {
	if !noflush {
		return
	}
	p := t.pool
	p.mu.Lock()
	t.requeue.Store(true)
	p.changedLocked()
	p.mu.Unlock()
}

// Postsuspend leaves requeue mode.
func (t *Target) Postsuspend() { t.requeue.Store(false) }

// Preresume takes the external origin's size again (thin_preresume).
func (t *Target) Preresume() error {
	if t.origin != nil {
		t.originSize.Store(t.origin.Size())
	}
	return nil
}

// Close releases the thin device and the pool object (thin_dtr).
func (t *Target) Close() error {
	if t.closed {
		return nil
	}
	t.closed = true
	err := t.td.Close()
	t.pool.put()
	return err
}

// Discard unmaps the whole blocks in the range (see discard).
func (d discardThin) Discard(ctx context.Context, off, n int64) error {
	return d.discard(ctx, off, n)
}

// OwnsDiscards: a thin device takes discards whatever the pool device
// takes (the kernel sets discards_supported).
func (discardThin) OwnsDiscards() {}
