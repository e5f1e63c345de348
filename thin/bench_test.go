package thin

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// benchDevs makes, over memory devices and the on-disk metadata format, a
// linear device and a thin device of the same size (64 MiB, 64 KiB
// blocks), the thin device fully provisioned unless empty is set.
func benchDevs(b testing.TB, empty bool, features string) (lin, th *stack.Device) {
	const size = 64 << 20
	mems := stacktest.Opener{
		"meta": stacktest.NewMemDevice("meta", 16<<20), "data": stacktest.NewMemDevice("data", size),
		"plain": stacktest.NewMemDevice("plain", size),
	}
	m := benchManager(b, mems, "data", "plain")
	mk := func(name, table string) *stack.Device {
		d, err := m.Create(stack.CreateOptions{Name: name, Minor: -1, Table: table})
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	lin = mk("lin", fmt.Sprintf("0 %d linear plain 0", size/512))
	mk("pool", fmt.Sprintf("0 %d thin-pool meta data 128 0 %s", size/512, features))
	if _, err := m.Message(context.Background(), "pool", 0, []string{"create_thin", "1"}); err != nil {
		b.Fatal(err)
	}
	th = mk("thin", fmt.Sprintf("0 %d thin pool 1", size/512))
	if !empty {
		writeAll(b, th, size)
	}
	return lin, th
}

// benchManager returns a Manager with the thin types and linear over the
// on-disk metadata format, whose tables open mapped devices, then mems;
// every page of the memory devices named in touch is touched first, so
// that the runs measure no page faults.
func benchManager(tb testing.TB, mems stacktest.Opener, touch ...string) *stack.Manager {
	reg, err := stack.NewRegistry(PoolType, Type, stack.Linear)
	if err != nil {
		tb.Fatal(err)
	}
	for _, name := range touch {
		b := mems[name].(*stacktest.MemDevice).Bytes()
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Context: context.Background(), Clock: &clock.Manual{}, Open: mems.Open})
	tb.Cleanup(func() { m.RemoveAll(stack.Flags{}) })
	return m
}

