package snapshot

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
)

// model is what an origin and its snapshots must read.
type model struct {
	origin []byte
	snaps  map[string][]byte
}

func (m *model) write(dev string, p []byte, off int64) {
	if dev == "base" {
		copy(m.origin[off:], p)
		return
	}
	copy(m.snaps[dev][off:], p)
}

// TestSnapshotsKeepTheirViews: an origin (of a size that is no multiple of
// the chunks) with three snapshots of chunk 8, 16 and 128, P and N; random
// writes of every alignment to the origin and the snapshots, concurrent
// from four goroutines on disjoint ranges; every device reads what the
// model says: a snapshot the origin as it was at its creation plus its own
// writes, the origin its writes.
func TestSnapshotsKeepTheirViews(t *testing.T) {
	const size = 4<<20 - 3*512
	r := newRig(t)
	o := r.memDev("o", size)
	init := fill(7, size)
	o.WriteAt(bgCtx, init, 0)
	m := &model{origin: append([]byte(nil), init...), snaps: map[string][]byte{}}
	sectors := size / 512
	specs := []struct{ name, store string }{{"s8", "P 8"}, {"s16", "N 16"}, {"s128", "PO 128"}}
	r.create("base", fmt.Sprintf("0 %d snapshot-origin o", sectors))
	for _, s := range specs {
		r.memDev("cow-"+s.name, 8<<20)
		// As lvm does: the origin is suspended while the snapshot is made.
		if err := r.mgr.Suspend("base", stack.Flags{}); err != nil {
			t.Fatal(err)
		}
		r.create(s.name, fmt.Sprintf("0 %d snapshot o cow-%s %s", sectors, s.name, s.store))
		if err := r.mgr.Resume("base", stack.Flags{}); err != nil {
			t.Fatal(err)
		}
		m.snaps[s.name] = append([]byte(nil), m.origin...)
		// Writes between the creations.
		p := fill(uint64(len(s.name)), 5000)
		r.mustWrite("base", p, 12345)
		m.write("base", p, 12345)
	}
	devs := []string{"base", "s8", "s16", "s128"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 99))
			lo := int64(g) * (size / 4)
			for i := 0; i < 300; i++ {
				dev := devs[rng.IntN(len(devs))]
				n := int64(1 + rng.IntN(70000))
				off := lo + rng.Int64N(size/4-n)
				p := fill(rng.Uint64(), int(n))
				if err := r.write(dev, p, off); err != nil {
					t.Errorf("write %s %d+%d: %v", dev, off, n, err)
					return
				}
				mu.Lock()
				m.write(dev, p, off)
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	if got := r.mustRead("base", 0, size); !bytes.Equal(got, m.origin) {
		t.Errorf("origin: %s", hexdiff(got, m.origin))
	}
	for name, want := range m.snaps {
		if got := r.mustRead(name, 0, size); !bytes.Equal(got, want) {
			t.Errorf("%s: %s", name, hexdiff(got, want))
		}
	}
	// The persistent stores reopen with the same views.
	for _, s := range specs {
		if !strings.HasPrefix(s.store, "P") {
			continue
		}
		if err := r.mgr.Remove(s.name, stack.Flags{}); err != nil {
			t.Fatal(err)
		}
		r.create(s.name, fmt.Sprintf("0 %d snapshot o cow-%s %s", sectors, s.name, s.store))
		if got := r.mustRead(s.name, 0, size); !bytes.Equal(got, m.snaps[s.name]) {
			t.Errorf("%s reopened: %s", s.name, hexdiff(got, m.snaps[s.name]))
		}
	}
	if r.mem <= 0 {
		t.Errorf("the exception tables accounted %d bytes", r.mem)
	}
}

