package btree

import (
	"errors"

	"github.com/dmfuse/dmfuse/persistent/block"
)

// ErrNotFound: the key is not in the tree.
var ErrNotFound = errors.New("key not found")

func le64(v uint64) []byte {
	var b [8]byte
	le.PutUint64(b[:], v)
	return b[:]
}

// descend shadows the path from root to the leaf that holds (or would
// hold) key and returns the leaf write-locked. With split set it splits
// full nodes on the way down, as the kernel's btree_insert_raw does (the
// root beneath itself, the others into a new sibling), and lowers keys[0]
// of a node when key is below it.
func descend(info *Info, root, key uint64, split bool) (leaf *block.Block, newRoot uint64, err error) {
	b, err := info.shadow(root)
	if err != nil {
		return nil, 0, err
	}
	newRoot = b.Loc()
	var parent *block.Block
	pidx := -1
	fail := func(err error) (*block.Block, uint64, error) {
		if parent != nil {
			info.TM.Unlock(parent)
		}
		if b != nil {
			info.TM.Unlock(b)
		}
		return nil, 0, err
	}
	for {
		n := node(b.Data())
		if split && n.nr() == n.max() {
			if parent == nil {
				err = splitBeneath(info, b)
			} else {
				b, err = splitSibling(info, parent, pidx, b, key)
			}
			if err != nil {
				return fail(err)
			}
			n = node(b.Data())
		}
		if n.isLeaf() {
			if parent != nil {
				info.TM.Unlock(parent)
			}
			return b, newRoot, nil
		}
		i := n.lowerBound(key)
		if i < 0 {
			if !split {
				return fail(ErrNotFound)
			}
			n.setKey(0, key)
			i = 0
		}
		cb, err := info.shadow(n.value64(i))
		if err != nil {
			return fail(err)
		}
		n.setValue64(i, cb.Loc())
		if parent != nil {
			info.TM.Unlock(parent)
		}
		parent, pidx, b = b, i, cb
	}
}

// splitBeneath moves the entries of a full root into two new children;
// the root stays where it is and becomes an internal node.
func splitBeneath(info *Info, b *block.Block) error {
	n := node(b.Data())
	nr := n.nr()
	nl := nr / 2
	lb, err := info.TM.NewBlock(Validator)
	if err != nil {
		return err
	}
	rb, err := info.TM.NewBlock(Validator)
	if err != nil {
		info.TM.Unlock(lb)
		return err
	}
	l, r := node(lb.Data()), node(rb.Data())
	l.copyHeader(n)
	r.copyHeader(n)
	moveEntries(l, 0, n, 0, nl)
	l.setNr(nl)
	moveEntries(r, 0, n, nl, nr-nl)
	r.setNr(nr - nl)
	n.init(InternalNode, 8)
	n.setKey(0, l.key(0))
	n.setValue64(0, lb.Loc())
	n.setKey(1, r.key(0))
	n.setValue64(1, rb.Loc())
	n.setNr(2)
	info.TM.Unlock(lb)
	info.TM.Unlock(rb)
	return nil
}

// splitSibling moves the upper half of a full node b into a new sibling
// after it in parent (which has room) and returns whichever half key
// belongs to, still write-locked.
func splitSibling(info *Info, parent *block.Block, pidx int, b *block.Block, key uint64) (*block.Block, error) {
	n := node(b.Data())
	nr := n.nr()
	nl := nr / 2
	rb, err := info.TM.NewBlock(Validator)
	if err != nil {
		return b, err
	}
	r := node(rb.Data())
	r.copyHeader(n)
	moveEntries(r, 0, n, nl, nr-nl)
	r.setNr(nr - nl)
	n.setNr(nl)
	node(parent.Data()).insertAt(pidx+1, r.key(0), le64(rb.Loc()))
	if key < r.key(0) {
		info.TM.Unlock(rb)
		return b, nil
	}
	info.TM.Unlock(b)
	return rb, nil
}

// Insert maps key to val. On an error the root returned is root. An existing value is overwritten (its
// reference dropped through the value type unless equal). The caller
// holds the reference of a new value.
func Insert(info *Info, root, key uint64, val []byte) (newRoot uint64, inserted bool, err error) {
	b, newRoot, err := descend(info, root, key, true)
	if err != nil {
		return root, false, err
	}
	defer info.TM.Unlock(b)
	n := node(b.Data())
	i := n.lowerBound(key)
	if i >= 0 && n.key(i) == key {
		old := n.value(i)
		if info.VT.Dec != nil && (info.VT.Equal == nil || !info.VT.Equal(old, val)) {
			if err := info.VT.Dec(old, 1); err != nil {
				return root, false, err
			}
		}
		copy(old, val)
		return newRoot, false, nil
	}
	n.insertAt(i+1, key, val)
	return newRoot, true, nil
}

// Update shadows the path to key, which must be present (ErrNotFound),
// and calls fn with its value, which fn may change in place. Nothing is
// counted: this is how a two-level tree's upper level follows a change of
// a lower tree's root (the old root was released by its shadowing).
func Update(info *Info, root, key uint64, fn func(val []byte) error) (newRoot uint64, err error) {
	if ok, err := Lookup(info, root, key, nil); err != nil {
		return root, err
	} else if !ok {
		return root, ErrNotFound
	}
	b, newRoot, err := descend(info, root, key, false)
	if err != nil {
		return root, err
	}
	defer info.TM.Unlock(b)
	n := node(b.Data())
	i := n.lowerBound(key)
	if i < 0 || n.key(i) != key {
		return root, ErrNotFound
	}
	return newRoot, fn(n.value(i))
}
