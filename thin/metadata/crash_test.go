package metadata

import (
	"context"
	"math/rand"
	"sync"
	"testing"
)

// crashDev models a device with a volatile write cache over a durable
// memDev: writes are pending until a flush makes them durable. After
// limit writes the power is cut: later writes still read back (the
// process runs on until crash) but never become durable, flushes make
// nothing durable, and crash() makes a random subset of the writes
// pending at the cut durable.
type crashDev struct {
	mu      sync.Mutex
	durable *memDev
	pending []pendingWrite
	lost    []pendingWrite // written after the cut
	limit   int            // writes accepted before the power cut; <0: no cut
	dropped int
}

type pendingWrite struct {
	off  int64
	data []byte
}

func (d *crashDev) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, _ := d.durable.ReadAt(ctx, p, off)
	for _, w := range append(d.pending[:len(d.pending):len(d.pending)], d.lost...) {
		lo, hi := max(off, w.off), min(off+int64(len(p)), w.off+int64(len(w.data)))
		if lo < hi {
			copy(p[lo-off:hi-off], w.data[lo-w.off:hi-w.off])
		}
	}
	return n, nil
}

func (d *crashDev) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.limit == 0 {
		d.dropped++
		d.lost = append(d.lost, pendingWrite{off, append([]byte(nil), p...)})
		return len(p), nil
	}
	if d.limit > 0 {
		d.limit--
	}
	d.pending = append(d.pending, pendingWrite{off, append([]byte(nil), p...)})
	return len(p), nil
}

func (d *crashDev) Flush(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.limit == 0 {
		return nil
	}
	for _, w := range d.pending {
		d.durable.WriteAt(ctx, w.data, w.off)
	}
	d.pending = nil
	return nil
}

func (d *crashDev) Size() int64 { return d.durable.Size() }

// crash keeps a random subset of the pending writes.
func (d *crashDev) crash(rng *rand.Rand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.pending {
		if rng.Intn(2) == 0 {
			d.durable.WriteAt(context.Background(), w.data, w.off)
		}
	}
	d.pending, d.lost = nil, nil
}

// TestCrashDuringCommit cuts the power at a random write of a commit (and
// of the cache write-back before it) and reopens: the pool must hold the
// last committed transaction intact, or the new one when every write of
// its commit reached the disk, with exact reference counts either way.
func TestCrashDuringCommit(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	base := newMemDev(2048)
	p := mustOpen(t, base, Options{Format: true, DataBlockSize: 128, DataBlocks: 20000})
	m := model{}
	var next uint32
	randomOps(t, rng, p, m, 80, &next)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	trials := 40
	if testing.Short() {
		trials = 10
	}
	cut := 0
	for trial := 0; trial < trials; trial++ {
		dev := &crashDev{durable: base.clone(), limit: -1}
		p := mustOpen(t, dev, Options{DataBlockSize: 128, CacheBlocks: 32})
		m2 := m.clone()
		n2 := next
		// Every other trial cuts the power while the transaction is
		// built (the cache writes back blocks it evicts), the others
		// during the commit.
		early := trial%2 == 1
		if early {
			dev.limit = rng.Intn(40)
		}
		randomOps(t, rng, p, m2, 30, &n2)
		if !early {
			dev.mu.Lock()
			dev.limit = rng.Intn(120)
			dev.mu.Unlock()
		}
		if err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		dev.crash(rng)
		p.Close()
		q, err := Open(dev.durable, Options{DataBlockSize: 128})
		if err != nil {
			t.Fatalf("trial %d: reopen after the power cut: %v", trial, err)
		}
		// With a write dropped, the superblock (the last write) was
		// dropped too; otherwise the commit's last flush may have been
		// cut, and the superblock landed or not.
		err = diffModel(q, m)
		if dev.dropped == 0 && err != nil {
			err = diffModel(q, m2)
		}
		if err != nil {
			t.Fatalf("trial %d (%d writes dropped): %v", trial, dev.dropped, err)
		}
		verifyCounts(t, q)
		q.Close()
		if dev.dropped > 0 {
			cut++
		}
	}
	if cut == 0 || cut == trials {
		t.Errorf("%d of %d commits cut: the test missed one of the cases", cut, trials)
	}
}
