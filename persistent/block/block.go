// Package block is the metadata block manager (the kernel's
// dm-block-manager over dm-bufio): 4 KiB blocks read through a bounded
// cache, checked by a validator on read and sealed by it on write, each
// with a reader/writer lock. Dirty blocks are written when they leave the
// cache and at Flush, which ends with a device flush.
//
// A read lock of a cached block takes no exclusive lock: the cache's map
// is read under a shared lock, the block's own lock is one atomic word,
// and recency is a bit that the eviction's clock hand clears (CLOCK, not
// a list that every hit would reorder). Misses, evictions and write
// unlocks take the map's lock exclusively.
package block

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/dmfuse/dmfuse/persistent"
)

// Size is the metadata block size in bytes.
const Size = 4096

// DefaultCacheBlocks is the cache bound when none is given (16 MiB).
const DefaultCacheBlocks = 4096

// Device is the metadata device (metadata.Device).
type Device interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
	Size() int64
}

// writeLocked is added to the lock word of a write-locked block; a
// read-locked block's word counts its readers. A reader adds itself with
// one atomic add (a load and a compare-and-swap would move the word's
// cache line between CPUs twice) and takes itself back off when the word
// was negative: write-locked.
const writeLocked = -1 << 30

// Block is one cached block, locked for reading or writing.
type Block struct {
	loc  uint64
	data []byte
	v    *Validator

	// lock is the block's reader/writer lock: the number of readers, or
	// writeLocked (plus readers about to back off). A block whose word is
	// not 0 is not evicted.
	lock atomic.Int32
	// used is set by every unlock and cleared by the clock hand.
	used atomic.Bool
	// loaded is set once the block's contents are in (ready closed);
	// err says why they never will be.
	loaded atomic.Bool
	ready  chan struct{}
	err    error

	// Under Manager.mu, exclusively.
	dirty bool
	slot  int // index in Manager.ring
}

// Loc is the block's location.
func (b *Block) Loc() uint64 { return b.loc }

// Data is the block's 4 KiB; only a write lock allows changing it.
func (b *Block) Data() []byte { return b.data }

// tryRead adds a reader unless the block is write-locked.
func (b *Block) tryRead() bool {
	if b.lock.Add(1) > 0 {
		return true
	}
	b.lock.Add(-1)
	return false
}

// Stats counts the manager's work.
type Stats struct {
	Misses, Reads, Writes, Flushes, Evictions uint64
	Cached                                    int
}

// Manager caches the blocks of one device.
type Manager struct {
	dev      Device
	nrBlocks atomic.Uint64
	max      int
	readOnly atomic.Bool

	// mu guards blocks, ring, hand, free and stats: shared to look a
	// block up, exclusive to add or drop one.
	mu     sync.RWMutex
	blocks map[uint64]*Block
	ring   []*Block // every cached block, in no order; the clock's face
	hand   int
	free   [][]byte
	stats  Stats
}

// NewManager returns a manager of dev's blocks caching at most
// cacheBlocks unlocked blocks (DefaultCacheBlocks when 0).
func NewManager(dev Device, cacheBlocks int) *Manager {
	if cacheBlocks <= 0 {
		cacheBlocks = DefaultCacheBlocks
	}
	m := &Manager{dev: dev, max: cacheBlocks, blocks: make(map[uint64]*Block)}
	m.nrBlocks.Store(uint64(dev.Size()) / Size)
	return m
}

// NrBlocks is the number of blocks the device holds.
func (m *Manager) NrBlocks() uint64 { return m.nrBlocks.Load() }

// Refresh re-reads the device's size (after the device grew).
func (m *Manager) Refresh() uint64 {
	n := uint64(m.dev.Size()) / Size
	m.nrBlocks.Store(n)
	return n
}

// SetReadOnly refuses (or allows again) write locks.
func (m *Manager) SetReadOnly(ro bool) { m.readOnly.Store(ro) }

// Stats returns the counters.
func (m *Manager) Stats() Stats {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.stats
	s.Cached = len(m.blocks)
	return s
}

// add caches b; mu held exclusively.
func (m *Manager) add(b *Block) {
	b.slot = len(m.ring)
	m.ring = append(m.ring, b)
	m.blocks[b.loc] = b
}

