package stack

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

const benchSize = 64 << 20 // bytes of each benchmark device

// benchTables are the devices of the target benchmarks, each over fresh
// memory devices "a" and "b".
var benchTables = []struct{ name, table string }{
	{"zero", "0 131072 zero"},
	{"linear", "0 131072 linear a 0"},
	{"striped", "0 131072 striped 2 128 a 0 b 0"},
}

// benchIO drives 4 KiB (or size) reads or writes at offsets spread over the
// device, one goroutine per P, as the FUSE server's request goroutines do.
func benchIO(b *testing.B, d BlockDevice, write bool, size int) {
	b.ReportAllocs()
	b.SetBytes(int64(size))
	bufs := make(chan []byte, runtime.GOMAXPROCS(0))
	for range cap(bufs) {
		bufs <- make([]byte, size)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		buf := <-bufs
		var off int64
		slots := int64(benchSize / size)
		for i := int64(7); pb.Next(); i += 7919 {
			off = (i % slots) * int64(size)
			var err error
			if write {
				_, err = d.WriteAt(ctx, buf, off)
			} else {
				_, err = d.ReadAt(ctx, buf, off)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func memDevs() map[string]BlockDevice {
	return map[string]BlockDevice{"a": NewMemDevice("a", benchSize), "b": NewMemDevice("b", benchSize)}
}

// BenchmarkTarget measures each basic target's read and write path through a
// Device (gate, table, accounting) over memory devices.
func BenchmarkTarget(b *testing.B) {
	for _, tc := range benchTables {
		for _, size := range []int{4 << 10, 1 << 20} {
			for _, write := range []bool{false, true} {
				op := "read"
				if write {
					op = "write"
				}
				b.Run(fmt.Sprintf("%s/%s/%dk", tc.name, op, size>>10), func(b *testing.B) {
					benchIO(b, liveDevice(b, tc.table, memDevs(), nil), write, size)
				})
			}
		}
	}
}

// BenchmarkStack3 measures a linear device over a linear device over a
// linear device over memory.
func BenchmarkStack3(b *testing.B) {
	for _, write := range []bool{false, true} {
		op := "read"
		if write {
			op = "write"
		}
		b.Run(op, func(b *testing.B) {
			d := liveDevice(b, "0 131072 linear a 0", memDevs(), nil)
			for range 2 {
				d = liveDevice(b, "0 131072 linear a 0", map[string]BlockDevice{"a": d}, nil)
			}
			benchIO(b, d, write, 4<<10)
		})
	}
}

// BenchmarkMemDevice is the floor of the target benchmarks: the memory device
// alone.
func BenchmarkMemDevice(b *testing.B) {
	for _, write := range []bool{false, true} {
		op := "read"
		if write {
			op = "write"
		}
		b.Run(op, func(b *testing.B) { benchIO(b, NewMemDevice("a", benchSize), write, 4<<10) })
	}
}

// BenchmarkTableFind measures the segment lookup of a table of n zero
// targets.
func BenchmarkTableFind(b *testing.B) {
	for _, n := range []int{1, 16, 1024} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			t := zeroTable(b, n, 8)
			b.ReportAllocs()
			size := t.Size()
			var sink int
			for i := 0; b.Loop(); i++ {
				sink += t.find(int64(i*4099*SectorSize) % size)
			}
			_ = sink
		})
	}
}

// BenchmarkTableSplit measures the split of one 1 MiB request over a table
// of 8-sector (4 KiB) zero segments: 256 pieces, each accounted.
func BenchmarkTableSplit(b *testing.B) {
	t := zeroTable(b, 1024, 8)
	disk := stats.NewDisk(nil)
	buf := make([]byte, 1<<20)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := t.rw(ctx, disk, ioop.Read, buf, 4096); err != nil {
			b.Fatal(err)
		}
	}
}

// zeroTable builds a table of n zero segments of sectors each.
func zeroTable(b *testing.B, n, sectors int) *Table {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, "%d %d zero\n", i*sectors, sectors)
	}
	lines, err := ParseTable(sb.String())
	if err != nil {
		b.Fatal(err)
	}
	t, err := Build(lines, BuildOptions{Registry: testRegistry(b), Context: context.Background()})
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// BenchmarkAccount measures the accounting of one piece (start and
// finish), from all Ps at once.
func BenchmarkAccount(b *testing.B) {
	disk := stats.NewDisk(nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			p := newPiece(ctx, disk, ioop.Read)
			p.startAcct()
			p.finish(8*SectorSize, nil)
		}
	})
}

// BenchmarkGate measures entering and leaving the suspend gate from all Ps
// at once.
func BenchmarkGate(b *testing.B) {
	var g gate
	g.init()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i, err := g.enter(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			g.exit(i)
		}
	})
}
