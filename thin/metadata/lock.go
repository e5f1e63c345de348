package metadata

import "sync"

// rwLock is the pool's reader/writer lock. It is taken on the I/O path,
// often by a transport's queue thread that serves other requests after
// the one at hand, and held for microseconds: a thread that finds it
// taken spins for a while before it sleeps, since waking a sleeping
// thread takes longer than such a wait, and the whole queue waits with it.
type rwLock struct{ mu sync.RWMutex }

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
	for range lockSpins {
		if l.mu.TryRLock() {
			return
		}
		pause()
	}
	l.mu.RLock()
}

func (l *rwLock) RUnlock() { l.mu.RUnlock() }

func (l *rwLock) Lock() {
	for range lockSpins {
		if l.mu.TryLock() {
			return
		}
		pause()
	}
	l.mu.Lock()
}

func (l *rwLock) Unlock() { l.mu.Unlock() }
