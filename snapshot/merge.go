package snapshot

import (
	"context"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
)

// MergeType is the snapshot-merge target (dm-snap.c: merge_target).
var MergeType = &stack.TargetType{Name: "snapshot-merge", Version: [3]int{1, 5, 0}, New: newMerge}

// mergeTarget is a snapshot-merge target: a snap that merges its COW back
// into the origin and stands for the origin meanwhile.
type mergeTarget snap

// mergeRun is the state of a merge (the kernel's RUNNING_MERGE and
// SHUTDOWN_MERGE bits and the range being merged).
type mergeRun struct {
	mu      sync.Mutex
	stop    chan struct{}
	done    chan struct{}
	running bool
}

var (
	_ stack.Target       = (*mergeTarget)(nil)
	_ stack.Flusher      = (*mergeTarget)(nil)
	_ stack.Presuspender = (*mergeTarget)(nil)
	_ stack.Preresumer   = (*mergeTarget)(nil)
	_ stack.Resumer      = (*mergeTarget)(nil)
	_ stack.Discarder    = mergeDiscard{}
	_ stack.DiscardOwner = mergeDiscard{}
)

// mergeDiscard is a snapshot-merge target with discard features: it takes
// discards and does nothing with them ("Once merging, discards no longer
// effect change").
type mergeDiscard struct{ *mergeTarget }

// OwnsDiscards: discards complete in the target.
func (mergeDiscard) OwnsDiscards() {}

// Discard completes the discard at once.
func (mergeDiscard) Discard(context.Context, int64, int64) error { return nil }

// newMerge constructs a snapshot-merge target. The table syntax is
// dm-snapshot's, as snapshot's:
//
//	<origin> <COW device> <P|PO> <chunk size> [<#features> [<feature>...]]
//
// It takes the place of the origin's snapshot-origin and copies the
// snapshot's chunks back into the origin in the background, last exception
// first, zeroing each merged entry on the COW so that a merge stopped at any
// point resumes where it was. Loaded over a live snapshot of the same COW
// device it takes its exceptions over at resume (the snapshot then fails
// its I/O); loaded fresh it reads them from the COW. A transient store (N)
// cannot merge.
func newMerge(c *stack.Ctor, args []string) (stack.Target, error) {
	t, err := construct(c, args, true)
	if err != nil {
		return nil, err
	}
	if m := t.(*mergeTarget); m.discardZeroes {
		return mergeDiscard{m}, nil
	}
	return t, nil
}

func (m *mergeTarget) snap() *snap { return (*snap)(m) }

