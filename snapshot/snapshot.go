package snapshot

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
)

// Type is the snapshot target (dm-snap.c: snapshot_target).
var Type = &stack.TargetType{Name: "snapshot", Version: [3]int{1, 16, 0}, New: newSnapshot}

// snap is a snapshot or snapshot-merge target (struct dm_snapshot).
type snap struct {
	origin    *origin
	originDev stack.BlockDevice
	cowDev    stack.BlockDevice
	cowKey    any
	isMerge   bool
	// begin is the segment's start in bytes: the targets map the sectors
	// of the device, not of the segment (snapshot_map uses the bio's
	// sector as it is), so only a line at sector 0 is of use.
	begin int64
	// devBytes is the size of the snapshot's device: origin writes at or
	// past it need no copy in this snapshot.
	devBytes int64
	// discardZeroes and discardPassdown are the features.
	discardZeroes, discardPassdown bool
	// overflowOK is the O of PO (userspace_supports_overflow): a full COW
	// fails the snapshot's writes instead of invalidating it.
	overflowOK bool
	device     *stack.Device
	event      func()
	memory     func(int64)

	active atomic.Bool
	cs     atomic.Uint32 // chunk size in sectors; 0 in a pending handover destination

	mu   sync.Mutex
	cond sync.Cond // broadcast when tracked I/O ends or a merge step ends
	st   store
	// valid, overflowed and mergeFailed are the snapshot's state.
	valid, overflowed, mergeFailed bool
	overflowLogged                 bool
	complete                       map[uint64]uint64 // origin chunk -> COW chunk
	pending                        map[uint64]*pending
	// readers count the snapshot's reads of the origin in flight per
	// chunk: an exception for the chunk completes only once they are done
	// (track_chunk, __chunk_is_tracked).
	readers map[uint64]int
	// writers count, in a merge, the writes to the COW in flight per
	// chunk: a merge step copies a chunk only once they are done.
	writers map[uint64]int
	// accounted is the memory reported through memory for complete.
	accounted int64
	// mergeLo and mergeHi are the chunks of the merge step under way
	// (none when equal).
	mergeLo, mergeHi uint64

	run mergeRun
}

// pending is an exception being made (struct dm_snap_pending_exception).
type pending struct {
	s     *snap
	chunk uint64
	new   uint64
	done  chan struct{}
	err   error
}

var (
	_ stack.Target       = (*snap)(nil)
	_ stack.Flusher      = (*snap)(nil)
	_ stack.MaxIOer      = (*snap)(nil)
	_ stack.Preresumer   = (*snap)(nil)
	_ stack.Resumer      = (*snap)(nil)
	_ stack.Discarder    = discardSnap{}
	_ stack.DiscardOwner = discardSnap{}
)

// discardSnap is a snapshot with discard_zeroes_cow: it takes discards.
type discardSnap struct{ *snap }

// OwnsDiscards: a snapshot completes the discards it takes itself.
func (discardSnap) OwnsDiscards() {}

// exceptionBytes is what one exception costs in memory (the map's entry
// with its share of the table), as the daemon's memory plan counts it.
const exceptionBytes = 48

// newSnapshot constructs a snapshot target. The table syntax is
// dm-snapshot's:
//
//	<origin> <COW device> <P|PO|N> <chunk size> [<#features> [<feature>...]]
//
// The origin is read through the snapshot as it was when the snapshot was
// first resumed; writes go to the COW device. P keeps the exceptions on the
// COW device in the kernel's format (PO: a full COW fails the snapshot's
// writes and shows Overflow instead of invalidating it), N in memory only.
// The chunk size is in sectors, a power of two (0: the on-disk value, or 32
// for a new P store). Features: discard_zeroes_cow (a discard of a whole
// copied chunk zeroes it on the COW), discard_passdown_origin (with it, the
// discard also goes to the origin). The checks and their errors are
// snapshot_ctr's, in its order.
func newSnapshot(c *stack.Ctor, args []string) (stack.Target, error) {
	return construct(c, args, false)
}

