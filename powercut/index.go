package powercut

import (
	"math/bits"
	"slices"
	"sync"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// chunkShift sets the span of one index chunk: 1 MiB.
const chunkShift = 20

// extent is a byte range [off, end) whose newest cached data is e's.
type extent struct {
	off, end int64
	e        *entry
}

// chunk holds the extents inside one 1 MiB span, sorted and disjoint.
type chunk struct{ ext []extent }

// flatChunks is the most chunks an index keeps in a slice indexed by
// chunk (a target of up to 16 GiB: 384 KiB of chunk headers); a larger
// target keeps its chunks in a map.
const flatChunks = 1 << 14

// flatKeep is the most extents an emptied chunk of a slice index keeps
// room for (768 bytes, so that a chunk that empties and fills again does
// not allocate; at most 12 MiB over a 16 GiB target).
const flatKeep = 32

// index maps each cached byte to the newest entry holding it. It is split
// into chunks so that an insertion moves only the extents of a chunk. The
// chunks of a target of at most flatChunks chunks are a slice indexed by
// chunk, so that finding one touches no map: an index operation is bound by
// the cache misses on the way to the extents. An empty chunk there has no
// extents.
//
// Chunk ck belongs to stripe ck % numStripes, whose lock guards it (and,
// for a larger target, the map its chunks are kept in): lock and unlock
// take the stripes of a range. The methods below expect the stripes of
// the range they touch held, or no concurrency.
type index struct {
	flat    []chunk
	stripes [numStripes]stripe
}

// numStripes is the number of stripes of an index: consecutive chunks fall
// in different stripes, so a range of up to 64 MiB locks each stripe once.
const numStripes = 64

// stripe is one lock of an index, and the chunks it guards when they are
// kept in a map. It fills a cache line, so that stripes taken on two CPUs
// do not share one.
type stripe struct {
	sync.Mutex
	chunks map[int64]*chunk
	free   []*chunk
	_      [64 - 8 - 8 - 24]byte
}

// init sets the index up for a target of length bytes.
func (x *index) init(length int64) {
	if n := (length + 1<<chunkShift - 1) >> chunkShift; n <= flatChunks {
		x.flat = make([]chunk, n)
		return
	}
	for i := range x.stripes {
		x.stripes[i].chunks = make(map[int64]*chunk)
	}
}

// stripeMask returns the stripes [off, end) touches, as a bit mask.
func stripeMask(off, end int64) uint64 {
	first, last := off>>chunkShift, (end-1)>>chunkShift
	if end <= off {
		last = first
	}
	if last-first >= numStripes-1 {
		return ^uint64(0)
	}
	a, b := uint(first%numStripes), uint(last%numStripes)
	lo := ^uint64(0) >> (63 - b) // stripes 0 to b
	hi := ^(uint64(1)<<a - 1)    // stripes a to 63
	if a <= b {
		return lo & hi
	}
	return lo | hi
}

// lock takes the stripes of [off, end), in ascending order, and returns
// them for unlock.
func (x *index) lock(off, end int64) uint64 {
	m := stripeMask(off, end)
	for s := m; s != 0; s &= s - 1 {
		x.stripes[bits.TrailingZeros64(s)].Lock()
	}
	return m
}

// lockAll takes every stripe.
func (x *index) lockAll() uint64 {
	for i := range x.stripes {
		x.stripes[i].Lock()
	}
	return ^uint64(0)
}

// unlock releases the stripes of m.
func (x *index) unlock(m uint64) {
	for s := m; s != 0; s &= s - 1 {
		x.stripes[bits.TrailingZeros64(s)].Unlock()
	}
}

// get returns chunk ck, nil when it has no extents.
func (x *index) get(ck int64) *chunk {
	if x.flat != nil {
		if c := &x.flat[ck]; len(c.ext) > 0 {
			return c
		}
		return nil
	}
	return x.stripes[ck%numStripes].chunks[ck]
}

// chunk returns chunk ck, making it when it has none.
func (x *index) chunk(ck int64) *chunk {
	if x.flat != nil {
		return &x.flat[ck]
	}
	st := &x.stripes[ck%numStripes]
	var c *chunk
	if c = st.chunks[ck]; c == nil {
		if n := len(st.free); n > 0 {
			c, st.free = st.free[n-1], st.free[:n-1]
		} else {
			c = new(chunk)
		}
		st.chunks[ck] = c
	}
	return c
}

// emptied is called when chunk ck, c, has no extents left.
func (x *index) emptied(ck int64, c *chunk) {
	if x.flat != nil {
		if cap(c.ext) > flatKeep {
			c.ext = nil
		}
		return
	}
	st := &x.stripes[ck%numStripes]
	delete(st.chunks, ck)
	st.free = append(st.free, c)
}

// reset empties the index.
func (x *index) reset() {
	for i := range x.flat {
		if c := &x.flat[i]; len(c.ext) > 0 {
			c.ext = c.ext[:0]
			x.emptied(int64(i), c)
		}
	}
	for i := range x.stripes {
		st := &x.stripes[i]
		for k, c := range st.chunks {
			c.ext = c.ext[:0]
			st.free = append(st.free, c)
			delete(st.chunks, k)
		}
	}
}

// search returns the index of the first extent of c ending after off.
func (c *chunk) search(off int64) int {
	lo, hi := 0, len(c.ext)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c.ext[m].end <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// chunkSpan clips [off, end) to chunk ck.
func chunkSpan(ck, off, end int64) (int64, int64) {
	return max(off, ck<<chunkShift), min(end, (ck+1)<<chunkShift)
}

// put makes e the newest data of [off, end).
func (x *index) put(off, end int64, e *entry) {
	for ck := off >> chunkShift; ck<<chunkShift < end; ck++ {
		c := x.chunk(ck)
		a, b := chunkSpan(ck, off, end)
		c.replace(a, b, e)
	}
}

// replace puts e over [a, b) of c (nil e: clears it), keeping what extents
// overlapping it hold outside it.
func (c *chunk) replace(a, b int64, e *entry) {
	i := c.search(a)
	j := i
	for j < len(c.ext) && c.ext[j].off < b {
		j++
	}
	var rep [3]extent
	k := 0
	if i < j && c.ext[i].off < a {
		rep[k] = extent{c.ext[i].off, a, c.ext[i].e}
		k++
	}
	if e != nil {
		rep[k] = extent{a, b, e}
		k++
	}
	if i < j && c.ext[j-1].end > b {
		rep[k] = extent{b, c.ext[j-1].end, c.ext[j-1].e}
		k++
	}
	c.ext = slices.Replace(c.ext, i, j, rep[:k]...)
}

// clear removes [off, end) from the index: all of it when only is nil,
// else only the extents of entry only.
func (x *index) clear(off, end int64, only *entry) {
	for ck := off >> chunkShift; ck<<chunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			continue
		}
		a, b := chunkSpan(ck, off, end)
		if only == nil {
			c.replace(a, b, nil)
		} else {
			i := c.search(a)
			j := i
			for j < len(c.ext) && c.ext[j].off < b {
				j++
			}
			kept := i
			for n := i; n < j; n++ {
				if c.ext[n].e != only {
					c.ext[kept] = c.ext[n]
					kept++
				}
			}
			c.ext = slices.Delete(c.ext, kept, j)
		}
		if len(c.ext) == 0 {
			x.emptied(ck, c)
		}
	}
}