// TestOverflow: a full COW invalidates a P or N snapshot at a write that
// needs a chunk (EIO, status Invalid, the header rewritten invalid for P,
// one event; reads then fail, an empty flush passes, origin writes pass);
// a PO snapshot shows Overflow instead (writes fail, reads work, no event)
// until an origin write needs a chunk, which invalidates it.
func TestOverflow(t *testing.T) {
	for _, store := range []string{"P", "N", "PO"} {
		t.Run(store, func(t *testing.T) {
			r := newRig(t)
			r.memDev("o", 1<<20)
			// P: header, area, 2 data chunks; N: 4 data chunks.
			cow := r.memDev("c", 4*4096)
			s := r.create("s", "0 2048 snapshot o c "+store+" 8")
			r.create("base", "0 2048 snapshot-origin o")
			room := 2
			if store == "N" {
				room = 4
			}
			for i := 0; i < room; i++ {
				r.mustWrite("s", []byte{1}, int64(i)*4096)
			}
			ev := s.EventNr()
			err := r.write("s", []byte{1}, int64(room)*4096)
			if !isErrno(err, syscall.EIO) {
				t.Fatalf("a write past the room: %v", err)
			}
			if store == "PO" {
				if got := r.status("s"); got != "0 2048 snapshot Overflow" || s.EventNr() != ev {
					t.Errorf("status %q, events %d -> %d", got, ev, s.EventNr())
				}
				if _, err := r.read("s", 0, 4096); err != nil {
					t.Errorf("read of an overflowed snapshot: %v", err)
				}
				if err := r.write("s", []byte{1}, 0); !isErrno(err, syscall.EIO) {
					t.Errorf("a write to a copied chunk of an overflowed snapshot: %v", err)
				}
				r.mustWrite("base", []byte{9}, 100*4096)
			}
			if got := r.status("s"); got != "0 2048 snapshot Invalid" || s.EventNr() != ev+1 {
				t.Errorf("status %q, events %d -> %d", got, ev, s.EventNr())
			}
			if _, err := r.read("s", 0, 512); !isErrno(err, syscall.EIO) {
				t.Errorf("read of an invalid snapshot: %v", err)
			}
			if err := s.Flush(bgCtx); err != nil {
				t.Errorf("flush of an invalid snapshot: %v", err)
			}
			r.mustWrite("base", []byte{8}, 200*4096)
			hdr := memBytes(t, cow)[:16]
			if wantValid := store == "N"; (hdr[4] == 1) != wantValid && store != "N" {
				t.Errorf("header after invalidation: %x", hdr)
			}
			if store == "N" && hdr[0] == 'S' {
				t.Errorf("a transient store wrote a header: %x", hdr)
			}
		})
	}
}

// TestDiscards: a snapshot without features and snapshot-origin take no
// discards (EOPNOTSUPP); with discard_zeroes_cow a discard of a whole
// copied chunk zeroes it on the COW and leaves the usage, one of a chunk
// without an exception does nothing; with discard_passdown_origin the
// origin range is discarded too, without a copy-out.
func TestDiscards(t *testing.T) {
	r := newRig(t)
	o := r.memDev("o", 1<<20)
	o.WriteAt(bgCtx, bytes.Repeat([]byte{7}, 1<<20), 0)
	r.memDev("c1", 1<<20)
	r.memDev("c2", 1<<20)
	r.memDev("c3", 1<<20)
	r.create("plain", "0 2048 snapshot o c1 P 8")
	r.create("zc", "0 2048 snapshot o c2 P 8 1 discard_zeroes_cow")
	r.create("pd", "0 2048 snapshot o c3 P 8 2 discard_zeroes_cow discard_passdown_origin")
	r.create("base", "0 2048 snapshot-origin o")
	for _, d := range []string{"plain", "base"} {
		if err := r.dev(d).Discard(bgCtx, 0, 4096); !isErrno(err, syscall.EOPNOTSUPP) {
			t.Errorf("discard on %s: %v", d, err)
		}
	}
	r.mustWrite("zc", []byte{1}, 0)
	before := r.status("zc")
	if err := r.dev("zc").Discard(bgCtx, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if got := r.mustRead("zc", 0, 4096); !bytes.Equal(got, make([]byte, 4096)) || r.status("zc") != before {
		t.Errorf("after a whole-chunk discard: %x..., status %q (was %q)", got[:8], r.status("zc"), before)
	}
	if err := r.dev("zc").Discard(bgCtx, 4096, 4096); err != nil {
		t.Fatal(err)
	}
	if got := r.mustRead("zc", 4096, 4096); got[0] != 7 {
		t.Errorf("a discard of a chunk without an exception changed it: %x", got[:8])
	}
	if err := r.dev("pd").Discard(bgCtx, 8192, 4096); err != nil {
		t.Fatal(err)
	}
	if got := r.mustRead("base", 8192, 4096); !bytes.Equal(got, make([]byte, 4096)) {
		t.Errorf("passdown did not discard the origin: %x", got[:8])
	}
	if got := r.mustRead("plain", 8192, 4096); got[0] != 0 {
		// The passdown bypasses the other snapshots' copy-out (rst: "the
		// snapshot-origin target is bypassed").
		t.Errorf("another snapshot copied out on a passdown: %x", got[:8])
	}
}
