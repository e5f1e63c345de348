package snapshot

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/powercut"
	"github.com/dmfuse/dmfuse/stack"
)

// crashRig is an origin and a COW on memory devices, each behind a
// powercut device (a volatile write cache that a message cuts), the
// snapshot s and the origin base over them.
type crashRig struct {
	*rig
	size int64
}

const crashSize = 2 << 20

func newCrashRig(t *testing.T) *crashRig {
	r := newRig(t, powercut.Type)
	o := r.memDev("o-mem", crashSize)
	o.WriteAt(bgCtx, fill(11, crashSize), 0)
	r.memDev("c-mem", 4<<20)
	r.create("o", fmt.Sprintf("0 %d powercut o-mem 0", crashSize/512))
	r.create("c", fmt.Sprintf("0 %d powercut c-mem 0", (4<<20)/512))
	return &crashRig{rig: r, size: crashSize}
}

func (c *crashRig) message(dev string, words ...string) {
	c.t.Helper()
	if _, err := c.mgr.Message(bgCtx, dev, 0, words); err != nil {
		c.t.Fatalf("message %s %v: %v", dev, words, err)
	}
}

// tracked is what a device must read after a crash: the bytes as of its
// last flush, except where it was written since (either value may be
// there, or a mix).
type tracked struct {
	flushed []byte
	latest  []byte
	dirty   []bool // per sector, written since the last flush
}

func newTracked(p []byte) *tracked {
	return &tracked{flushed: append([]byte(nil), p...), latest: append([]byte(nil), p...), dirty: make([]bool, len(p)/512)}
}

func (k *tracked) write(p []byte, off int64) {
	copy(k.latest[off:], p)
	for s := off / 512; s < (off+int64(len(p))+511)/512; s++ {
		k.dirty[s] = true
	}
}

func (k *tracked) flush() {
	copy(k.flushed, k.latest)
	clear(k.dirty)
}

// check compares what dev reads after a crash with k.
func (k *tracked) check(t *testing.T, what string, got []byte) {
	t.Helper()
	for s, d := range k.dirty {
		if d {
			continue
		}
		lo, hi := s*512, (s+1)*512
		if !bytes.Equal(got[lo:hi], k.flushed[lo:hi]) {
			t.Fatalf("%s: sector %d, not written since the last flush, lost what was flushed: %s", what, s, hexdiff(got[lo:hi], k.flushed[lo:hi]))
		}
	}
}

// TestCrash: power is cut under the COW device, or under the origin, in
// the middle of writes to the origin and to the snapshot, some of them
// flushed; after power comes back and the devices are loaded again, the
// COW opens in the kernel's format and the snapshot reads the origin as it
// was at snapshot time plus its own flushed writes, and the origin its
// flushed writes.
func TestCrash(t *testing.T) {
	for _, under := range []string{"c", "o"} {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("cut %s seed %d", under, seed), func(t *testing.T) {
				c := newCrashRig(t)
				c.create("s", fmt.Sprintf("0 %d snapshot o c P 8", c.size/512))
				c.create("base", fmt.Sprintf("0 %d snapshot-origin o", c.size/512))
				snap := newTracked(c.mustRead("base", 0, c.size))
				orig := newTracked(snap.latest)
				rng := rand.New(rand.NewPCG(seed, 5))
				for i := 0; i < 400; i++ {
					n := int64(512 * (1 + rng.IntN(24)))
					off := rng.Int64N(c.size/512-n/512) * 512
					p := fill(rng.Uint64(), int(n))
					if rng.IntN(2) == 0 {
						c.mustWrite("base", p, off)
						orig.write(p, off)
					} else {
						c.mustWrite("s", p, off)
						snap.write(p, off)
					}
					switch rng.IntN(20) {
					case 0:
						if err := c.dev("s").Flush(bgCtx); err != nil {
							t.Fatal(err)
						}
						snap.flush()
					case 1:
						if err := c.dev("base").Flush(bgCtx); err != nil {
							t.Fatal(err)
						}
						orig.flush()
					}
				}
				c.message(under, "power_cut", "random", fmt.Sprint(seed))
				c.message(under, "power_on")
				for _, d := range []string{"base", "s"} {
					if err := c.mgr.Remove(d, stack.Flags{}); err != nil {
						t.Fatal(err)
					}
				}
				st, err := ReadStore(bytes.NewReader(memBytes(t, c.mems["c-mem"])), 4<<20)
				if err != nil || !st.Valid || st.Chunk != 8 {
					t.Fatalf("the COW after the crash: %+v, %v", st, err)
				}
				c.create("s", fmt.Sprintf("0 %d snapshot o c P 8", c.size/512))
				c.create("base", fmt.Sprintf("0 %d snapshot-origin o", c.size/512))
				if got := c.status("s"); got == "0 4096 snapshot Invalid" {
					t.Fatalf("the snapshot came back invalid")
				}
				snap.check(t, "snapshot", c.mustRead("s", 0, c.size))
				orig.check(t, "origin", c.mustRead("base", 0, c.size))
			})
		}
	}
}

// TestCrashDuringMerge: power is cut under both devices in the middle of
// a merge; loaded again, snapshot-merge resumes from the COW and finishes
// with the origin holding exactly what the snapshot held.
func TestCrashDuringMerge(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			c := newCrashRig(t)
			sectors := c.size / 512
			c.create("s", fmt.Sprintf("0 %d snapshot o c P 8", sectors))
			c.create("base", fmt.Sprintf("0 %d snapshot-origin o", sectors))
			rng := rand.New(rand.NewPCG(seed, 9))
			for i := 0; i < 300; i++ {
				off := rng.Int64N(c.size/4096) * 4096
				c.mustWrite("base", fill(rng.Uint64(), 1000), off+512)
				c.mustWrite("s", fill(rng.Uint64(), 600), off+2048)
			}
			for _, d := range []string{"s", "base", "o", "c"} {
				if err := c.dev(d).Flush(bgCtx); err != nil {
					t.Fatal(err)
				}
			}
			view := c.mustRead("s", 0, c.size)
			mr := &mergeRig{rig: c.rig, sectors: sectors}
			mr.startMerge()
			// Let some steps run, then cut both (where the cut lands
			// varies; every place must come out right).
			time.Sleep(time.Duration(seed) * time.Millisecond)
			c.message("o", "power_cut", "random", fmt.Sprint(seed))
			c.message("c", "power_cut", "random", fmt.Sprint(seed))
			c.message("o", "power_on")
			c.message("c", "power_on")
			for _, d := range []string{"base", "s"} {
				if err := c.mgr.Remove(d, stack.Flags{}); err != nil {
					t.Fatal(err)
				}
			}
			c.create("base", fmt.Sprintf("0 %d snapshot-merge o c P 8", sectors))
			mr.waitMerged()
			if got := c.mustRead("base", 0, c.size); !bytes.Equal(got, view) {
				t.Errorf("after a crash in the merge: %s", hexdiff(got, view))
			}
		})
	}
}
