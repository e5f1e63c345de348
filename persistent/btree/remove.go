package btree

import (
	"github.com/dmfuse/dmfuse/persistent"
	"github.com/dmfuse/dmfuse/persistent/block"
)

// Remove deletes key and drops its value's reference (ErrNotFound).
// On the way down every child about to be entered with no more than a
// third of its entries is first merged with, or refilled from, a sibling
// (the kernel's rebalance2), so no non-root node ends below a third; a
// root left with one child takes that child's place.
func Remove(info *Info, root, key uint64) (newRoot uint64, err error) {
	if ok, err := Lookup(info, root, key, nil); err != nil {
		return root, err
	} else if !ok {
		return root, ErrNotFound
	}
	b, err := info.shadow(root)
	if err != nil {
		return root, err
	}
	newRoot = b.Loc()
	isRoot := true
	defer func() { info.TM.Unlock(b) }()
	for {
		n := node(b.Data())
		if isRoot && !n.isLeaf() && n.nr() == 1 {
			if err := collapse(info, b); err != nil {
				return root, err
			}
			continue
		}
		if n.isLeaf() {
			break
		}
		i := n.lowerBound(key)
		if i < 0 {
			return root, persistent.Corruptf("btree node %d lost key %d", b.Loc(), key)
		}
		cnr, cmax, err := peek(info, n.value64(i))
		if err != nil {
			return root, err
		}
		if cnr <= cmax/3 {
			if err := rebalance(info, b, i); err != nil {
				return root, err
			}
			continue
		}
		cb, err := info.shadow(n.value64(i))
		if err != nil {
			return root, err
		}
		n.setValue64(i, cb.Loc())
		info.TM.Unlock(b)
		b, isRoot = cb, false
	}
	n := node(b.Data())
	i := n.lowerBound(key)
	if i < 0 || n.key(i) != key {
		return root, persistent.Corruptf("btree leaf %d lost key %d", b.Loc(), key)
	}
	if info.VT.Dec != nil {
		if err := info.VT.Dec(n.value(i), 1); err != nil {
			return root, err
		}
	}
	n.deleteAt(i)
	return newRoot, nil
}

func peek(info *Info, loc uint64) (nr, max int, err error) {
	b, n, err := info.readNode(loc)
	if err != nil {
		return 0, 0, err
	}
	nr, max = n.nr(), n.max()
	info.TM.Unlock(b)
	return nr, max, nil
}

// collapse replaces a root that has a single child with that child.
func collapse(info *Info, b *block.Block) error {
	n := node(b.Data())
	child := n.value64(0)
	cb, c, err := info.readNode(child)
	if err != nil {
		return err
	}
	copy(n, c)
	info.TM.Unlock(cb)
	cnt, err := info.TM.Count(child)
	if err != nil {
		return err
	}
	if cnt > 1 {
		if err := info.incChildren(n); err != nil {
			return err
		}
	}
	return info.TM.Dec(child)
}

// rebalance merges child i of parent with a neighbour, or shares their
// entries evenly when both together are too many for one node.
func rebalance(info *Info, pb *block.Block, i int) error {
	p := node(pb.Data())
	li := i
	if i > 0 {
		li = i - 1
	}
	if li+1 >= p.nr() {
		return persistent.Corruptf("btree node %d: child %d has no sibling", pb.Loc(), i)
	}
	lb, err := info.shadow(p.value64(li))
	if err != nil {
		return err
	}
	defer info.TM.Unlock(lb)
	p.setValue64(li, lb.Loc())
	rb, err := info.shadow(p.value64(li + 1))
	if err != nil {
		return err
	}
	p.setValue64(li+1, rb.Loc())
	l, r := node(lb.Data()), node(rb.Data())
	if l.max() != r.max() || l.valueSize() != r.valueSize() || l.isLeaf() != r.isLeaf() {
		info.TM.Unlock(rb)
		return persistent.Corruptf("btree nodes %d and %d are siblings of different kinds", lb.Loc(), rb.Loc())
	}
	nl, nr := l.nr(), r.nr()
	total := nl + nr
	if total < 2*(l.max()/3+1) {
		moveEntries(l, nl, r, 0, nr)
		l.setNr(total)
		p.deleteAt(li + 1)
		loc := rb.Loc()
		info.TM.Unlock(rb)
		return info.TM.Dec(loc)
	}
	target := total / 2
	switch {
	case nl > target:
		k := nl - target
		moveEntries(r, k, r, 0, nr)
		moveEntries(r, 0, l, target, k)
		r.setNr(nr + k)
		l.setNr(target)
	case nl < target:
		k := target - nl
		moveEntries(l, nl, r, 0, k)
		moveEntries(r, 0, r, k, nr-k)
		l.setNr(target)
		r.setNr(nr - k)
	}
	p.setKey(li+1, r.key(0))
	info.TM.Unlock(rb)
	return nil
}

// Del drops a reference to the tree at root, as dm_btree_del: a node
// still shared only loses a reference; otherwise its children (or, in a
// leaf, its values) lose theirs, and then the node itself.
func Del(info *Info, root uint64) error {
	return del(info, root, 0, map[uint64]bool{})
}

func del(info *Info, loc uint64, depth int, seen map[uint64]bool) error {
	if depth > MaxDepth {
		return persistent.Corruptf("btree deeper than %d levels at %d", MaxDepth, loc)
	}
	if seen[loc] {
		return persistent.Corruptf("btree node %d is reached twice", loc)
	}
	c, err := info.TM.Count(loc)
	if err != nil {
		return err
	}
	if c > 1 {
		return info.TM.Dec(loc)
	}
	seen[loc] = true
	b, n, err := info.readNode(loc)
	if err != nil {
		return err
	}
	nr := n.nr()
	vals := append([]byte(nil), n.values(0, nr)...)
	leaf := n.isLeaf()
	info.TM.Unlock(b)
	if leaf {
		if info.VT.Dec != nil && nr > 0 {
			if err := info.VT.Dec(vals, nr); err != nil {
				return err
			}
		}
	} else {
		for i := 0; i < nr; i++ {
			if err := del(info, le.Uint64(vals[8*i:]), depth+1, seen); err != nil {
				return err
			}
		}
	}
	return info.TM.Dec(loc)
}
