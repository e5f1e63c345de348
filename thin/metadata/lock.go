package metadata

import (
	"sync"
	"sync/atomic"
)

// rwLock is the pool's reader/writer lock. It is taken on the I/O path,
// often by a transport's queue thread that serves other requests after
// the one at hand, and held for microseconds: a thread that finds it
// taken spins for a while before it sleeps, since waking a sleeping
// thread takes longer than such a wait, and the whole queue waits with it.
// A reader that finds no writer takes it with the one atomic add of
// RLock.
type rwLock struct {
	mu      sync.RWMutex
	writers atomic.Int32 // writers waiting for mu or holding it
}

// lockSpins bounds the tries before a waiter sleeps: a few microseconds.
const lockSpins = 200

// pause waits a few dozen cycles between tries (the compiler keeps
// empty loops).
//
//go:noinline
func pause() {
	for i := 0; i < 32; i++ {
	}
}

func (l *rwLock) RLock() {
	for i := 0; i < lockSpins && l.writers.Load() != 0; i++ {
		pause()
	}
	l.mu.RLock()
}

func (l *rwLock) RUnlock() { l.mu.RUnlock() }

func (l *rwLock) Lock() {
	l.writers.Add(1)
	for range lockSpins {
		if l.mu.TryLock() {
			return
		}
		pause()
	}
	l.mu.Lock()
}

func (l *rwLock) Unlock() {
	l.mu.Unlock()
	l.writers.Add(-1)
}