func construct(c *stack.Ctor, args []string, merge bool) (stack.Target, error) {
	if len(args) < 4 {
		return nil, stack.Errorf("requires 4 or more arguments")
	}
	s := &snap{isMerge: merge, begin: c.Begin * stack.SectorSize, devBytes: (c.Begin + c.Len) * stack.SectorSize,
		device: c.Device, event: c.Event, memory: c.Memory, valid: true,
		complete: map[uint64]uint64{}, pending: map[uint64]*pending{}, readers: map[uint64]int{}, writers: map[uint64]int{}}
	s.cond.L = &s.mu
	if s.event == nil {
		s.event = func() {}
	}
	if err := s.features(args[4:]); err != nil {
		return nil, err
	}
	var err error
	if s.originDev, err = c.Open(args[0]); err != nil {
		return nil, &stack.ArgError{Reason: "Cannot get origin device: " + err.Error(), Errno: errnoOf(err)}
	}
	if s.cowDev, err = c.Open(args[1]); err != nil {
		return nil, &stack.ArgError{Reason: "Cannot get COW device: " + err.Error(), Errno: errnoOf(err)}
	}
	originKey := stack.DeviceKey(s.originDev)
	s.cowKey = stack.DeviceKey(s.cowDev)
	if originKey == s.cowKey {
		return nil, stack.Errorf("COW device cannot be the same as origin device")
	}
	// The dm core checks each device's area (snapshot_iterate_devices):
	// the origin must hold the whole target.
	if err := stack.CheckArea(s.originDev, 0, c.Len); err != nil {
		return nil, err
	}
	st, overflow, err := newStore(args[2], args[3], s.cowDev, stack.SectorSize)
	if err != nil {
		return nil, err
	}
	s.st, s.overflowOK = st, overflow
	s.cs.Store(st.chunk())
	reg, err := registryOf(c)
	if err != nil {
		return nil, err
	}
	s.origin = reg.get(originKey)
	dest, err := s.register()
	if err != nil {
		s.origin.put()
		return nil, err
	}
	if dest {
		// A handover destination: the store comes from the live
		// snapshot at resume; nothing is read or written now, and its
		// own store's chunk size is 0 until then.
		switch x := st.(type) {
		case *persistent:
			x.cs = 0
		case *transient:
			x.cs = 0
		}
		s.cs.Store(0)
		return s.target(), nil
	}
	if _, isMerger := st.(merger); merge && !isMerger {
		s.unregister()
		return nil, stack.Errorf("Snapshot exception store does not support snapshot-merge.")
	}
	valid, err := st.read(func(old, new uint64) { s.complete[old] = new })
	if err != nil {
		s.unregister()
		return nil, &stack.ArgError{Reason: "Failed to read snapshot metadata: " + err.Error(), Errno: errnoOf(err)}
	}
	s.cs.Store(st.chunk())
	if !valid {
		s.valid = false
		kernelLog("Snapshot is marked invalid.")
	}
	if st.chunk() == 0 {
		s.unregister()
		return nil, stack.Errorf("Chunk size not set")
	}
	s.account()
	return s.target(), nil
}

// target is s as a Target, with Discarder when it takes discards.
func (s *snap) target() stack.Target {
	if s.isMerge {
		return (*mergeTarget)(s)
	}
	if s.discardZeroes {
		return discardSnap{s}
	}
	return s
}

// features reads the feature group: at most 2 words after the count.
func (s *snap) features(words []string) error {
	if len(words) == 0 {
		return nil
	}
	a := stack.NewArgs(words)
	n, err := a.Group(0, 2, "Invalid number of feature arguments")
	if err != nil {
		return err
	}
	var bad error
	for i := uint32(0); i < n; i++ {
		w, _ := a.Next()
		switch strings.ToLower(w) {
		case "discard_zeroes_cow":
			s.discardZeroes = true
		case "discard_passdown_origin":
			s.discardPassdown = true
		default:
			bad = stack.Errorf("Unrecognised feature requested")
		}
		if bad != nil {
			break
		}
	}
	// This check runs after the loop even when it failed, and its text
	// wins (parse_snapshot_features).
	if s.discardPassdown && !s.discardZeroes {
		return stack.Errorf("discard_passdown_origin feature depends on discard_zeroes_cow")
	}
	return bad
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EINVAL
}

