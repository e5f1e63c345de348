package snapshot

import (
	"log"
	"sort"
	"sync"

	"github.com/dmfuse/dmfuse/stack"
)

// kernelLog logs a line of dm-snapshot's (DMERR, DMWARN, DMINFO), with the
// kernel's prefix.
func kernelLog(format string, a ...any) {
	log.Printf("device-mapper: snapshots: "+format, a...)
}

// registry is the kernel's _origins table for one Manager: every snapshot
// and snapshot-merge target by the device it names as origin.
type registry struct {
	mu      sync.Mutex
	origins map[any]*origin
}

// registryKey is the key of the registry in a Manager's shared set.
type registryKey struct{}

func registryOf(c *stack.Ctor) (*registry, error) {
	v, err := c.Shared.Get(registryKey{}, func() (any, error) {
		return &registry{origins: map[any]*origin{}}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*registry), nil
}

// origin is one origin device and the snapshots of it.
type origin struct {
	reg *registry
	key any
	// refs counts the targets that use the entry (snapshots and
	// snapshot-origins); the entry goes with the last.
	refs int
	// snaps are the registered snapshot and snapshot-merge targets,
	// largest chunk first (__insert_snapshot); guarded by reg.mu.
	snaps []*snap
	// io is held shared by every write that may copy chunks out (origin
	// writes, a merge's chunk) and exclusively by a handover while it
	// moves a store, as the kernel suspends the origin's device around it
	// (dm_internal_suspend_fast).
	io sync.RWMutex
}

// get returns the entry of origin device key, made if there is none, with
// one more reference.
func (r *registry) get(key any) *origin {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.origins[key]
	if o == nil {
		o = &origin{reg: r, key: key}
		r.origins[key] = o
	}
	o.refs++
	return o
}

// put drops a reference taken by get.
func (o *origin) put() {
	r := o.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if o.refs--; o.refs == 0 {
		delete(r.origins, o.key)
	}
}

// snapshots returns the registered snapshots, in list order.
func (o *origin) snapshots() []*snap {
	o.reg.mu.Lock()
	defer o.reg.mu.Unlock()
	return append([]*snap(nil), o.snaps...)
}

// insert adds s in chunk order (largest first, after those of its size);
// the caller holds reg.mu.
func (o *origin) insert(s *snap) {
	cs := s.chunkSize()
	i := sort.Search(len(o.snaps), func(i int) bool { return o.snaps[i].chunkSize() < cs })
	o.snaps = append(o.snaps, nil)
	copy(o.snaps[i+1:], o.snaps[i:])
	o.snaps[i] = s
}

// remove takes s out of the list; the caller holds reg.mu.
func (o *origin) remove(s *snap) {
	for i, x := range o.snaps {
		if x == s {
			o.snaps = append(o.snaps[:i], o.snaps[i+1:]...)
			return
		}
	}
}

// minChunk is __minimum_chunk_size: the smallest chunk size of the
// registered snapshots (0 for a pending handover destination is skipped),
// 2^31 sectors with none.
func (o *origin) minChunk() uint32 {
	o.reg.mu.Lock()
	defer o.reg.mu.Unlock()
	m := uint32(1 << 31)
	for _, s := range o.snaps {
		if cs := s.chunkSize(); cs != 0 && cs < m {
			m = cs
		}
	}
	return m
}

// sharing is __find_snapshots_sharing_cow for s (registered or not): the
// count of registered snapshots on its COW device, the last active one
// (source), the last inactive one (destination), and a snapshot-merge
// target of the origin, if any. The caller holds reg.mu.
func (o *origin) sharing(s *snap) (count int, src, dest, merge *snap) {
	for _, x := range o.snaps {
		if x.isMerge {
			merge = x
		}
		if x.cowKey != s.cowKey {
			continue
		}
		count++
		if x.active.Load() {
			src = x
		} else {
			dest = x
		}
	}
	return
}
