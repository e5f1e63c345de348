package btree

import (
	"github.com/dmfuse/dmfuse/persistent"
)

// Lookup copies the value of key into val (which has the value size) and
// reports whether the key is present.
func Lookup(info *Info, root, key uint64, val []byte) (bool, error) {
	loc := root
	for depth := 0; ; depth++ {
		if depth > MaxDepth {
			return false, persistent.Corruptf("btree %d deeper than %d levels", root, MaxDepth)
		}
		b, n, err := info.readNode(loc)
		if err != nil {
			return false, err
		}
		i := n.lowerBound(key)
		if i < 0 {
			info.TM.Unlock(b)
			return false, nil
		}
		if n.isLeaf() {
			ok := n.key(i) == key
			if ok && val != nil {
				copy(val, n.value(i))
			}
			info.TM.Unlock(b)
			return ok, nil
		}
		loc = n.value64(i)
		info.TM.Unlock(b)
	}
}

// LookupNext finds the smallest key >= key, copying its value into val.
func LookupNext(info *Info, root, key uint64, val []byte) (k uint64, ok bool, err error) {
	budget := maxVisits
	return lookupNext(info, root, key, val, 0, &budget)
}

// maxVisits bounds the nodes a search visits: in a valid tree a search
// for the next or highest key visits at most two nodes a level.
const maxVisits = 4 * MaxDepth

func lookupNext(info *Info, loc, key uint64, val []byte, depth int, budget *int) (uint64, bool, error) {
	if *budget--; *budget < 0 {
		return 0, false, persistent.Corruptf("btree search from %d visits too many nodes", loc)
	}
	if depth > MaxDepth {
		return 0, false, persistent.Corruptf("btree deeper than %d levels at %d", MaxDepth, loc)
	}
	b, n, err := info.readNode(loc)
	if err != nil {
		return 0, false, err
	}
	defer info.TM.Unlock(b)
	i := n.lowerBound(key)
	if n.isLeaf() {
		if i < 0 || n.key(i) < key {
			i++
		}
		if i >= n.nr() {
			return 0, false, nil
		}
		if val != nil {
			copy(val, n.value(i))
		}
		return n.key(i), true, nil
	}
	if i < 0 {
		i = 0
	}
	for ; i < n.nr(); i++ {
		k, ok, err := lookupNext(info, n.value64(i), key, val, depth+1, budget)
		if err != nil || ok {
			return k, ok, err
		}
	}
	return 0, false, nil
}

// FindHighest returns the highest key (ok false when the tree is empty).
func FindHighest(info *Info, root uint64, val []byte) (uint64, bool, error) {
	budget := maxVisits
	return findHighest(info, root, val, 0, &budget)
}

func findHighest(info *Info, loc uint64, val []byte, depth int, budget *int) (uint64, bool, error) {
	if *budget--; *budget < 0 {
		return 0, false, persistent.Corruptf("btree search from %d visits too many nodes", loc)
	}
	if depth > MaxDepth {
		return 0, false, persistent.Corruptf("btree deeper than %d levels at %d", MaxDepth, loc)
	}
	b, n, err := info.readNode(loc)
	if err != nil {
		return 0, false, err
	}
	defer info.TM.Unlock(b)
	for i := n.nr() - 1; i >= 0; i-- {
		if n.isLeaf() {
			if val != nil {
				copy(val, n.value(i))
			}
			return n.key(i), true, nil
		}
		k, ok, err := findHighest(info, n.value64(i), val, depth+1, budget)
		if err != nil || ok {
			return k, ok, err
		}
	}
	return 0, false, nil
}

// Walk calls fn for every entry in key order. It checks what thin_check
// checks of each node on the way: keys strictly increasing, within the
// parent's bounds, non-root nodes at least a third full, leaves at one
// depth. fn's value is only valid during the call.
func Walk(info *Info, root uint64, fn func(k uint64, v []byte) error) error {
	w := walker{info: info, fn: fn, leafDepth: -1, seen: map[uint64]bool{}}
	return w.walk(root, 0, 0, ^uint64(0), true, true)
}

// WalkNodes calls fn for every node's location, parents first.
func WalkNodes(info *Info, root uint64, fn func(loc uint64, leaf bool, vals []byte, nr int) error) error {
	w := walker{info: info, nodeFn: fn, leafDepth: -1, seen: map[uint64]bool{}}
	return w.walk(root, 0, 0, ^uint64(0), true, true)
}

type walker struct {
	info      *Info
	fn        func(k uint64, v []byte) error
	nodeFn    func(loc uint64, leaf bool, vals []byte, nr int) error
	leafDepth int
	seen      map[uint64]bool
}

func (w *walker) walk(loc uint64, depth int, lo, hi uint64, hiOpen, isRoot bool) error {
	if depth > MaxDepth {
		return persistent.Corruptf("btree deeper than %d levels at %d", MaxDepth, loc)
	}
	if w.seen[loc] {
		return persistent.Corruptf("btree node %d is reached twice", loc)
	}
	w.seen[loc] = true
	b, n, err := w.info.readNode(loc)
	if err != nil {
		return err
	}
	defer w.info.TM.Unlock(b)
	nr := n.nr()
	if !isRoot && nr < n.max()/3 {
		return persistent.Corruptf("btree node %d: %d entries, fewer than %d", loc, nr, n.max()/3)
	}
	if n.max()%3 != 0 {
		return persistent.Corruptf("btree node %d: max_entries %d", loc, n.max())
	}
	for i := 0; i < nr; i++ {
		k := n.key(i)
		if (i > 0 && k <= n.key(i-1)) || k < lo || (!hiOpen && k >= hi) {
			return persistent.Corruptf("btree node %d: key %d out of order or bounds", loc, k)
		}
	}
	if w.nodeFn != nil {
		if err := w.nodeFn(loc, n.isLeaf(), n.values(0, nr), nr); err != nil {
			return err
		}
	}
	if n.isLeaf() {
		if w.leafDepth < 0 {
			w.leafDepth = depth
		} else if w.leafDepth != depth {
			return persistent.Corruptf("btree leaf %d at depth %d, others at %d", loc, depth, w.leafDepth)
		}
		if w.fn != nil {
			for i := 0; i < nr; i++ {
				if err := w.fn(n.key(i), n.value(i)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if nr == 0 {
		return persistent.Corruptf("btree internal node %d is empty", loc)
	}
	for i := 0; i < nr; i++ {
		chi, open := hi, hiOpen
		if i+1 < nr {
			chi, open = n.key(i+1), false
		}
		if err := w.walk(n.value64(i), depth+1, n.key(i), chi, open, false); err != nil {
			return err
		}
	}
	return nil
}

// NodeEntries reads the node at loc: whether it is a leaf, its entry
// count, a copy of its keys and of its values (child locations in an
// internal node).
func NodeEntries(info *Info, loc uint64) (leaf bool, keys []uint64, vals []byte, err error) {
	b, n, err := info.readNode(loc)
	if err != nil {
		return false, nil, nil, err
	}
	defer info.TM.Unlock(b)
	keys = make([]uint64, n.nr())
	for i := range keys {
		keys[i] = n.key(i)
	}
	return n.isLeaf(), keys, append([]byte(nil), n.values(0, n.nr())...), nil
}