// register is register_snapshot with __validate_exception_handover: it
// reports whether s is a handover destination.
func (s *snap) register() (dest bool, err error) {
	o := s.origin
	o.reg.mu.Lock()
	defer o.reg.mu.Unlock()
	count, src, d, mergeSnap := o.sharing(s)
	switch {
	case count == 2 || d != nil:
		return false, stack.Errorf("Snapshot cow pairing for exception table handover failed")
	case src == nil:
	case s.isMerge && mergeSnap != nil:
		return false, stack.Errorf("A snapshot is already merging.")
	case s.isMerge:
		if _, ok := src.st.(merger); !ok {
			return false, stack.Errorf("Snapshot exception store does not support snapshot-merge.")
		}
		dest = true
	default:
		dest = true
	}
	o.insert(s)
	return dest, nil
}

// unregister takes s out of its origin's list and drops the reference.
func (s *snap) unregister() {
	o := s.origin
	o.reg.mu.Lock()
	o.remove(s)
	o.reg.mu.Unlock()
	o.put()
}

func (s *snap) chunkSize() uint32 { return s.cs.Load() }

func (s *snap) chunkBytes() int64 { return int64(s.cs.Load()) * stack.SectorSize }

// account reports the exception table's growth to the memory plan, in
// steps, so that a write does not call it each time.
func (s *snap) account() {
	if s.memory == nil {
		return
	}
	const step = 256 * exceptionBytes
	want := int64(len(s.complete)) * exceptionBytes
	if want >= s.accounted+step || want <= s.accounted-step || (want == 0) != (s.accounted == 0) {
		s.memory(want - s.accounted)
		s.accounted = want
	}
}

// invalidate is __invalidate_snapshot; the caller holds s.mu.
func (s *snap) invalidate(err error) {
	if !s.valid {
		return
	}
	if errors.Is(err, errFull) {
		kernelLog("Invalidating snapshot: Unable to allocate exception.")
	} else {
		kernelLog("Invalidating snapshot: Error reading/writing.")
	}
	s.st.drop()
	s.valid = false
	s.event()
}

// newPending makes the pending exception of chunk; the caller holds s.mu
// and has checked that the chunk has none. A full COW is returned as
// errFull and handled by the caller.
func (s *snap) newPending(chunk uint64) (*pending, error) {
	nw, err := s.st.prepare()
	if err != nil {
		return nil, err
	}
	pe := &pending{s: s, chunk: chunk, new: nw, done: make(chan struct{})}
	s.pending[chunk] = pe
	return pe, nil
}

// finish commits pe (ok: its data is on the COW) without waiting;
// pe.done closes once it is complete.
func (s *snap) finish(pe *pending, copyErr error) {
	st := s.st
	st.commit(pe.chunk, pe.new, copyErr == nil, func(ok bool) { s.completed(pe, ok) })
}

// completed is pending_complete: the exception is in the table (or the
// snapshot invalid), once the snapshot's reads of the chunk from the origin
// are done.
func (s *snap) completed(pe *pending, ok bool) {
	s.mu.Lock()
	if ok {
		s.complete[pe.chunk] = pe.new
		s.account()
	} else {
		s.invalidate(syscall.EIO)
		pe.err = syscall.EIO
	}
	for s.readers[pe.chunk] > 0 {
		s.cond.Wait()
	}
	delete(s.pending, pe.chunk)
	s.mu.Unlock()
	close(pe.done)
}

// copyChunk copies origin chunk to COW chunk nw: the chunk, or what of it
// lies on the origin.
func (s *snap) copyChunk(ctx context.Context, chunk, nw uint64) error {
	cb := s.chunkBytes()
	from := int64(chunk) * cb
	n := min(cb, s.originDev.Size()-from)
	return copyRange(ctx, s.originDev, from, s.cowDev, int64(nw)*cb, n)
}

// copyBufs are the buffers of chunk copies.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBuf); return &b }}

const copyBuf = 256 << 10

// copyRange copies n bytes at from of src to at of dst.
func copyRange(ctx context.Context, src stack.BlockDevice, from int64, dst stack.BlockDevice, at, n int64) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	for done := int64(0); done < n; {
		b := (*bp)[:min(int64(len(*bp)), n-done)]
		if err := readFull(ctx, src, b, from+done); err != nil {
			return err
		}
		if err := writeFull(ctx, dst, b, at+done); err != nil {
			return err
		}
		done += int64(len(b))
	}
	return nil
}

