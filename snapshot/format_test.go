package snapshot

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestTables: table and status lines, and the constructor's refusals, as
// the kernel's (golden).
func TestTables(t *testing.T) {
	reg, err := stack.NewRegistry(Type, OriginType, MergeType)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.CheckTables(t, reg, "testdata")
}

// TestFreshStore is the worked example: a P 8 table over a zeroed COW
// writes the header and zeroes area 0 at load, before any resume; one
// origin write to sector 40 (chunk 5) is copied to data chunk 2 and
// recorded as entry 0 of area 0.
func TestFreshStore(t *testing.T) {
	r := newRig(t)
	orig := r.memDev("o", 1<<20)
	cow := r.memDev("c", 1<<20)
	cow.WriteAt(bgCtx, bytes.Repeat([]byte{0xff}, 16), 0x1000) // area 0 must be zeroed
	old := fill(1, 1<<20)
	if _, err := orig.WriteAt(bgCtx, old, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.mgr.Load(mustCreateEmpty(r, "s"), "0 2048 snapshot o c P 8", ""); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 8192)
	copy(want, []byte{0x53, 0x6e, 0x41, 0x70, 1, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0})
	if got := memBytes(t, cow)[:8192]; !bytes.Equal(got, want) {
		t.Fatalf("after load, before resume: %s", hexdiff(got, want))
	}
	if err := r.mgr.Resume("s", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	r.create("base", "0 2048 snapshot-origin o")
	if got := r.status("s"); got != "0 2048 snapshot 16/2048 16" {
		t.Errorf("fresh status %q", got)
	}
	r.mustWrite("base", []byte("new"), 40*512)
	c := memBytes(t, cow)
	entry := make([]byte, 32)
	binary.LittleEndian.PutUint64(entry[0:], 5)
	binary.LittleEndian.PutUint64(entry[8:], 2)
	if !bytes.Equal(c[0x1000:0x1020], entry) {
		t.Errorf("area 0: %x", c[0x1000:0x1020])
	}
	if !bytes.Equal(c[0x2000:0x3000], old[0x5000:0x6000]) {
		t.Error("data chunk 2 is not origin chunk 5 as it was")
	}
	if got := r.status("s"); got != "0 2048 snapshot 24/2048 16" {
		t.Errorf("status after one exception %q", got)
	}
	if got := r.mustRead("s", 0, 1<<20); !bytes.Equal(got, old) {
		t.Error("the snapshot does not read the origin as it was")
	}
	if got := r.mustRead("base", 40*512, 3); string(got) != "new" {
		t.Errorf("origin reads %q", got)
	}
}

// TestKernelStores: COW devices laid out as the kernel writes them, with
// 0, 1, E-1, E, E+1 and 3E exceptions, load with their exceptions, report
// the kernel's usage and read their chunks; ReadStore reads them the same.
func TestKernelStores(t *testing.T) {
	const cs, e = 8, 256
	for _, n := range []int{0, 1, e - 1, e, e + 1, 3 * e} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := newRig(t)
			r.memDev("o", 8<<20)
			olds := make([]uint64, n)
			data := make([][]byte, n)
			for i := range olds {
				olds[i] = uint64(n - i) // descending: no runs
				data[i] = fill(uint64(i+10), 4096)
			}
			size := int64(4<<20) + 4096
			img := kernelCOW(cs, size, olds, data)
			cow := r.memDev("c", size)
			cow.WriteAt(bgCtx, img, 0)
			st, err := ReadStore(bytes.NewReader(img), size)
			if err != nil || len(st.Exceptions) != n || st.Chunk != cs || !st.Valid {
				t.Fatalf("ReadStore: %+v, %v", st, err)
			}
			r.create("s", "0 16384 snapshot o c P 8")
			// next_free is past the last data chunk (and its area when it
			// is the next chunk); current_area the last area read.
			area := uint64(n) / e
			next := uint64(2)
			if n > 0 {
				next = st.Exceptions[n-1].New + 1
			}
			if next%(e+1) == 1 {
				next++
			}
			want := fmt.Sprintf("0 16384 snapshot %d/%d %d", next*cs, size/512, (area+2)*cs)
			if got := r.status("s"); got != want {
				t.Errorf("status %q, want %q", got, want)
			}
			for i, old := range olds {
				if got := r.mustRead("s", int64(old)*4096, 4096); !bytes.Equal(got, data[i]) {
					t.Fatalf("chunk %d does not read from its exception", old)
				}
			}
		})
	}
}

