package uring

import (
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestOffloadLarge: a READ of at least Config.OffloadBytes runs off the
// leader's thread, so that the requests behind it are answered while it
// still runs, without a hand-off of the queue; smaller READs run inline.
func TestOffloadLarge(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 8)
	q := s.queues[0]
	// Before any request: the leader reads it only for a request.
	s.cfg.OffloadBytes = 8192
	big := func(unique, node uint64) { r.readSize(unique, node, 0, 8192) }
	big(100, nodeSilent) // waits without saying so, and the clock never moves
	<-fs.started
	for i := range uint64(5) {
		r.read(200+2*i, nodeFast)
		if p := r.reply(t); p.unique != 200+2*i || p.status != 0 || p.size != 4096 {
			t.Fatalf("reply %+v, want %d's", p, 200+2*i)
		}
	}
	close(fs.release)
	if p := r.reply(t); p.unique != 100 || p.status != 0 || p.size != 8192 {
		t.Errorf("the large read's reply: %+v", p)
	}
	big(300, nodeFast)
	if p := r.reply(t); p.unique != 300 || p.size != 8192 {
		t.Errorf("second large read's reply: %+v", p)
	}
	if o, h, w := q.offloaded.Load(), q.hinted.Load(), q.takenOver.Load(); o != 2 || h != 0 || w != 0 {
		t.Errorf("%d offloaded, %d hand-offs on a hint, %d by the watchdog; want 2, 0, 0", o, h, w)
	}
	if n := q.requests.Load(); n != 7 {
		t.Errorf("queue counted %d requests, want 7", n)
	}
}

// TestEntrySize: size is the data size of READ and WRITE only.
func TestEntrySize(t *testing.T) {
	cfg := Config{Depth: 1, PayloadSize: 8192}
	s := newServer(cfg, []ring{newFakeRing()}, [][]byte{make([]byte, bufSize(cfg))})
	e := &s.queues[0].ent[0]
	for _, c := range []struct {
		op   uint32
		size uint32
		want int
	}{{opRead, 4096, 4096}, {opWrite, 1 << 20, 1 << 20}, {opReaddir, 4096, 0}, {opGetattr, 0, 0}} {
		in := fuse.ReadIn{Size: c.size}
		b := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))[unsafe.Sizeof(fuse.InHeader{}):]
		if c.op == opWrite {
			w := fuse.WriteIn{Size: c.size}
			b = unsafe.Slice((*byte)(unsafe.Pointer(&w)), unsafe.Sizeof(w))[unsafe.Sizeof(fuse.InHeader{}):]
		}
		e.request(c.op, 10, 7, b, nil)
		e.prepare()
		if got := e.size(); got != c.want {
			t.Errorf("op %d size %d: size() = %d, want %d", c.op, c.size, got, c.want)
		}
	}
}

// TestCloseWaitsForOffloaded: after Close, the ring (whose buffers an
// offloaded request still reads and writes) is released only once the
// offloaded request has ended.
func TestCloseWaitsForOffloaded(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 4)
	q := s.queues[0]
	s.cfg.OffloadBytes = 8192
	r.readSize(100, nodeSilent, 0, 8192)
	<-fs.started
	s.Close()
	for {
		q.mu.Lock()
		ended := q.closed
		q.mu.Unlock()
		if ended {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// The queue has ended; give the release a moment to happen if it
	// were going to (it must not).
	time.Sleep(20 * time.Millisecond)
	if r.closed.Load() {
		t.Fatal("the ring was released while an offloaded request ran")
	}
	close(fs.release)
	s.Wait()
	if !r.closed.Load() {
		t.Error("the ring was not released after the offloaded request ended")
	}
}

// TestOffloadWorkers: offloaded requests run on workers that outlive them:
// one after another they all run on one worker, at once each on a worker of
// its own, and the workers end with the server.
func TestOffloadWorkers(t *testing.T) {
	s, r, fs, _ := newFakeServer(t, 8)
	s.cfg.OffloadBytes = 8192
	big := func(unique, node uint64) { r.readSize(unique, node, 0, 8192) }
	for i := range uint64(3) {
		big(100+i, nodeFast)
		if p := r.reply(t); p.unique != 100+i || p.size != 8192 {
			t.Fatalf("reply %+v, want %d's", p, 100+i)
		}
		// Until the worker is back in its receive, a send would
		// start a new one.
		waitUntil(t, "the worker idle", func() bool { return s.offloads.idle.Load() >= 1 })
	}
	if n := s.offloads.workers.Load(); n != 1 {
		t.Fatalf("3 large reads one after another: %d workers, want 1", n)
	}
	big(200, nodeSilent)
	<-fs.started
	big(201, nodeFast)
	if p := r.reply(t); p.unique != 201 {
		t.Fatalf("reply %+v, want 201's while 200 waits", p)
	}
	if n := s.offloads.workers.Load(); n != 2 {
		t.Fatalf("a large read while another waits: %d workers, want 2", n)
	}
	close(fs.release)
	if p := r.reply(t); p.unique != 200 {
		t.Fatalf("reply %+v, want 200's", p)
	}
	s.Close()
	s.Wait()
	waitUntil(t, "no workers after the server ended", func() bool { return s.offloads.workers.Load() == 0 })
}

// waitUntil polls cond for up to 10 s and fails the test, naming what, if
// it never holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
