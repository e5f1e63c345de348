package crash

import (
	"io"
	"slices"
	"sort"
	"sync"

	"github.com/dmfuse/dmfuse/internal/junk"
)

// source kinds of an extent
const (
	srcLog  = iota // the log's data, from pos
	srcZero        // zeros
	srcJunk        // junk drawn from the state's seed
)

// extent is a byte range of the device whose content a state takes from
// somewhere other than the base.
type extent struct {
	off, end int64
	kind     int
	pos      int64 // srcLog: log offset of byte off
}

// Overlay is the device of one state: the base (the device as of the
// cut's last completed flush) with the writes since painted over it as the
// state keeps or loses them, and the checker's own writes kept in memory
// on top, so that checking a state never changes the base or the log.
type Overlay struct {
	base io.ReaderAt
	log  io.ReaderAt
	size int64
	seed uint64 // of FillJunk's junk
	ext  []extent

	mu    sync.Mutex
	pages map[int64][]byte // the checker's writes, by page
}

const pageSize = 4096

// NewOverlay builds the device of state s of rec over base (the device
// with the writes before the cut's span applied) and log, size bytes.
func NewOverlay(rec *Record, s State, base, log io.ReaderAt, size int64) *Overlay {
	o := &Overlay{base: base, log: log, size: size, seed: s.Seed, pages: map[int64][]byte{}}
	from, to := rec.Span(s.Cut)
	lost := make(map[int][]uint32, len(s.Lost))
	whole := make(map[int]bool, len(s.Lost))
	for _, l := range s.Lost {
		if l.Units == nil {
			whole[l.Write] = true
		} else {
			lost[l.Write] = l.Units
		}
	}
	for i := from; i < to; i++ {
		w := rec.Writes[i]
		off, end := int64(w.Sector)*rec.Unit, int64(w.Sector+w.Count)*rec.Unit
		kept := func(a, b int64) {
			if w.Discard() || w.Data < 0 {
				o.paint(extent{off: a, end: b, kind: srcZero})
			} else {
				o.paint(extent{off: a, end: b, kind: srcLog, pos: w.Data + a - off})
			}
		}
		gone := func(a, b int64) {
			switch s.Fill {
			case FillZero:
				o.paint(extent{off: a, end: b, kind: srcZero})
			case FillJunk:
				o.paint(extent{off: a, end: b, kind: srcJunk})
			}
		}
		switch {
		case whole[i]:
			gone(off, end)
		case lost[i] != nil:
			u := s.Unit
			first := off / u
			lu := lost[i]
			at := off
			for _, k := range lu {
				ua, ub := (first+int64(k))*u, (first+int64(k)+1)*u
				if ua > at {
					kept(at, min(ua, end))
				}
				// A lost unit damages all of it, also the sectors of it
				// the write did not cover (a torn read-modify-write).
				gone(ua, ub)
				at = max(at, ub)
			}
			if at < end {
				kept(at, end)
			}
		default:
			kept(off, end)
		}
	}
	return o
}

// paint puts e over whatever extents it overlaps. The extents are sorted
// and disjoint: of those e overlaps, only the first can start before it
// and only the last end after it, and those ends are kept.
func (o *Overlay) paint(e extent) {
	if e.end > o.size {
		e.end = o.size
	}
	if e.off >= e.end {
		return
	}
	i := sort.Search(len(o.ext), func(i int) bool { return o.ext[i].end > e.off })
	j := i
	for j < len(o.ext) && o.ext[j].off < e.end {
		j++
	}
	repl := make([]extent, 0, 3)
	if i < j && o.ext[i].off < e.off {
		repl = append(repl, trim(o.ext[i], o.ext[i].off, e.off))
	}
	repl = append(repl, e)
	if i < j && o.ext[j-1].end > e.end {
		repl = append(repl, trim(o.ext[j-1], e.end, o.ext[j-1].end))
	}
	o.ext = slices.Replace(o.ext, i, j, repl...)
}

// trim returns the part [a, b) of x.
func trim(x extent, a, b int64) extent {
	if x.kind == srcLog {
		x.pos += a - x.off
	}
	x.off, x.end = a, b
	return x
}

// Size returns the device's size in bytes.
func (o *Overlay) Size() int64 { return o.size }

// ReadAt reads the state's device as the crash left it, with the checker's
// writes.
func (o *Overlay) ReadAt(p []byte, off int64) (int, error) {
	if off >= o.size {
		return 0, io.EOF
	}
	n := len(p)
	if int64(n) > o.size-off {
		n = int(o.size - off)
	}
	if err := o.readState(p[:n], off); err != nil {
		return 0, err
	}
	o.mu.Lock()
	for pg := off / pageSize * pageSize; pg < off+int64(n); pg += pageSize {
		if b := o.pages[pg]; b != nil {
			a, e := max(pg, off), min(pg+pageSize, off+int64(n))
			copy(p[a-off:e-off], b[a-pg:e-pg])
		}
	}
	o.mu.Unlock()
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// readState reads the device as the crash left it.
func (o *Overlay) readState(p []byte, off int64) error {
	end := off + int64(len(p))
	if _, err := o.base.ReadAt(p, off); err != nil && err != io.EOF {
		return err
	}
	i := sort.Search(len(o.ext), func(i int) bool { return o.ext[i].end > off })
	for ; i < len(o.ext) && o.ext[i].off < end; i++ {
		x := o.ext[i]
		a, b := max(x.off, off), min(x.end, end)
		dst := p[a-off : b-off]
		switch x.kind {
		case srcLog:
			if _, err := o.log.ReadAt(dst, x.pos+a-x.off); err != nil && err != io.EOF {
				return err
			}
		case srcZero:
			clear(dst)
		case srcJunk:
			junk.Fill(dst, o.seed, a)
		}
	}
	return nil
}

// WriteAt keeps a write of the checker's in memory.
func (o *Overlay) WriteAt(p []byte, off int64) (int, error) {
	if off >= o.size {
		return 0, io.ErrShortWrite
	}
	n := len(p)
	if int64(n) > o.size-off {
		n = int(o.size - off)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for pg := off / pageSize * pageSize; pg < off+int64(n); pg += pageSize {
		b := o.pages[pg]
		if b == nil {
			b = make([]byte, pageSize)
			o.mu.Unlock()
			err := o.readState(b[:min(pageSize, o.size-pg)], pg)
			o.mu.Lock()
			if err != nil {
				return 0, err
			}
			if o.pages[pg] == nil {
				o.pages[pg] = b
			} else {
				b = o.pages[pg]
			}
		}
		a, e := max(pg, off), min(pg+pageSize, off+int64(n))
		copy(b[a-pg:e-pg], p[a-off:e-off])
	}
	if n < len(p) {
		return n, io.ErrShortWrite
	}
	return n, nil
}
