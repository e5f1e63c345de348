// Package block is the metadata block manager (the kernel's
// dm-block-manager over dm-bufio): 4 KiB blocks read through a bounded
// cache, checked by a validator on read and sealed by it on write, each
// with a reader/writer lock. Dirty blocks are written when they leave the
// cache and at Flush, which ends with a device flush.
package block

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/dmfuse/dmfuse/thin/metadata/internal/errs"
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

// Block is one cached block, locked for reading or writing.
type Block struct {
	loc   uint64
	data  []byte
	v     *Validator
	rw    sync.RWMutex
	ready chan struct{}
	err   error

	writer atomic.Bool // write-locked; changed by the lock's holder

	// Under Manager.mu.
	pins       int
	dirty      bool
	prev, next *Block // LRU list of unpinned blocks
	inLRU      bool
}

// Loc is the block's location.
func (b *Block) Loc() uint64 { return b.loc }

// Data is the block's 4 KiB; only a write lock allows changing it.
func (b *Block) Data() []byte { return b.data }

// Stats counts the manager's work.
type Stats struct {
	Hits, Misses, Reads, Writes, Flushes, Evictions uint64
	Cached                                          int
}

// Manager caches the blocks of one device.
type Manager struct {
	dev      Device
	nrBlocks uint64
	max      int
	readOnly atomic.Bool

	mu     sync.Mutex
	blocks map[uint64]*Block
	lru    Block // sentinel: lru.next is the least recently used
	free   [][]byte
	stats  Stats
}

// NewManager returns a manager of dev's blocks caching at most
// cacheBlocks unlocked blocks (DefaultCacheBlocks when 0).
func NewManager(dev Device, cacheBlocks int) *Manager {
	if cacheBlocks <= 0 {
		cacheBlocks = DefaultCacheBlocks
	}
	m := &Manager{dev: dev, nrBlocks: uint64(dev.Size()) / Size, max: cacheBlocks,
		blocks: make(map[uint64]*Block)}
	m.lru.next, m.lru.prev = &m.lru, &m.lru
	return m
}

// NrBlocks is the number of blocks the device holds.
func (m *Manager) NrBlocks() uint64 { return m.nrBlocks }

// Refresh re-reads the device's size (after the device grew).
func (m *Manager) Refresh() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nrBlocks = uint64(m.dev.Size()) / Size
	return m.nrBlocks
}

// SetReadOnly refuses (or allows again) write locks.
func (m *Manager) SetReadOnly(ro bool) { m.readOnly.Store(ro) }

// Stats returns the counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Cached = len(m.blocks)
	return s
}

func (m *Manager) lruRemove(b *Block) {
	if b.inLRU {
		b.prev.next, b.next.prev = b.next, b.prev
		b.prev, b.next, b.inLRU = nil, nil, false
	}
}

func (m *Manager) lruPush(b *Block) {
	b.prev, b.next = m.lru.prev, &m.lru
	m.lru.prev.next = b
	m.lru.prev = b
	b.inLRU = true
}

func (m *Manager) buf() []byte {
	if n := len(m.free); n > 0 {
		p := m.free[n-1]
		m.free = m.free[:n-1]
		return p
	}
	return make([]byte, Size)
}

// evict drops unpinned blocks, least recently used first, until the cache
// is within its bound, writing the dirty ones. Called with mu held.
func (m *Manager) evict() error {
	for len(m.blocks) > m.max && m.lru.next != &m.lru {
		b := m.lru.next
		if b.dirty {
			if err := m.write(b); err != nil {
				return err
			}
		}
		m.lruRemove(b)
		delete(m.blocks, b.loc)
		m.stats.Evictions++
		if len(m.free) < 64 {
			m.free = append(m.free, b.data)
		}
		b.data = nil
	}
	return nil
}

// write seals and writes a dirty block. Called with mu held and the block
// unpinned or write-locked by the caller.
func (m *Manager) write(b *Block) error {
	b.v.Prepare(b.data, b.loc)
	if _, err := m.dev.WriteAt(context.Background(), b.data, int64(b.loc)*Size); err != nil {
		return fmt.Errorf("write metadata block %d: %w", b.loc, err)
	}
	b.dirty = false
	m.stats.Writes++
	return nil
}

