package multipath

import (
	"context"
	"errors"
	"runtime"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
)

// releaseLocked re-drives every held I/O; the caller holds mu.
func (m *multipath) releaseLocked() {
	if m.mu.held > 0 {
		close(m.mu.wake)
		m.mu.wake = make(chan struct{})
	}
}

// chooseIn asks pg's selector for a path (choose_path_in_pg) and makes pg
// the current group if it is not.
func (m *multipath) chooseIn(pg *priorityGroup, n int) *pgpath {
	sp := pg.sel.SelectPath(n)
	if sp == nil {
		return nil
	}
	pp := sp.Dev.(*pgpath)
	if m.currentPG.Load() != pg {
		m.mu.Lock()
		m.switchPGLocked(pg)
		m.mu.Unlock()
	}
	return pp
}

// switchPGLocked is __switch_pg without a hardware handler (no dmfuse path
// keeps one, see parsePG): the group is ready at once and queue_io is
// cleared.
func (m *multipath) switchPGLocked(pg *priorityGroup) {
	m.currentPG.Store(pg)
	m.queueIO.Store(false)
}

// choose picks a path for an I/O of n bytes (choose_pgpath): the group asked
// for by switch_group or the table, else the current group while it has a
// usable path, else the first group that yields one, bypassed groups last.
func (m *multipath) choose(n int) *pgpath {
	if m.nrValid.Load() > 0 {
		if m.nextPG.Load() != nil {
			m.mu.Lock()
			pg := m.nextPG.Swap(nil)
			m.mu.Unlock()
			if pg != nil {
				if pp := m.chooseIn(pg, n); pp != nil {
					return pp
				}
			}
		}
		if pg := m.currentPG.Load(); pg != nil {
			if pp := m.chooseIn(pg, n); pp != nil {
				return pp
			}
		}
		for _, bypassed := range [2]bool{false, true} {
			for _, pg := range m.pgs {
				if pg.bypassed.Load() != bypassed {
					continue
				}
				if pp := m.chooseIn(pg, n); pp != nil {
					return pp
				}
			}
		}
	}
	m.mu.Lock()
	if m.nrValid.Load() == 0 {
		m.queueIO.Store(false)
	}
	m.currentPG.Store(nil)
	m.mu.Unlock()
	return nil
}

// mapIO maps an I/O of n bytes to a path (__map_bio). With no path it holds
// the I/O, without any lock, while queue_if_no_path is set; otherwise it
// fails it: ErrPushBack while noflush-suspending, else EIO.
func (m *multipath) mapIO(ctx context.Context, n int) (*pgpath, error) {
	for {
		if pp := m.choose(n); pp != nil {
			return pp, nil
		}
		m.mu.Lock()
		if m.nrValid.Load() > 0 {
			// A path came back since choose looked.
			m.mu.Unlock()
			runtime.Gosched()
			continue
		}
		if !m.mu.queueIfNoPath {
			pushBack := m.mu.noflush
			m.mu.Unlock()
			if pushBack {
				return nil, stack.ErrPushBack
			}
			return nil, syscall.EIO
		}
		wake := m.mu.wake
		m.mu.held++
		m.mu.Unlock()
		stack.Waiting(ctx)
		select {
		case <-wake:
		case <-ctx.Done():
		}
		m.mu.Lock()
		m.mu.held--
		m.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// isPathError is blk_path_error: every error is a path error except
// not-supported, no-space, target, reservation-conflict, medium and
// protection errors. A cancelled request is not a path error either.
func isPathError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		switch e {
		case syscall.EOPNOTSUPP, syscall.ENOSPC, syscall.EREMOTEIO, syscall.EBADE, syscall.ENODATA, syscall.EILSEQ:
			return false
		}
	}
	return true
}

// io maps one I/O to a path and passes it on. A path error fails the path
// (a table event) and retries the I/O on another path; with no path left it
// waits while queue_if_no_path is set and otherwise fails (multipath_map_bio
// and multipath_end_io_bio). n is the I/O's size in bytes.
func (m *multipath) io(ctx context.Context, op ioop.Op, p []byte, off, n int64) (int, error) {
	for {
		pp, err := m.mapIO(ctx, int(n))
		if err != nil {
			return 0, err
		}
		stack.StartAccounting(ctx)
		var start int64
		tr := pp.pg.tracker
		if tr != nil {
			if pp.pg.typ.HRTimer {
				start = m.clock.Nanotime()
			}
			tr.StartIO(&pp.sp, int(n))
		}
		var got int
		switch op {
		case ioop.Read:
			got, err = pp.dev.ReadAt(ctx, p, off)
		case ioop.Write:
			got, err = pp.dev.WriteAt(ctx, p, off)
		case ioop.Flush:
			err = pp.dev.Flush(ctx)
		case ioop.Discard:
			err = pp.dev.Discard(ctx, off, n)
		case ioop.Zeroes:
			err = pp.dev.WriteZeroes(ctx, off, n)
		}
		if err == nil || !isPathError(err) {
			if tr != nil {
				tr.EndIO(&pp.sp, int(n), start)
			}
			return got, err
		}
		m.failPath(pp, err)
		if tr != nil {
			tr.EndIO(&pp.sp, int(n), start)
		}
		if m.nrValid.Load() == 0 {
			m.mu.Lock()
			queue, pushBack := m.mu.queueIfNoPath, m.mu.noflush
			m.mu.Unlock()
			if !queue {
				if pushBack {
					return 0, stack.ErrPushBack
				}
				return 0, syscall.EIO
			}
		}
	}
}

