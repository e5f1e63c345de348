package snapshot

import (
	"context"

	"github.com/dmfuse/dmfuse/stack"
)

// OriginType is the snapshot-origin target (dm-snap.c: origin_target).
var OriginType = &stack.TargetType{Name: "snapshot-origin", Version: [3]int{1, 9, 0}, New: newOrigin}

// originTarget is a snapshot-origin target (struct dm_origin).
type originTarget struct {
	dev   stack.BlockDevice
	o     *origin
	begin int64
}

var (
	_ stack.Target  = (*originTarget)(nil)
	_ stack.Flusher = (*originTarget)(nil)
)

// newOrigin constructs a snapshot-origin target. The table syntax is
// dm-snapshot's:
//
//	<origin>
//
// Reads pass to the origin; a write first copies the chunks it changes into
// every snapshot of the origin that has not copied them yet. It takes no
// discards, as the kernel's.
func newOrigin(c *stack.Ctor, args []string) (stack.Target, error) {
	if len(args) != 1 {
		return nil, stack.Errorf("origin: incorrect number of arguments")
	}
	dev, err := c.Open(args[0])
	if err != nil {
		return nil, &stack.ArgError{Reason: "Cannot get target device: " + err.Error(), Errno: errnoOf(err)}
	}
	if err := stack.CheckArea(dev, 0, c.Len); err != nil {
		return nil, err
	}
	reg, err := registryOf(c)
	if err != nil {
		return nil, err
	}
	return &originTarget{dev: dev, o: reg.get(stack.DeviceKey(dev)), begin: c.Begin * stack.SectorSize}, nil
}

// ReadAt reads the origin.
func (t *originTarget) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return t.dev.ReadAt(ctx, p, t.begin+off)
}

// WriteAt writes the origin after the snapshots copied what it changes.
func (t *originTarget) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := t.o.writeThrough(ctx, t.dev, p, t.begin+off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush flushes the origin.
func (t *originTarget) Flush(ctx context.Context) error { return t.dev.Flush(ctx) }

// Status prints the origin; the INFO status is empty.
func (t *originTarget) Status(st stack.StatusType) string {
	if st == stack.StatusTable {
		return stack.EscapeArg(t.dev.Name())
	}
	return ""
}

// Close lets go of the origin's entry.
func (t *originTarget) Close() error {
	t.o.put()
	return nil
}

// writeThrough writes p at abs of the origin device dev, in pieces that do
// not cross a chunk of the registered snapshot with the smallest chunks,
// each after cowOut (do_origin): as the kernel cuts origin writes at its
// split boundary. The boundary is taken at each write, so a snapshot added
// without a resume of the origin cannot make writes too coarse.
func (o *origin) writeThrough(ctx context.Context, dev stack.BlockDevice, p []byte, abs int64) error {
	o.io.RLock()
	defer o.io.RUnlock()
	cb := int64(o.minChunk()) * stack.SectorSize
	return pieces(abs, int64(len(p)), cb, func(off, n int64) error {
		o.cowOut(ctx, off)
		return writeFull(ctx, dev, p[off-abs:off-abs+n], off)
	})
}

// cowOut is __origin_write for the write at byte abs of the origin: every
// valid, active snapshot (not snapshot-merge) whose device reaches abs and
// has no exception for its chunk gets one, its copy made, before it
// returns. A snapshot that cannot get one is invalidated; the write goes on
// either way. The caller holds o.io shared.
func (o *origin) cowOut(ctx context.Context, abs int64) {
	var mine, waits []*pending
	for _, s := range o.snapshots() {
		s.mu.Lock()
		if s.isMerge || abs >= s.devBytes || !s.valid || !s.active.Load() {
			s.mu.Unlock()
			continue
		}
		chunk := uint64(abs / s.chunkBytes())
		if _, ok := s.complete[chunk]; ok {
			s.mu.Unlock()
			continue
		}
		if pe := s.pending[chunk]; pe != nil {
			waits = append(waits, pe)
			s.mu.Unlock()
			continue
		}
		pe, err := s.newPending(chunk)
		if err != nil {
			// An origin write into a full COW invalidates, PO or not.
			s.invalidate(err)
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		mine = append(mine, pe)
	}
	// The copies into different snapshots go on side by side, as kcopyd
	// runs them; each commits on its own store.
	for i, pe := range mine {
		if i == len(mine)-1 {
			pe.s.finish(pe, pe.s.copyChunk(ctx, pe.chunk, pe.new))
			break
		}
		go func() { pe.s.finish(pe, pe.s.copyChunk(ctx, pe.chunk, pe.new)) }()
	}
	for _, pe := range mine {
		<-pe.done
	}
	for _, pe := range waits {
		<-pe.done
	}
}
