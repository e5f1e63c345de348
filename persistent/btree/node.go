// Package btree is the kernel's persistent btree (dm-btree): 64-bit keys,
// fixed-size values, nodes of one metadata block each, copy-on-write
// through the transaction manager, with the kernel's node layout, its
// split rules on insert and a rebalance on remove that keeps every
// non-root node at least a third full (thin_check's rule).
package btree

import (
	"encoding/binary"

	"github.com/dmfuse/dmfuse/persistent"
	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/tm"
)

// Node flags.
const (
	InternalNode = 1
	LeafNode     = 2
)

const headerSize = 32

// MaxDepth bounds a walk: deeper trees are corrupt (a cycle).
const MaxDepth = 16

// MaxEntries is the kernel's calc_max_entries.
func MaxEntries(valueSize int) int {
	n := (block.Size - headerSize) / (8 + valueSize)
	return 3 * (n / 3)
}

// Validator checks a node's checksum and header (node_check).
var Validator = &block.Validator{Name: "btree node", Salt: block.NodeSalt, Check: checkNode}

func checkNode(b []byte, loc uint64) error {
	n := node(b)
	vs, max, nr := n.valueSize(), n.max(), n.nr()
	if vs == 0 || vs > block.Size || headerSize+(8+vs)*max > block.Size {
		return persistent.Corruptf("btree node %d: max_entries %d of %d-byte values do not fit", loc, max, vs)
	}
	if nr > max {
		return persistent.Corruptf("btree node %d: %d entries, max %d", loc, nr, max)
	}
	if f := n.flags(); f&(InternalNode|LeafNode) == 0 {
		return persistent.Corruptf("btree node %d: flags %#x", loc, f)
	}
	return nil
}

// node is a view of a node block.
type node []byte

var le = binary.LittleEndian

func (n node) flags() uint32          { return le.Uint32(n[4:]) }
func (n node) isLeaf() bool           { return n.flags()&LeafNode != 0 }
func (n node) nr() int                { return int(le.Uint32(n[16:])) }
func (n node) setNr(v int)            { le.PutUint32(n[16:], uint32(v)) }
func (n node) max() int               { return int(le.Uint32(n[20:])) }
func (n node) valueSize() int         { return int(le.Uint32(n[24:])) }
func (n node) key(i int) uint64       { return le.Uint64(n[headerSize+8*i:]) }
func (n node) setKey(i int, k uint64) { le.PutUint64(n[headerSize+8*i:], k) }
func (n node) valOff(i int) int       { return headerSize + 8*n.max() + i*n.valueSize() }
func (n node) value(i int) []byte     { o := n.valOff(i); return n[o : o+n.valueSize()] }
func (n node) value64(i int) uint64   { return le.Uint64(n[n.valOff(i):]) }
func (n node) setValue64(i int, v uint64) {
	le.PutUint64(n[n.valOff(i):], v)
}

func (n node) init(flags uint32, valueSize int) {
	le.PutUint32(n[4:], flags)
	n.setNr(0)
	le.PutUint32(n[20:], uint32(MaxEntries(valueSize)))
	le.PutUint32(n[24:], uint32(valueSize))
	le.PutUint32(n[28:], 0)
}

// copyHeader gives n src's flags, max_entries and value size.
func (n node) copyHeader(src node) {
	copy(n[4:8], src[4:8])
	copy(n[20:32], src[20:32])
}

// values returns the value bytes of entries [i, j).
func (n node) values(i, j int) []byte { return n[n.valOff(i):n.valOff(j)] }