// drop removes b from the cache; mu held exclusively.
func (m *Manager) drop(b *Block) {
	if m.blocks[b.loc] != b {
		return
	}
	delete(m.blocks, b.loc)
	last := len(m.ring) - 1
	m.ring[b.slot] = m.ring[last]
	m.ring[b.slot].slot = b.slot
	m.ring[last] = nil
	m.ring = m.ring[:last]
	if m.hand >= len(m.ring) {
		m.hand = 0
	}
}

func (m *Manager) buf() []byte {
	if n := len(m.free); n > 0 {
		p := m.free[n-1]
		m.free = m.free[:n-1]
		return p
	}
	return make([]byte, Size)
}

// evict drops unlocked blocks until the cache is within its bound,
// writing the dirty ones: the clock hand passes over locked blocks and
// gives blocks used since it last passed a second chance. Called with mu
// held exclusively, so no reader can lock a block meanwhile.
func (m *Manager) evict() error {
	for steps := 2 * len(m.ring); len(m.blocks) > m.max && steps > 0 && len(m.ring) > 0; steps-- {
		if m.hand >= len(m.ring) {
			m.hand = 0
		}
		b := m.ring[m.hand]
		if b.lock.Load() != 0 || !b.loaded.Load() {
			m.hand++
			continue
		}
		if b.used.Load() {
			b.used.Store(false)
			m.hand++
			continue
		}
		if b.dirty {
			if err := m.write(b); err != nil {
				return err
			}
		}
		m.drop(b) // the hand now points at the block moved into b's slot
		m.stats.Evictions++
		if len(m.free) < 64 {
			m.free = append(m.free, b.data)
		}
		b.data = nil
	}
	return nil
}

// write seals and writes a dirty block. Called with mu held exclusively
// and the block unlocked or write-locked by the caller.
func (m *Manager) write(b *Block) error {
	b.v.Prepare(b.data, b.loc)
	if _, err := m.dev.WriteAt(context.Background(), b.data, int64(b.loc)*Size); err != nil {
		return fmt.Errorf("write metadata block %d: %w", b.loc, err)
	}
	b.dirty = false
	m.stats.Writes++
	return nil
}

// lockErr says why a cached block could not be locked.
func lockErr(write bool, v *Validator, loc uint64) error {
	if write {
		return persistent.Corruptf("%s block %d is written while it is locked", v.Name, loc)
	}
	// Writers run alone (the pool's lock), so a block already locked
	// for writing is one the caller holds itself: metadata that points
	// back into its own path. Waiting would deadlock.
	return persistent.Corruptf("%s block %d is read while it is being written", v.Name, loc)
}

// get returns the block at loc locked for reading, or for writing when
// write is set; zero (with write) zeroes it instead of reading it.
func (m *Manager) get(loc uint64, v *Validator, write, zero bool) (*Block, error) {
	if loc >= m.nrBlocks.Load() {
		return nil, persistent.Corruptf("%s block %d out of range (device has %d blocks)", v.Name, loc, m.nrBlocks.Load())
	}
	if !write {
		m.mu.RLock()
		b, ok := m.blocks[loc]
		locked := ok && b.tryRead()
		m.mu.RUnlock()
		if ok {
			if !locked {
				return nil, lockErr(false, v, loc)
			}
			return m.cached(b, v, false, false)
		}
	}
	m.mu.Lock()
	if b, ok := m.blocks[loc]; ok {
		var locked bool
		if write {
			locked = b.lock.CompareAndSwap(0, writeLocked)
		} else {
			locked = b.tryRead()
		}
		m.mu.Unlock()
		if !locked {
			return nil, lockErr(write, v, loc)
		}
		return m.cached(b, v, write, zero)
	}
	b := &Block{loc: loc, v: v, ready: make(chan struct{})}
	if write {
		b.lock.Store(writeLocked)
	} else {
		b.lock.Store(1)
	}
	b.data = m.buf()
	m.add(b)
	err := m.evict()
	m.stats.Misses++
	if err == nil && !zero {
		m.stats.Reads++
	}
	m.mu.Unlock()
	if err == nil {
		if zero {
			clear(b.data)
		} else {
			err = m.read(b)
		}
	}
	if err != nil {
		b.err = err
		m.mu.Lock()
		m.drop(b)
		m.mu.Unlock()
		close(b.ready)
		m.release(b, write)
		return nil, err
	}
	b.loaded.Store(true)
	close(b.ready)
	return b, nil
}

