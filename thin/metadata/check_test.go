package metadata

import (
	"testing"

	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/btree"
	"github.com/dmfuse/dmfuse/persistent/sm"
)

// verifyCounts recomputes every reference count of the committed
// metadata, as thin_check 1.x does, and compares them with both space
// maps, and each device's mapped_blocks with its tree. It returns the highest
// metadata and data counts.
func verifyCounts(t testing.TB, p *DiskStore) (maxMeta, maxData uint32) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed {
		t.Fatal("verifyCounts needs a committed pool")
	}
	meta := map[uint64]uint32{}
	data := map[uint64]uint32{}
	visited := map[uint64]bool{}
	var walk func(info *btree.Info, loc uint64, leafFn func(keys []uint64, vals []byte))
	walk = func(info *btree.Info, loc uint64, leafFn func(keys []uint64, vals []byte)) {
		meta[loc]++
		if visited[loc] {
			return
		}
		visited[loc] = true
		leaf, keys, vals, err := btree.NodeEntries(info, loc)
		if err != nil {
			t.Fatalf("node %d: %v", loc, err)
		}
		if leaf {
			if leafFn != nil {
				leafFn(keys, vals)
			}
			return
		}
		for i := range keys {
			walk(info, le.Uint64(vals[8*i:]), leafFn)
		}
	}
	mappings := map[uint64]uint64{}
	trees := func(mr, dr uint64) {
		if err := btree.Walk(&p.top, mr, func(id uint64, v []byte) error {
			n := uint64(0)
			err := btree.Walk(&p.bottom, le.Uint64(v), func(uint64, []byte) error { n++; return nil })
			mappings[id] = n
			return err
		}); err != nil {
			t.Fatal(err)
		}
		walk(&p.top, mr, func(keys []uint64, vals []byte) {
			for i := range keys {
				walk(&p.bottom, le.Uint64(vals[8*i:]), func(_ []uint64, vals []byte) {
					for j := 0; j < len(vals)/8; j++ {
						d, _ := unpackBlockTime(le.Uint64(vals[8*j:]))
						data[d]++
					}
				})
			}
		})
		walk(&p.details, dr, nil)
		if err := btree.Walk(&p.details, dr, func(k uint64, v []byte) error {
			if got := unpackDetails(v).mappedBlocks; got != mappings[k] {
				t.Errorf("device %d: mapped_blocks %d, tree has %d", k, got, mappings[k])
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	sb := p.sb
	meta[0]++
	trees(sb.mappingRoot, sb.detailsRoot)
	if sb.heldRoot != 0 {
		meta[sb.heldRoot]++
		hb, err := p.bm.ReadLock(sb.heldRoot, block.Superblock)
		if err != nil {
			t.Fatal(err)
		}
		h := unpackSuperblock(hb.Data())
		p.bm.Unlock(hb)
		clear(mappings)
		trees(h.mappingRoot, h.detailsRoot)
	}
	idx := btree.Info{TM: p.tm, VT: btree.ValueType{Size: sm.IndexEntrySize}}
	ref := btree.Info{TM: p.tm, VT: btree.ValueType{Size: 4}}
	walk(&idx, sb.dataSM.BitmapRoot, func(_ []uint64, vals []byte) {
		for j := 0; j < len(vals)/16; j++ {
			meta[le.Uint64(vals[16*j:])]++
		}
	})
	walk(&ref, sb.dataSM.RefCountRoot, nil)
	meta[sb.metaSM.BitmapRoot]++
	ib, err := p.bm.ReadLock(sb.metaSM.BitmapRoot, block.Index)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < (sb.metaSM.NrBlocks+sm.EntriesPerBlock-1)/sm.EntriesPerBlock; i++ {
		meta[le.Uint64(ib.Data()[16+16*i:])]++
	}
	p.bm.Unlock(ib)
	walk(&ref, sb.metaSM.RefCountRoot, nil)

	var allocated uint64
	for b := uint64(0); b < p.msm.NrBlocks(); b++ {
		c, err := p.msm.Count(b)
		if err != nil {
			t.Fatal(err)
		}
		if c != meta[b] {
			t.Errorf("metadata block %d: count %d, %d references", b, c, meta[b])
		}
		maxMeta = max(maxMeta, c)
		if c > 0 {
			allocated++
		}
	}
	if got := p.msm.NrBlocks() - p.msm.NrFree(); got != allocated {
		t.Errorf("metadata allocated %d, counted %d", got, allocated)
	}
	allocated = 0
	for b := uint64(0); b < p.dsm.NrBlocks(); b++ {
		c, err := p.dsm.Count(b)
		if err != nil {
			t.Fatal(err)
		}
		if c != data[b] {
			t.Errorf("data block %d: count %d, %d references", b, c, data[b])
		}
		maxData = max(maxData, c)
		if c > 0 {
			allocated++
		}
	}
	if sb.dataSM.NrAllocated != allocated {
		t.Errorf("data nr_allocated %d, counted %d", sb.dataSM.NrAllocated, allocated)
	}
	return maxMeta, maxData
}