// ReadAt reads a chunk with an exception from the COW and any other from
// the origin.
func (m *mergeTarget) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	s := m.snap()
	abs := s.begin + off
	err := pieces(abs, int64(len(p)), s.chunkBytes(), func(o, n int64) error {
		cb := s.chunkBytes()
		s.mu.Lock()
		nw, ok := s.complete[uint64(o/cb)]
		ok = ok && s.valid
		s.mu.Unlock()
		if ok {
			return readFull(ctx, s.cowDev, p[o-abs:o-abs+n], int64(nw)*cb+o%cb)
		}
		return readFull(ctx, s.originDev, p[o-abs:o-abs+n], o)
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt writes a chunk with an exception to the COW (after the merge step
// that copies it, if one is under way, to the origin then), any other to
// the origin through the other snapshots' copy-out (snapshot_merge_map).
func (m *mergeTarget) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	s := m.snap()
	abs := s.begin + off
	err := pieces(abs, int64(len(p)), s.chunkBytes(), func(o, n int64) error {
		return m.writeChunk(ctx, p[o-abs:o-abs+n], o)
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (m *mergeTarget) writeChunk(ctx context.Context, p []byte, abs int64) error {
	s := m.snap()
	cb := s.chunkBytes()
	chunk := uint64(abs / cb)
	s.mu.Lock()
	for s.valid {
		nw, ok := s.complete[chunk]
		if !ok {
			break
		}
		if s.merging(chunk) {
			// Queued until the step commits; then the chunk is the
			// origin's, or the write fails with the merge.
			s.cond.Wait()
			if s.mergeFailed && !s.merging(chunk) {
				if _, still := s.complete[chunk]; still {
					s.mu.Unlock()
					return syscall.EIO
				}
			}
			continue
		}
		s.writers[chunk]++
		s.mu.Unlock()
		err := writeFull(ctx, s.cowDev, p, int64(nw)*cb+abs%cb)
		s.mu.Lock()
		if s.writers[chunk]--; s.writers[chunk] == 0 {
			delete(s.writers, chunk)
			s.cond.Broadcast()
		}
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	return s.origin.writeThrough(ctx, s.originDev, p, abs)
}

// Flush flushes the origin and the COW device (num_flush_bios 2).
func (m *mergeTarget) Flush(ctx context.Context) error {
	s := m.snap()
	if err := s.originDev.Flush(ctx); err != nil {
		return err
	}
	return s.cowDev.Flush(ctx)
}

// Status is snapshot's.
func (m *mergeTarget) Status(t stack.StatusType) string { return m.snap().Status(t) }

// Presuspend stops the merge once its current step is done.
func (m *mergeTarget) Presuspend(bool) { m.snap().stopMerge() }

// Preresume is snapshot's.
func (m *mergeTarget) Preresume() error { return m.snap().Preresume() }

// Resume takes over the exceptions of a live snapshot (a handover), then
// starts the merge.
func (m *mergeTarget) Resume() {
	s := m.snap()
	s.Resume()
	s.startMerge()
}

// Close stops the merge and leaves the origin's list.
func (m *mergeTarget) Close() error { return m.snap().Close() }

// merging reports whether chunk is in the step being merged; the caller
// holds s.mu.
func (s *snap) merging(chunk uint64) bool {
	return s.mergeHi > s.mergeLo && chunk >= s.mergeLo && chunk < s.mergeHi
}

// startMerge starts the merge loop unless it runs (start_merge).
func (s *snap) startMerge() {
	if !s.isMerge {
		return
	}
	r := &s.run
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return
	}
	r.running = true
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	go s.mergeLoop(r.stop, r.done)
}

// stopMerge asks the merge loop to stop and waits until it has, its current
// step committed (stop_merge).
func (s *snap) stopMerge() {
	r := &s.run
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return
	}
	close(r.stop)
	<-r.done
	r.running = false
}

// mergeLoop merges until the store is empty, the merge fails or it is
// stopped (snapshot_merge_next_chunks, merge_callback).
func (s *snap) mergeLoop(stop, done chan struct{}) {
	defer close(done)
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		default:
		}
		s.mu.Lock()
		valid, failed := s.valid, s.mergeFailed
		s.mu.Unlock()
		if failed {
			return
		}
		if !valid {
			kernelLog("Snapshot is invalid: can't merge")
			return
		}
		if !s.mergeStep(ctx) {
			return
		}
	}
}

// mergeStep merges the last run of consecutive exceptions; false when
// nothing is left or the merge failed.
func (s *snap) mergeStep(ctx context.Context) bool {
	mg := s.st.(merger)
	old, nw, n, err := mg.prepareMerge()
	if err != nil {
		s.failMerge()
		return false
	}
	if n == 0 {
		return false
	}
	o := s.origin
	cb := s.chunkBytes()
	first := old - uint64(n) + 1
	from := int64(first) * cb
	length := min(int64(n)*cb, s.originDev.Size()-from)
	o.io.RLock()
	defer o.io.RUnlock()
	// The other snapshots copy the range out before the origin changes
	// (origin_write_extent).
	step := int64(o.minChunk()) * stack.SectorSize
	for off := from - from%step; off < from+length; off += step {
		o.cowOut(ctx, off)
	}
	s.mu.Lock()
	s.mergeLo, s.mergeHi = first, old+1
	for s.writersIn(first, old+1) {
		s.cond.Wait()
	}
	s.mu.Unlock()
	err = copyRange(ctx, s.cowDev, int64(nw-uint64(n)+1)*cb, s.originDev, from, length)
	if err != nil {
		kernelLog("Read error: shutting down merge.")
	} else if err = s.originDev.Flush(ctx); err != nil {
		kernelLog("Flush after merge failed: shutting down merge")
	} else {
		err = mg.commitMerge(n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mergeLo, s.mergeHi = 0, 0
	if err != nil {
		s.mergeFailed = true
		s.cond.Broadcast()
		return false
	}
	for c := first; c <= old; c++ {
		delete(s.complete, c)
	}
	s.account()
	s.cond.Broadcast()
	return true
}

// writersIn reports a tracked write to a chunk of [lo, hi); the caller
// holds s.mu.
func (s *snap) writersIn(lo, hi uint64) bool {
	for c := range s.writers {
		if c >= lo && c < hi {
			return true
		}
	}
	return false
}

func (s *snap) failMerge() {
	s.mu.Lock()
	s.mergeFailed = true
	s.cond.Broadcast()
	s.mu.Unlock()
}
