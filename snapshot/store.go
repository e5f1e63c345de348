package snapshot

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
)

// errFull is what a store's prepare returns when the COW device has no room
// for another chunk (the kernel's -ENOSPC there).
var errFull = errors.New("no room for another exception")

// store is an exception store (struct dm_exception_store_type): where the
// COW chunks go and how the exceptions are kept.
type store interface {
	// chunk is the chunk size in sectors.
	chunk() uint32
	// typeChar is 'P' or 'N', as the table line prints the store.
	typeChar() byte
	// read loads the exceptions (add is called for each) and reports
	// whether the store is valid (persistent_read_metadata).
	read(add func(old, new uint64)) (valid bool, err error)
	// prepare allocates the COW chunk of a new exception; errFull when the
	// COW is full. Every prepared exception must be committed.
	prepare() (uint64, error)
	// commit records the exception old -> new (ok: its copy succeeded) and
	// calls done once it is durable, with whether the store is still
	// valid. Commits are applied in the order of their prepares and may be
	// grouped: done may run on another goroutine's commit, and commit may
	// call done itself before it returns.
	commit(old, new uint64, ok bool, done func(ok bool))
	// usage returns sectors allocated, the COW's size in sectors and
	// metadata sectors (the status line's numbers).
	usage() (allocated, total, metadata uint64)
	// drop marks the store invalid (persistent: on disk).
	drop()
	// setDevice moves the store to another handle of its COW device (a
	// handover moves the store into a table that opened its own).
	setDevice(cow stack.BlockDevice)
}

// merger is a store that can merge (the persistent one): the kernel's
// prepare_merge and commit_merge.
type merger interface {
	// prepareMerge returns the last exception (old -> new) and how many
	// exceptions before it continue the run backwards: n = 0 when none is
	// left.
	prepareMerge() (old, new uint64, n int, err error)
	// commitMerge forgets the last n exceptions, on disk first.
	commitMerge(n int) error
}

// maxChunk is INT_MAX >> SECTOR_SHIFT: dm_exception_store_set_chunk_size's
// largest chunk size in sectors.
const maxChunk = (1<<31 - 1) >> 9

// newStore parses the store arguments of a snapshot line (type and chunk
// size, dm_exception_store_create) and makes the store over cow. Every
// failure is the kernel's "Couldn't create exception store"; a persistent
// store with options other than O logs the kernel's line first.
func newStore(typ, chunkArg string, cow stack.BlockDevice, blockSize int64) (store, bool, error) {
	fail := stack.Errorf("Couldn't create exception store")
	if typ == "" {
		return nil, false, fail
	}
	n, err := stack.ParseUint32(chunkArg)
	if err != nil {
		return nil, false, fail
	}
	if n != 0 && !validChunk(n, blockSize) {
		return nil, false, fail
	}
	opts := typ[1:]
	switch typ[0] {
	case 'P', 'p':
		overflow := false
		if opts != "" {
			if opts[0] != 'O' && opts[0] != 'o' {
				kernelLog("Unsupported persistent store option: %s", opts)
				return nil, false, fail
			}
			overflow = true
		}
		return &persistent{cow: cow, cs: n, blockSize: blockSize}, overflow, nil
	case 'N', 'n':
		return &transient{cow: cow, cs: n}, false, nil
	}
	return nil, false, fail
}

// validChunk applies dm_exception_store_set_chunk_size's rules to a chunk
// size in sectors: a power of two, a multiple of the devices' logical block
// size, at most maxChunk.
func validChunk(n uint32, blockSize int64) bool {
	return chunkProblem(n, blockSize) == ""
}

// chunkProblem is the reason dm_exception_store_set_chunk_size refuses n,
// "" if it does not.
func chunkProblem(n uint32, blockSize int64) string {
	switch {
	case n == 0 || n&(n-1) != 0:
		return "Chunk size is not a power of 2"
	case int64(n)*stack.SectorSize%blockSize != 0:
		return "Chunk size is not a multiple of device blocksize"
	case n > maxChunk:
		return "Chunk size is too high"
	}
	return ""
}

// shift is log2 of a chunk size.
func shift(cs uint32) uint { return uint(bits.TrailingZeros32(cs)) }

// transient is the N store (dm-snap-transient.c): chunks handed out from
// the start of the COW, nothing kept on it.
type transient struct {
	mu       sync.Mutex
	cow      stack.BlockDevice
	cs       uint32
	nextFree uint64 // sectors
}

func (t *transient) chunk() uint32  { return t.cs }
func (t *transient) typeChar() byte { return 'N' }

func (t *transient) read(func(old, new uint64)) (bool, error) { return true, nil }

func (t *transient) prepare() (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	size := uint64(t.cow.Size()) / stack.SectorSize
	if size < t.nextFree+uint64(t.cs) {
		return 0, errFull
	}
	c := t.nextFree >> shift(t.cs)
	t.nextFree += uint64(t.cs)
	return c, nil
}

func (t *transient) commit(_, _ uint64, ok bool, done func(bool)) { done(ok) }

func (t *transient) usage() (uint64, uint64, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nextFree, uint64(t.cow.Size()) / stack.SectorSize, 0
}

func (t *transient) drop() {}

func (t *transient) setDevice(cow stack.BlockDevice) {
	t.mu.Lock()
	t.cow = cow
	t.mu.Unlock()
}

// readFull reads len(p) bytes at off of dev; a short read is EIO.
func readFull(ctx context.Context, dev stack.BlockDevice, p []byte, off int64) error {
	n, err := dev.ReadAt(ctx, p, off)
	if err == nil && n < len(p) {
		err = fmt.Errorf("short read of %d bytes at %d: %w", n, off, syscall.EIO)
	}
	return err
}

// writeFull writes p at off of dev.
func writeFull(ctx context.Context, dev stack.BlockDevice, p []byte, off int64) error {
	n, err := dev.WriteAt(ctx, p, off)
	if err == nil && n < len(p) {
		err = fmt.Errorf("short write of %d bytes at %d: %w", n, off, syscall.EIO)
	}
	return err
}