// overlaps reports whether any byte of [off, end) is cached.
func (x *index) overlaps(off, end int64) bool {
	for ck := off >> chunkShift; ck<<chunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			continue
		}
		a, b := chunkSpan(ck, off, end)
		if i := c.search(a); i < len(c.ext) && c.ext[i].off < b {
			return true
		}
	}
	return false
}

// covers reports whether every byte of [off, end) is cached.
func (x *index) covers(off, end int64) bool {
	pos := off
	for ck := off >> chunkShift; ck<<chunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			return false
		}
		_, b := chunkSpan(ck, off, end)
		for i := c.search(pos); pos < b; i++ {
			if i == len(c.ext) || c.ext[i].off > pos {
				return false
			}
			pos = c.ext[i].end
		}
	}
	return true
}

// read lays the cached data of [off, off+len(p)) over p.
func (x *index) read(p []byte, off int64) {
	end := off + int64(len(p))
	for ck := off >> chunkShift; ck<<chunkShift < end; ck++ {
		c := x.get(ck)
		if c == nil {
			continue
		}
		a, b := chunkSpan(ck, off, end)
		for i := c.search(a); i < len(c.ext) && c.ext[i].off < b; i++ {
			x := c.ext[i]
			s, t := max(x.off, a), min(x.end, b)
			dst := p[s-off : t-off]
			if x.e.kind == ioop.Write {
				copy(dst, x.e.data[s-x.e.off:t-x.e.off])
			} else {
				clear(dst)
			}
		}
	}
}