// writeAll writes the first size bytes of d, 1 MiB at a time.
func writeAll(tb testing.TB, d *stack.Device, size int64) {
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := d.WriteAt(context.Background(), buf, off); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkIO: 4 KiB random reads and writes from 32 goroutines on a
// fully provisioned thin device and on a linear device over the same
// kind of memory device; first writes to an empty thin device (one per
// 64 KiB block), with and without skip_block_zeroing.
func BenchmarkIO(b *testing.B) {
	const size = 64 << 20
	for _, tc := range []struct {
		name     string
		write    bool
		empty    bool
		features string
	}{
		{"randread", false, false, ""}, {"randwrite", true, false, ""},
		{"firstwrite", true, true, ""}, {"firstwrite-skipzero", true, true, "1 skip_block_zeroing"},
	} {
		for _, dev := range []string{"linear", "thin"} {
			if tc.empty && dev == "linear" {
				continue
			}
			b.Run(tc.name+"/"+dev, func(b *testing.B) {
				lin, th := benchDevs(b, tc.empty, tc.features)
				d := th
				if dev == "linear" {
					d = lin
				}
				b.SetBytes(4096)
				b.SetParallelism(16)
				b.ResetTimer()
				var next atomic.Int64
				b.RunParallel(func(pb *testing.PB) {
					buf := make([]byte, 4096)
					r := rand.New(rand.NewPCG(rand.Uint64(), 1))
					for pb.Next() {
						off := r.Int64N(size/4096) * 4096
						if tc.empty {
							off = (next.Add(1) % (size / 65536)) * 65536
						}
						var err error
						if tc.write {
							_, err = d.WriteAt(context.Background(), buf, off)
						} else {
							_, err = d.ReadAt(context.Background(), buf, off)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkProvision: first writes, 4 KiB at the start of a 64 KiB block,
// from 32 goroutines, each provisioning its block: on new volumes of a
// pool that zeroes the rest of new blocks and of one with
// skip_block_zeroing, and on a provisioned volume after a snapshot of it
// (each write copying its shared block first). Each round writes every
// block of a fresh 64 MiB volume or snapshot once; setting it up and
// deleting it afterwards is not timed.
func BenchmarkProvision(b *testing.B) {
	const (
		size   = 64 << 20
		blocks = size / 65536
	)
	for _, tc := range []struct {
		name, features string
		snap           bool
	}{
		{"zeroing", "", false}, {"skip_block_zeroing", "1 skip_block_zeroing", false}, {"breaking_sharing", "", true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			m, th := provisionRig(b, size, tc.features, tc.snap)
			ctx := context.Background()
			msg := func(args ...string) {
				if _, err := m.Message(ctx, "pool", 0, args); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(4096)
			b.ResetTimer()
			b.StopTimer()
			for round, done := 2, 0; done < b.N; round++ {
				n := min(b.N-done, blocks)
				id := strconv.Itoa(round)
				d := th
				if tc.snap {
					if err := m.Suspend("thin", stack.Flags{}); err != nil {
						b.Fatal(err)
					}
					msg("create_snap", id, "1")
					if err := m.Resume("thin", stack.Flags{}); err != nil {
						b.Fatal(err)
					}
				} else {
					msg("create_thin", id)
					var err error
					d, err = m.Create(stack.CreateOptions{Name: "new", Minor: -1, Table: fmt.Sprintf("0 %d thin pool %s", size/512, id)})
					if err != nil {
						b.Fatal(err)
					}
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.StartTimer()
				for range 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						buf := make([]byte, 4096)
						for {
							i := next.Add(1) - 1
							if i >= int64(n) {
								return
							}
							if _, err := d.WriteAt(ctx, buf, i*65536); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				if !tc.snap {
					if err := m.Remove("new", stack.Flags{}); err != nil {
						b.Fatal(err)
					}
				}
				msg("delete", id)
				done += n
			}
		})
	}
}

// provisionRig makes, over memory devices and the on-disk metadata
// format, a pool with 64 KiB blocks and room for a volume of size three
// times over, and thin device 1 of size (as "thin"), written once when
// provisioned is set.
func provisionRig(b *testing.B, size int64, features string, provisioned bool) (*stack.Manager, *stack.Device) {
	mems := stacktest.Opener{"meta": stacktest.NewMemDevice("meta", 16<<20), "data": stacktest.NewMemDevice("data", 3*size)}
	m := benchManager(b, mems, "data")
	if _, err := m.Create(stack.CreateOptions{Name: "pool", Minor: -1,
		Table: strings.TrimSpace(fmt.Sprintf("0 %d thin-pool meta data 128 0 %s", 3*size/512, features))}); err != nil {
		b.Fatal(err)
	}
	if _, err := m.Message(context.Background(), "pool", 0, []string{"create_thin", "1"}); err != nil {
		b.Fatal(err)
	}
	th, err := m.Create(stack.CreateOptions{Name: "thin", Minor: -1, Table: fmt.Sprintf("0 %d thin pool 1", size/512)})
	if err != nil {
		b.Fatal(err)
	}
	if provisioned {
		writeAll(b, th, size)
	}
	return m, th
}

// TestIONoAllocs: a read and a write of a provisioned, unshared block
// allocate nothing.
func TestIONoAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("makes 64 MiB devices")
	}
	_, th := benchDevs(t, false, "")
	ctx := context.Background()
	buf := make([]byte, 4096)
	off := int64(0)
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"read", func() error { _, err := th.ReadAt(ctx, buf, off); return err }},
		{"write", func() error { _, err := th.WriteAt(ctx, buf, off); return err }},
	} {
		var err error
		n := testing.AllocsPerRun(200, func() {
			off = (off + 69632) % (64 << 20)
			if e := tc.fn(); e != nil {
				err = e
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if n != 0 {
			t.Errorf("%s of a provisioned block: %.1f allocations, want 0", tc.name, n)
		}
	}
}