// lowerBound is the index of the largest key <= k, or -1.
func (n node) lowerBound(k uint64) int {
	lo, hi := 0, n.nr() // keys[lo-1] <= k < keys[hi]
	for lo < hi {
		mid := (lo + hi) / 2
		if n.key(mid) <= k {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo - 1
}

// insertAt opens a slot at i and fills it.
func (n node) insertAt(i int, k uint64, v []byte) {
	nr := n.nr()
	copy(n[headerSize+8*(i+1):headerSize+8*(nr+1)], n[headerSize+8*i:headerSize+8*nr])
	vs := n.valueSize()
	copy(n[n.valOff(i+1):n.valOff(nr)+vs], n[n.valOff(i):n.valOff(nr)])
	n.setKey(i, k)
	copy(n.value(i), v)
	n.setNr(nr + 1)
}

// deleteAt closes the slot at i.
func (n node) deleteAt(i int) {
	nr := n.nr()
	copy(n[headerSize+8*i:], n[headerSize+8*(i+1):headerSize+8*nr])
	copy(n[n.valOff(i):], n[n.valOff(i+1):n.valOff(nr)])
	n.setNr(nr - 1)
}

// moveEntries copies entries [i, i+cnt) of src to dst at j.
func moveEntries(dst node, j int, src node, i, cnt int) {
	copy(dst[headerSize+8*j:headerSize+8*(j+cnt)], src[headerSize+8*i:headerSize+8*(i+cnt)])
	copy(dst.values(j, j+cnt), src.values(i, i+cnt))
}

// ValueType says how the values of a tree's leaves are stored and counted.
type ValueType struct {
	// Size is the size of a value in bytes.
	Size int
	// Inc adds a reference to whatever each of the values points to
	// (when a shared leaf is copied); nil for plain values.
	Inc func(vals []byte, n int) error
	// Dec drops those references (when a value is removed or
	// overwritten, or its tree deleted).
	Dec func(vals []byte, n int) error
	// Equal says whether two values are the same reference (an
	// overwrite with an equal value does not call Dec).
	Equal func(a, b []byte) bool
}

// Info is one tree's transaction manager and value type.
type Info struct {
	TM *tm.TM
	VT ValueType
}

// checkNodeFor checks that a node read during a walk belongs to the tree.
func (info *Info) checkNodeFor(n node, loc uint64) error {
	if n.isLeaf() {
		if n.valueSize() != info.VT.Size {
			return persistent.Corruptf("btree leaf %d: value size %d, want %d", loc, n.valueSize(), info.VT.Size)
		}
	} else if n.valueSize() != 8 {
		return persistent.Corruptf("btree internal node %d: value size %d, want 8", loc, n.valueSize())
	}
	return nil
}

// incChildren adds the references a copy of a shared node holds.
func (info *Info) incChildren(n node) error {
	if !n.isLeaf() {
		for i := 0; i < n.nr(); i++ {
			if err := info.TM.Inc(n.value64(i)); err != nil {
				return err
			}
		}
		return nil
	}
	if info.VT.Inc != nil && n.nr() > 0 {
		return info.VT.Inc(n.values(0, n.nr()), n.nr())
	}
	return nil
}

// shadow shadows loc and, when it was shared, increments its children.
func (info *Info) shadow(loc uint64) (*block.Block, error) {
	b, shared, err := info.TM.Shadow(loc, Validator)
	if err != nil {
		return nil, err
	}
	n := node(b.Data())
	if err := info.checkNodeFor(n, loc); err != nil {
		info.TM.Unlock(b)
		return nil, err
	}
	if shared {
		if err := info.incChildren(n); err != nil {
			info.TM.Unlock(b)
			return nil, err
		}
	}
	return b, nil
}

// readNode read-locks loc and checks it belongs to the tree.
func (info *Info) readNode(loc uint64) (*block.Block, node, error) {
	b, err := info.TM.ReadLock(loc, Validator)
	if err != nil {
		return nil, nil, err
	}
	n := node(b.Data())
	if err := info.checkNodeFor(n, loc); err != nil {
		info.TM.Unlock(b)
		return nil, nil, err
	}
	return b, n, nil
}

// Empty makes an empty tree (one leaf) and returns its root.
func Empty(info *Info) (uint64, error) {
	b, err := info.TM.NewBlock(Validator)
	if err != nil {
		return 0, err
	}
	node(b.Data()).init(LeafNode, info.VT.Size)
	loc := b.Loc()
	info.TM.Unlock(b)
	return loc, nil
}