// pieces calls f for each piece of [off, off+n) that lies in one chunk of
// cb bytes, with the piece's start and length.
func pieces(off, n, cb int64, f func(off, n int64) error) error {
	for n > 0 {
		k := min(n, cb-off%cb)
		if err := f(off, k); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// ReadAt reads the snapshot: a chunk with an exception from the COW, any
// other from the origin (snapshot_map).
func (s *snap) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	abs := s.begin + off
	err := pieces(abs, int64(len(p)), s.chunkBytes(), func(o, n int64) error {
		return s.readChunk(ctx, p[o-abs:o-abs+n], o)
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *snap) readChunk(ctx context.Context, p []byte, abs int64) error {
	cb := s.chunkBytes()
	chunk := uint64(abs / cb)
	s.mu.Lock()
	if !s.valid {
		s.mu.Unlock()
		return syscall.EIO
	}
	if nw, ok := s.complete[chunk]; ok {
		s.mu.Unlock()
		return readFull(ctx, s.cowDev, p, int64(nw)*cb+abs%cb)
	}
	s.readers[chunk]++
	s.mu.Unlock()
	err := readFull(ctx, s.originDev, p, abs)
	s.mu.Lock()
	if s.readers[chunk]--; s.readers[chunk] == 0 {
		delete(s.readers, chunk)
		s.cond.Broadcast()
	}
	s.mu.Unlock()
	return err
}

// WriteAt writes to the snapshot, copying a chunk out of the origin first
// unless the write covers it.
func (s *snap) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	abs := s.begin + off
	err := pieces(abs, int64(len(p)), s.chunkBytes(), func(o, n int64) error {
		return s.writeChunk(ctx, p[o-abs:o-abs+n], o)
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *snap) writeChunk(ctx context.Context, p []byte, abs int64) error {
	cb := s.chunkBytes()
	chunk := uint64(abs / cb)
	for {
		s.mu.Lock()
		if !s.valid || s.overflowed {
			s.mu.Unlock()
			return syscall.EIO
		}
		if nw, ok := s.complete[chunk]; ok {
			s.mu.Unlock()
			return writeFull(ctx, s.cowDev, p, int64(nw)*cb+abs%cb)
		}
		if pe := s.pending[chunk]; pe != nil {
			s.mu.Unlock()
			<-pe.done
			if pe.err != nil {
				return pe.err
			}
			continue
		}
		pe, err := s.newPending(chunk)
		if err != nil {
			s.full(err)
			s.mu.Unlock()
			return syscall.EIO
		}
		s.mu.Unlock()
		if int64(len(p)) == cb {
			// The write covers the chunk: no copy.
			s.finish(pe, writeFull(ctx, s.cowDev, p, int64(pe.new)*cb))
			<-pe.done
			return pe.err
		}
		s.finish(pe, s.copyChunk(ctx, chunk, pe.new))
		<-pe.done
		if pe.err != nil {
			return pe.err
		}
	}
}

// full handles a snapshot write that found the COW full: PO overflows, the
// others invalidate. The caller holds s.mu.
func (s *snap) full(err error) {
	if s.overflowOK && errors.Is(err, errFull) {
		s.overflowed = true
		if !s.overflowLogged {
			s.overflowLogged = true
			kernelLog("Snapshot overflowed: Unable to allocate exception.")
		}
		return
	}
	s.invalidate(err)
}

// Discard with discard_zeroes_cow: a discard of exactly one chunk with an
// exception zeroes it on the COW; a smaller one goes to the COW; one of a
// chunk without an exception does nothing.
func (d discardSnap) Discard(ctx context.Context, off, n int64) error {
	s := d.snap
	abs := s.begin + off
	return pieces(abs, n, s.chunkBytes(), func(o, k int64) error {
		cb := s.chunkBytes()
		chunk := uint64(o / cb)
		s.mu.Lock()
		if !s.valid || s.overflowed {
			s.mu.Unlock()
			return syscall.EIO
		}
		nw, ok := s.complete[chunk]
		s.mu.Unlock()
		if s.discardPassdown {
			if err := s.originDev.Discard(ctx, o, k); err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
				return err
			}
		}
		if !ok {
			return nil
		}
		at := int64(nw)*cb + o%cb
		if k == cb {
			return s.cowDev.WriteZeroes(ctx, at, k)
		}
		err := s.cowDev.Discard(ctx, at, k)
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return nil
		}
		return err
	})
}

// Flush flushes the COW device only (num_flush_bios 1, mapped to the COW).
func (s *snap) Flush(ctx context.Context) error { return s.cowDev.Flush(ctx) }

// MaxIO is the chunk: the dm core splits I/O at chunk boundaries.
func (s *snap) MaxIO() int64 {
	if cb := s.chunkBytes(); cb > 0 {
		return cb
	}
	return 0
}

// Status prints the table line (origin, COW, store, features) or the
// usage.
func (s *snap) Status(t stack.StatusType) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t == stack.StatusTable {
		typ := string(s.st.typeChar())
		if s.overflowOK && typ == "P" {
			typ = "PO"
		}
		out := fmt.Sprintf("%s %s %s %d", stack.EscapeArg(s.originDev.Name()), stack.EscapeArg(s.cowDev.Name()), typ, s.st.chunk())
		switch {
		case s.discardPassdown:
			out += " 2 discard_zeroes_cow discard_passdown_origin"
		case s.discardZeroes:
			out += " 1 discard_zeroes_cow"
		}
		return out
	}
	switch {
	case !s.valid:
		return "Invalid"
	case s.mergeFailed:
		return "Merge failed"
	case s.overflowed:
		return "Overflow"
	}
	a, t2, m := s.st.usage()
	return fmt.Sprintf("%d/%d %d", a, t2, m)
}

// Preresume refuses to resume the source of a pending handover, or a
// destination whose source still runs (snapshot_preresume).
func (s *snap) Preresume() error {
	o := s.origin
	o.reg.mu.Lock()
	_, src, dest, _ := o.sharing(s)
	o.reg.mu.Unlock()
	if src == nil || dest == nil {
		return nil
	}
	switch {
	case s == src:
		kernelLog("Unable to resume snapshot source until handover completes.")
		return &stack.ArgError{Reason: "Unable to resume snapshot source until handover completes."}
	case src.device != nil && !src.device.Suspended():
		kernelLog("Unable to perform snapshot handover until source is suspended.")
		return &stack.ArgError{Reason: "Unable to perform snapshot handover until source is suspended."}
	}
	return nil
}

// Resume is snapshot_resume: a handover destination takes the live
// snapshot's exceptions and store while the origin's writes are held, then
// the snapshot is re-sorted and active.
func (s *snap) Resume() {
	o := s.origin
	o.reg.mu.Lock()
	_, src, dest, mergeSnap := o.sharing(s)
	o.reg.mu.Unlock()
	if src != nil && dest != nil {
		if mergeSnap != nil && mergeSnap != s {
			mergeSnap.stopMerge()
		}
		o.io.Lock()
		handover(src, dest)
		o.io.Unlock()
		if mergeSnap != nil && mergeSnap != s {
			mergeSnap.startMerge()
		}
	}
	o.reg.mu.Lock()
	o.remove(s)
	o.insert(s)
	o.reg.mu.Unlock()
	s.active.Store(true)
}

// handover is __handover_exceptions: the destination takes the source's
// exceptions, store (with its chunk size and type; only the O stays the
// destination's), validity and overflow; the source becomes invalid.
func handover(src, dest *snap) {
	src.mu.Lock()
	defer src.mu.Unlock()
	dest.mu.Lock()
	defer dest.mu.Unlock()
	src.complete, dest.complete = dest.complete, src.complete
	src.st, dest.st = dest.st, src.st
	dest.st.setDevice(dest.cowDev)
	src.st.setDevice(src.cowDev)
	dest.cs.Store(dest.st.chunk())
	dest.valid, dest.overflowed = src.valid, src.overflowed
	src.valid = false
	src.account()
	dest.account()
}

// Close is snapshot_dtr: a source with a destination waiting cancels the
// handover (the destination becomes invalid), then the snapshot leaves its
// origin's list.
func (s *snap) Close() error {
	o := s.origin
	o.reg.mu.Lock()
	_, src, dest, _ := o.sharing(s)
	o.reg.mu.Unlock()
	if src == s && dest != nil {
		dest.mu.Lock()
		dest.valid = false
		dest.mu.Unlock()
		kernelLog("Cancelling snapshot handover.")
	}
	if s.isMerge {
		s.stopMerge()
	}
	s.unregister()
	s.mu.Lock()
	s.complete = map[uint64]uint64{}
	s.account()
	s.mu.Unlock()
	return nil
}