// cached finishes locking a block found in the cache: it waits for its
// contents and checks its kind (unless zero).
func (m *Manager) cached(b *Block, v *Validator, write, zero bool) (*Block, error) {
	if !b.loaded.Load() {
		<-b.ready
	}
	if b.err != nil {
		m.release(b, write)
		return nil, b.err
	}
	if !zero && b.v != v {
		m.release(b, write)
		return nil, persistent.Corruptf("block %d is a %s block, not a %s block", b.loc, b.v.Name, v.Name)
	}
	return b, nil
}

// release drops a lock without marking the block dirty.
func (m *Manager) release(b *Block, write bool) {
	if write {
		b.lock.Add(-writeLocked)
	} else {
		b.lock.Add(-1)
	}
}

func (m *Manager) read(b *Block) error {
	n, err := m.dev.ReadAt(context.Background(), b.data, int64(b.loc)*Size)
	if err != nil || n != Size {
		return fmt.Errorf("read metadata block %d: %d bytes: %w", b.loc, n, err)
	}
	return b.v.Verify(b.data, b.loc)
}

// ReadLock returns the block at loc locked for reading.
func (m *Manager) ReadLock(loc uint64, v *Validator) (*Block, error) {
	return m.get(loc, v, false, false)
}

// WriteLock returns the block at loc locked for writing; it is written
// back when it leaves the cache or at Flush.
func (m *Manager) WriteLock(loc uint64, v *Validator) (*Block, error) {
	return m.writeLock(loc, v, false)
}

// WriteLockZero is WriteLock of a block whose old contents do not matter:
// it is not read, and its data is zeroed.
func (m *Manager) WriteLockZero(loc uint64, v *Validator) (*Block, error) {
	return m.writeLock(loc, v, true)
}

func (m *Manager) writeLock(loc uint64, v *Validator, zero bool) (*Block, error) {
	if m.readOnly.Load() {
		return nil, fmt.Errorf("write block %d: %w", loc, persistent.ErrReadOnly)
	}
	b, err := m.get(loc, v, true, zero)
	if err != nil {
		return nil, err
	}
	if zero {
		clear(b.data)
		b.v = v
	}
	return b, nil
}

// Unlock releases a read or write lock; a block that was write-locked is
// dirty.
func (m *Manager) Unlock(b *Block) {
	if !b.used.Load() {
		b.used.Store(true)
	}
	if b.lock.Load() >= 0 {
		b.lock.Add(-1)
		return
	}
	m.mu.Lock()
	b.dirty = true
	b.lock.Add(-writeLocked)
	// A failed write-back leaves the block dirty; Flush reports it.
	_ = m.evict()
	m.mu.Unlock()
}

// Flush writes every dirty block, in order of location, then flushes the
// device. A block still write-locked is an error.
func (m *Manager) Flush() error {
	m.mu.Lock()
	var dirty []*Block
	for _, b := range m.ring {
		if b.lock.Load() < 0 {
			m.mu.Unlock()
			return fmt.Errorf("flush: block %d is still write-locked", b.loc)
		}
		if b.dirty {
			dirty = append(dirty, b)
		}
	}
	sort.Slice(dirty, func(i, j int) bool { return dirty[i].loc < dirty[j].loc })
	for _, b := range dirty {
		if err := m.write(b); err != nil {
			m.mu.Unlock()
			return err
		}
	}
	m.stats.Flushes++
	m.mu.Unlock()
	if err := m.dev.Flush(context.Background()); err != nil {
		return fmt.Errorf("flush metadata device: %w", err)
	}
	return nil
}

// Invalidate drops every unlocked block, dirty ones unwritten (the
// transaction is being thrown away).
func (m *Manager) Invalidate() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.ring) - 1; i >= 0; i-- {
		if b := m.ring[i]; b.lock.Load() == 0 && b.loaded.Load() {
			m.drop(b)
		}
	}
}

// Dirty reports whether any cached block waits to be written.
func (m *Manager) Dirty() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, b := range m.ring {
		if b.dirty {
			return true
		}
	}
	return false
}
