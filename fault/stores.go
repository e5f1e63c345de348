package fault

import (
	"sync"
	"sync/atomic"
)

// The data some actions keep: sector versions for stale reads, the writes
// since the last flush that a lying flush takes back, phantom writes that
// read back until the next flush, and latent sector errors. Each is bounded
// (the history option, default 64 MiB, for the first three together); past
// the bound the oldest is forgotten, and the event log says so once.

const sector = 512

// history keeps, per sector, its contents before each of the last
// maxStale writes, oldest first.
type history struct {
	mu     sync.Mutex
	bytes  int64
	limit  int64
	vers   map[int64][][]byte
	order  []int64 // sectors in the order their first version came
	Lossed bool    // something was forgotten
}

func newHistory(limit int64) *history {
	return &history{limit: limit, vers: map[int64][][]byte{}}
}

// push records old, the contents of sectors [s, s+len(old)/512) before a
// write.
func (h *history) push(s int64, old []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 0; i+sector <= len(old); i += sector {
		sec := s + int64(i/sector)
		v := h.vers[sec]
		if v == nil {
			h.order = append(h.order, sec)
		}
		if len(v) == maxStale {
			h.bytes -= sector
			v = v[1:]
		}
		h.vers[sec] = append(v, append([]byte(nil), old[i:i+sector]...))
		h.bytes += sector
	}
	for h.bytes > h.limit && len(h.order) > 0 {
		sec := h.order[0]
		h.order = h.order[1:]
		h.bytes -= int64(len(h.vers[sec])) * sector
		delete(h.vers, sec)
		h.Lossed = true
	}
}

// stale puts into p (the current contents of sectors from s) each sector's
// version from before its last n writes, or its oldest known.
func (h *history) stale(s int64, p []byte, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 0; i+sector <= len(p); i += sector {
		v := h.vers[s+int64(i/sector)]
		if len(v) == 0 {
			continue
		}
		j := max(len(v)-n, 0)
		copy(p[i:i+sector], v[j])
	}
}

// undoLog keeps the old contents of what was written since the last flush.
type undoLog struct {
	held  atomic.Int64 // len(recs), read without the lock: a flush takes none while it is 0
	mu    sync.Mutex
	recs  []undo
	bytes int64
	limit int64
	lost  bool
}

type undo struct {
	off int64
	old []byte
}

func (u *undoLog) push(off int64, old []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.recs = append(u.recs, undo{off, old})
	u.bytes += int64(len(old))
	for u.bytes > u.limit && len(u.recs) > 0 {
		u.bytes -= int64(len(u.recs[0].old))
		u.recs = u.recs[1:]
		u.lost = true
	}
	u.held.Store(int64(len(u.recs)))
}

// take returns the records since the last flush, newest last, and forgets
// them.
func (u *undoLog) take() []undo {
	if u.held.Load() == 0 {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	r := u.recs
	u.recs, u.bytes = nil, 0
	u.held.Store(0)
	return r
}

// overlay holds phantom writes: what reads see until the next flush, which
// forgets them (the media never got them).
type overlay struct {
	held  atomic.Int64 // len(secs), read without the lock: I/O takes none while it is 0
	mu    sync.Mutex
	secs  map[int64][]byte
	bytes int64
	limit int64
}

func (o *overlay) put(s int64, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.secs == nil {
		o.secs = map[int64][]byte{}
	}
	for i := 0; i+sector <= len(p); i += sector {
		if _, ok := o.secs[s+int64(i/sector)]; !ok {
			o.bytes += sector
		}
		o.secs[s+int64(i/sector)] = append([]byte(nil), p[i:i+sector]...)
	}
	if o.bytes > o.limit {
		// Past the bound the oldest cannot be told apart cheaply: drop
		// them all, as a cache that lost them early.
		o.secs, o.bytes = nil, 0
	}
	o.held.Store(int64(len(o.secs)))
}

// apply copies what it holds of sectors from s into p.
func (o *overlay) apply(s int64, p []byte) {
	if o.held.Load() == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.secs) == 0 {
		return
	}
	for i := 0; i+sector <= len(p); i += sector {
		if v, ok := o.secs[s+int64(i/sector)]; ok {
			copy(p[i:i+sector], v)
		}
	}
}

// forget drops the sectors [s, s+n) (a real write replaced them).
func (o *overlay) forget(s, n int64) {
	if o.held.Load() == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := s; i < s+n && len(o.secs) > 0; i++ {
		if _, ok := o.secs[i]; ok {
			delete(o.secs, i)
			o.bytes -= sector
		}
	}
	o.held.Store(int64(len(o.secs)))
}

func (o *overlay) clear() {
	if o.held.Load() == 0 {
		return
	}
	o.mu.Lock()
	o.secs, o.bytes = nil, 0
	o.held.Store(0)
	o.mu.Unlock()
}

// latent are sectors whose reads fail until a write clears them, after
// failing count writes first (dm-dust's wr_fail_cnt).
type latent struct {
	held atomic.Int64 // len(secs), read without the lock: I/O takes none while it is 0
	mu   sync.Mutex
	secs map[int64]int // writes left to fail
}

func (l *latent) mark(s, n int64, count int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.secs == nil {
		l.secs = map[int64]int{}
	}
	for i := s; i < s+n; i++ {
		l.secs[i] = count
	}
	l.held.Store(int64(len(l.secs)))
}

// check reports whether an I/O on [s, s+n) fails: any read of a latent
// sector; a write while a latent sector in it still has writes to fail
// (each such sector's count goes down), else the write clears them.
func (l *latent) check(s, n int64, write bool) bool {
	if l.held.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer func() { l.held.Store(int64(len(l.secs))) }()
	if len(l.secs) == 0 {
		return false
	}
	hit, fail := false, false
	for i := s; i < s+n; i++ {
		c, ok := l.secs[i]
		if !ok {
			continue
		}
		hit = true
		if c > 0 {
			fail = true
		}
	}
	if !hit {
		return false
	}
	if !write {
		return true
	}
	for i := s; i < s+n; i++ {
		if c, ok := l.secs[i]; ok {
			if fail {
				if c > 0 {
					l.secs[i] = c - 1
				}
			} else {
				delete(l.secs, i)
			}
		}
	}
	return fail
}

func (l *latent) count() int { return int(l.held.Load()) }