// ReadAt implements Target.
func (m *multipath) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return m.io(ctx, ioop.Read, p, off, int64(len(p)))
}

// WriteAt implements Target.
func (m *multipath) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return m.io(ctx, ioop.Write, p, off, int64(len(p)))
}

// Flush implements Flusher. As in dm (num_flush_bios = 1), one empty flush
// is mapped like any I/O: to the path the selector picks, failing over like
// a write. All paths lead to the same storage, so a flush through one of
// them reaches it; sending one down every path would cost a flush per path
// and fail when any single path fails, which multipath exists to hide.
func (m *multipath) Flush(ctx context.Context) error {
	_, err := m.io(ctx, ioop.Flush, nil, 0, 0)
	return err
}

// Discard implements Discarder: mapped to one path, like a write.
func (m *multipath) Discard(ctx context.Context, off, n int64) error {
	_, err := m.io(ctx, ioop.Discard, nil, off, n)
	return err
}

// WriteZeroes implements ZeroWriter: mapped to one path, like a write.
func (m *multipath) WriteZeroes(ctx context.Context, off, n int64) error {
	_, err := m.io(ctx, ioop.Zeroes, nil, off, n)
	return err
}

// failPath is fail_path: the path becomes F, its fail count goes up, its
// selector stops choosing it, and a table event is raised. Failing a failed
// path does nothing.
func (m *multipath) failPath(pp *pgpath, cause error) {
	m.mu.Lock()
	if !pp.active {
		m.mu.Unlock()
		return
	}
	pp.pg.sel.FailPath(&pp.sp)
	pp.active = false
	pp.failCount++
	left := m.nrValid.Add(-1)
	m.mu.Unlock()
	if cause != nil {
		m.logger.Printf("multipath: Failing path %s (%v); %d valid paths left.", pp.dev.Name(), cause, left)
	} else {
		m.logger.Printf("multipath: Failing path %s; %d valid paths left.", pp.dev.Name(), left)
	}
	m.event()
}

// reinstatePath is reinstate_path: the path becomes A again and its selector
// may choose it; if it is the only valid path, held I/O is re-driven.
// Reinstating an active path does nothing.
func (m *multipath) reinstatePath(pp *pgpath) error {
	m.mu.Lock()
	if pp.active {
		m.mu.Unlock()
		return nil
	}
	if err := pp.pg.sel.ReinstatePath(&pp.sp); err != nil {
		m.mu.Unlock()
		return &stack.ArgError{Reason: "reinstating path " + pp.dev.Name() + ": " + err.Error()}
	}
	pp.active = true
	if m.nrValid.Add(1) == 1 {
		m.releaseLocked()
	}
	m.mu.Unlock()
	m.logger.Printf("multipath: Reinstating path %s.", pp.dev.Name())
	m.event()
	return nil
}

// setQueueIfNoPathLocked is queue_if_no_path(): set or clear the flag,
// optionally saving the old value for resume; clearing it re-drives held
// I/O. The caller holds mu.
func (m *multipath) setQueueIfNoPathLocked(queue, save bool) {
	if save {
		if !m.mu.queueIfNoPath && m.mu.savedQueue {
			m.logger.Printf("multipath: queue_if_no_path disabled but saved as enabled, saving again loses state, not saving!")
		} else {
			m.mu.savedQueue = m.mu.queueIfNoPath
		}
	} else if !queue {
		m.mu.savedQueue = false
	}
	m.mu.queueIfNoPath = queue && !m.mu.closed
	if !queue {
		m.releaseLocked()
	}
}

// Presuspend implements Presuspender. dmfuse multipath is bio-based, so, as
// dm does in bio mode, queue_if_no_path is turned off (and saved) for every
// suspend: held I/O is re-driven and, with no path, fails, or with noflush
// is pushed back (ErrPushBack).
func (m *multipath) Presuspend(noflush bool) {
	m.mu.Lock()
	m.mu.noflush = noflush
	m.setQueueIfNoPathLocked(false, true)
	m.mu.Unlock()
}

// Postsuspend implements Postsuspender: the device is suspended, and
// messages fail with EBUSY until resume.
func (m *multipath) Postsuspend() {
	m.mu.Lock()
	m.mu.noflush = false
	m.mu.suspended = true
	m.mu.Unlock()
}

// Resume implements Resumer: the saved queue_if_no_path comes back.
func (m *multipath) Resume() {
	m.mu.Lock()
	if m.mu.savedQueue {
		m.mu.queueIfNoPath = !m.mu.closed
		m.mu.savedQueue = false
	}
	m.mu.noflush = false
	m.mu.suspended = false
	m.mu.Unlock()
}

// heldIOs returns the number of I/Os waiting for a path (for tests).
func (m *multipath) heldIOs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.held
}
