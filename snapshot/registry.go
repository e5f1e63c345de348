package snapshot

import (
	"log"
	"sort"
	"sync"
	"sync/atomic"

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
	// largest chunk first (__insert_snapshot): changed under reg.mu, as a
	// new slice each time, so that writes read the list without a lock.
	snaps atomic.Pointer[[]*snap]
	// min is minChunk's answer for the list as it is (recomputed under
	// reg.mu when it changes).
	min atomic.Uint32
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
		o.min.Store(1 << 31)
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

// snapshots returns the registered snapshots, in list order; the caller
// must not change the slice.
func (o *origin) snapshots() []*snap {
	if p := o.snaps.Load(); p != nil {
		return *p
	}
	return nil
}

// set publishes a new list; the caller holds reg.mu.
func (o *origin) set(l []*snap) {
	o.snaps.Store(&l)
	o.resetMin()
}

// insert adds s in chunk order (largest first, after those of its size);
// the caller holds reg.mu.
func (o *origin) insert(s *snap) {
	old := o.snapshots()
	cs := s.chunkSize()
	i := sort.Search(len(old), func(i int) bool { return old[i].chunkSize() < cs })
	l := make([]*snap, 0, len(old)+1)
	l = append(append(append(l, old[:i]...), s), old[i:]...)
	o.set(l)
}

// remove takes s out of the list; the caller holds reg.mu.
func (o *origin) remove(s *snap) {
	old := o.snapshots()
	l := make([]*snap, 0, len(old))
	for _, x := range old {
		if x != s {
			l = append(l, x)
		}
	}
	o.set(l)
}

// resetMin recomputes minChunk after the list or a chunk size changed; the
// caller holds reg.mu.
func (o *origin) resetMin() {
	m := uint32(1 << 31)
	for _, s := range o.snapshots() {
		if cs := s.chunkSize(); cs != 0 && cs < m {
			m = cs
		}
	}
	o.min.Store(m)
}

// minChunk is __minimum_chunk_size: the smallest chunk size of the
// registered snapshots (0 for a pending handover destination is skipped),
// 2^31 sectors with none.
func (o *origin) minChunk() uint32 { return o.min.Load() }

// sharing is __find_snapshots_sharing_cow for s (registered or not): the
// count of registered snapshots on its COW device, the last active one
// (source), the last inactive one (destination), and a snapshot-merge
// target of the origin, if any. The caller holds reg.mu.
func (o *origin) sharing(s *snap) (count int, src, dest, merge *snap) {
	for _, x := range o.snapshots() {
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