// TestBadHeaders: a bad magic fails with ENXIO, version 2 with EINVAL; an
// invalid header loads as Invalid and fails reads; an on-disk chunk size
// overrides the table's.
func TestBadHeaders(t *testing.T) {
	for _, tc := range []struct {
		name  string
		patch func(b []byte)
		errno syscall.Errno
		want  string
	}{
		{"bad magic", func(b []byte) { b[0] = 'X' }, syscall.ENXIO, ""},
		{"version 2", func(b []byte) { b[8] = 2 }, syscall.EINVAL, ""},
		{"chunk 3 on disk", func(b []byte) { b[12] = 3 }, syscall.EINVAL, ""},
		{"invalid", func(b []byte) { b[4] = 0 }, 0, "Invalid"},
		{"chunk 16 on disk", func(b []byte) { b[12] = 16 }, 0, "P 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.memDev("o", 1<<20)
			img := kernelCOW(8, 1<<20, nil, nil)
			tc.patch(img)
			c := r.memDev("c", 1<<20)
			c.WriteAt(bgCtx, img, 0)
			_, err := r.mgr.Create(stack.CreateOptions{Name: "s", Minor: -1, Table: "0 2048 snapshot o c P 8"})
			if tc.errno != 0 {
				if !isErrno(err, tc.errno) || !strings.Contains(err.Error(), "Failed to read snapshot metadata") {
					t.Fatalf("load: %v, want %v", err, tc.errno)
				}
				if got := memBytes(t, c); !bytes.Equal(got, img) {
					t.Errorf("a refused COW was written: %s", hexdiff(got, img))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(r.status("s")+" "+r.table("s"), tc.want) {
				t.Errorf("status %q table %q, want %q", r.status("s"), r.table("s"), tc.want)
			}
			if tc.want == "Invalid" {
				if _, err := r.read("s", 0, 512); !isErrno(err, syscall.EIO) {
					t.Errorf("read of an invalid snapshot: %v", err)
				}
				if err := r.dev("s").Flush(bgCtx); err != nil {
					t.Errorf("an empty flush of an invalid snapshot: %v", err)
				}
			}
		})
	}
}

// TestTerminatorArea: the commit of the last exception an area holds
// zeroes the next area first, so a COW that ends right after the area's
// last data chunk invalidates the snapshot at that exception (E+2 chunks),
// and one more chunk holds it (E+3).
func TestTerminatorArea(t *testing.T) {
	const e = 256
	for _, tc := range []struct {
		chunks int64
		valid  bool
	}{{e + 2, false}, {e + 3, true}} {
		t.Run(fmt.Sprint(tc.chunks), func(t *testing.T) {
			r := newRig(t)
			r.memDev("o", 4<<20)
			r.memDev("c", tc.chunks*4096)
			r.create("s", "0 8192 snapshot o c P 8")
			r.create("base", "0 8192 snapshot-origin o")
			for i := int64(0); i < e; i++ {
				r.mustWrite("base", []byte{1}, i*4096)
			}
			if got := r.status("s") == "0 8192 snapshot Invalid"; got == tc.valid {
				t.Errorf("%d chunks: status %q", tc.chunks, r.status("s"))
			}
		})
	}
}

// TestStoreOnDiskAfterWrites: after writes to the origin and the snapshot
// across two areas, ReadStore finds every exception in allocation order,
// each pointing at the next data chunk, areas skipped, and the area after
// a full one zeroed.
func TestStoreOnDiskAfterWrites(t *testing.T) {
	const e = 256
	r := newRig(t)
	r.memDev("o", 4<<20)
	cow := r.memDev("c", 4<<20)
	r.create("s", "0 8192 snapshot o c P 8")
	r.create("base", "0 8192 snapshot-origin o")
	var olds []uint64
	for i := uint64(0); i < e+10; i++ {
		c := (i * 7) % 1024
		olds = append(olds, c)
		if i%2 == 0 {
			r.mustWrite("base", []byte{2}, int64(c)*4096+100)
		} else {
			r.mustWrite("s", []byte{3}, int64(c)*4096+100)
		}
	}
	img := memBytes(t, cow)
	st, err := ReadStore(bytes.NewReader(img), int64(len(img)))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Exceptions) != len(olds) {
		t.Fatalf("%d exceptions on disk, want %d", len(st.Exceptions), len(olds))
	}
	for i, x := range st.Exceptions {
		area, j := uint64(i)/e, uint64(i)%e
		if x.Old != olds[i] || x.New != areaLocation(e, area)+1+j {
			t.Fatalf("entry %d: %+v, want %d -> %d", i, x, olds[i], areaLocation(e, area)+1+j)
		}
	}
	if got := r.status("s"); got != fmt.Sprintf("0 8192 snapshot %d/8192 24", (2+e+1+10)*8) {
		t.Errorf("status %q", got)
	}
	want := kernelCOW(8, int64(len(img)), olds, nil)
	// Data chunks aside, the image is the kernel's.
	for i := range olds {
		area, j := uint64(i)/e, uint64(i)%e
		nw := int64(areaLocation(e, area) + 1 + j)
		copy(want[nw*4096:(nw+1)*4096], img[nw*4096:])
	}
	if d := hexdiff(img, want); d != "" {
		t.Errorf("COW image: %s", d)
	}
}

func mustCreateEmpty(r *rig, name string) string {
	r.t.Helper()
	if _, err := r.mgr.Create(stack.CreateOptions{Name: name, Minor: -1, NoTable: true}); err != nil {
		r.t.Fatal(err)
	}
	return name
}