// get pins the block at loc, reading and validating it unless zero is
// set (then its contents are zeroed and it is not read).
func (m *Manager) get(loc uint64, v *Validator, zero bool) (*Block, error) {
	if loc >= m.nrBlocks {
		return nil, errs.Corruptf("%s block %d out of range (device has %d blocks)", v.Name, loc, m.nrBlocks)
	}
	m.mu.Lock()
	if b, ok := m.blocks[loc]; ok {
		b.pins++
		m.lruRemove(b)
		m.stats.Hits++
		m.mu.Unlock()
		<-b.ready
		if b.err != nil {
			m.unpin(b)
			return nil, b.err
		}
		if !zero && b.v != v {
			m.unpin(b)
			return nil, errs.Corruptf("block %d is a %s block, not a %s block", loc, b.v.Name, v.Name)
		}
		return b, nil
	}
	b := &Block{loc: loc, v: v, pins: 1, ready: make(chan struct{})}
	b.data = m.buf()
	m.blocks[loc] = b
	err := m.evict()
	m.stats.Misses++
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
		delete(m.blocks, loc)
		b.pins--
		m.mu.Unlock()
		close(b.ready)
		return nil, err
	}
	close(b.ready)
	return b, nil
}

func (m *Manager) read(b *Block) error {
	n, err := m.dev.ReadAt(context.Background(), b.data, int64(b.loc)*Size)
	if err != nil || n != Size {
		return fmt.Errorf("read metadata block %d: %d bytes: %w", b.loc, n, err)
	}
	m.mu.Lock()
	m.stats.Reads++
	m.mu.Unlock()
	return b.v.Verify(b.data, b.loc)
}

func (m *Manager) unpin(b *Block) {
	m.mu.Lock()
	b.pins--
	if b.pins == 0 && b.err == nil {
		if _, ok := m.blocks[b.loc]; ok {
			m.lruPush(b)
		}
	}
	m.mu.Unlock()
}

// ReadLock returns the block at loc locked for reading.
func (m *Manager) ReadLock(loc uint64, v *Validator) (*Block, error) {
	b, err := m.get(loc, v, false)
	if err != nil {
		return nil, err
	}
	// Writers run alone (the pool's lock), so a block already locked for
	// writing is one the caller holds itself: metadata that points back
	// into its own path. Waiting would deadlock.
	if !b.rw.TryRLock() {
		m.unpin(b)
		return nil, errs.Corruptf("%s block %d is read while it is being written", v.Name, loc)
	}
	return b, nil
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
		return nil, fmt.Errorf("write block %d: %w", loc, errs.ErrReadOnly)
	}
	b, err := m.get(loc, v, zero)
	if err != nil {
		return nil, err
	}
	if !b.rw.TryLock() {
		m.unpin(b)
		return nil, errs.Corruptf("%s block %d is written while it is locked", v.Name, loc)
	}
	if zero {
		clear(b.data)
		b.v = v
	}
	b.writer.Store(true)
	return b, nil
}

// Unlock releases a read or write lock; a block that was write-locked is
// dirty.
func (m *Manager) Unlock(b *Block) {
	w := b.writer.Load()
	if w {
		b.writer.Store(false)
		b.rw.Unlock()
	} else {
		b.rw.RUnlock()
	}
	m.mu.Lock()
	if w {
		b.dirty = true
	}
	b.pins--
	if b.pins == 0 && b.err == nil {
		if _, ok := m.blocks[b.loc]; ok {
			m.lruPush(b)
		}
	}
	// A failed write-back leaves the block dirty; Flush reports it.
	_ = m.evict()
	m.mu.Unlock()
}

// Flush writes every dirty block, in order of location, then flushes the
// device. A block still write-locked is an error.
func (m *Manager) Flush() error {
	m.mu.Lock()
	var dirty []*Block
	for _, b := range m.blocks {
		if b.writer.Load() {
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
	for loc, b := range m.blocks {
		if b.pins == 0 {
			m.lruRemove(b)
			delete(m.blocks, loc)
		}
	}
}

// Dirty reports whether any cached block waits to be written.
func (m *Manager) Dirty() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.blocks {
		if b.dirty {
			return true
		}
	}
	return false
}
