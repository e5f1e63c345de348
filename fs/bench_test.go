package fs

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
)

const benchSectors = 32768 // 16 MiB

// benchNode returns the file node of a device with table text (which may
// name "FILE", a 16 MiB backing file on tmpfs when there is one) as the FUSE
// bridge calls it.
func benchNode(b *testing.B, table string) *devNode {
	b.Helper()
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = b.TempDir()
	}
	f, err := os.CreateTemp(dir, "dmfuse-bench-*.img")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.Remove(f.Name()) })
	if err := f.Truncate(benchSectors * 512); err != nil {
		b.Fatal(err)
	}
	// Pages, not holes: a hole reads without touching memory.
	if _, err := f.WriteAt(make([]byte, benchSectors*512), 0); err != nil {
		b.Fatal(err)
	}
	f.Close()
	reg, err := stack.NewRegistry(stack.Linear, stack.Striped, stack.Zero)
	if err != nil {
		b.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Clock: clock.System})
	b.Cleanup(func() { m.Close() })
	text := fmt.Sprintf(table, benchSectors, f.Name())
	d, err := m.Create(stack.CreateOptions{Name: "bench", Minor: -1, Table: text})
	if err != nil {
		b.Fatal(err)
	}
	return &devNode{dev: d, root: &root{mgr: m}}
}

// BenchmarkDevNode measures a 4 KiB read or write through a device file's
// Read and Write, from the node down to the backing file, as each FUSE
// request goroutine runs it (the FUSE transport itself is not included).
func BenchmarkDevNode(b *testing.B) {
	for _, tc := range []struct{ name, table string }{
		{"zero", "0 %d zero %.0s"},
		{"linear", "0 %d linear %s 0"},
	} {
		for _, write := range []bool{false, true} {
			op := "read"
			if write {
				op = "write"
			}
			b.Run(tc.name+"/"+op, func(b *testing.B) {
				n := benchNode(b, tc.table)
				b.ReportAllocs()
				b.SetBytes(4096)
				bufs := make(chan []byte, runtime.GOMAXPROCS(0))
				for range cap(bufs) {
					bufs <- make([]byte, 4096)
				}
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := &fuse.Context{}
					buf := <-bufs
					for i := int64(13); pb.Next(); i += 7919 {
						off := (i % (benchSectors / 8)) * 4096
						if write {
							if _, errno := n.Write(ctx, nil, buf, off); errno != 0 {
								b.Error(errno)
								return
							}
							continue
						}
						res, errno := n.Read(ctx, nil, buf, off)
						if errno != 0 {
							b.Error(errno)
							return
						}
						// What go-fuse does with the result before replying.
						if _, st := res.Bytes(nil); st != fuse.OK {
							b.Error(st)
							return
						}
						res.Done()
					}
				})
			})
		}
	}
}
