package snapshot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// rig is a Manager with the snapshot types and linear, zero and error over
// memory devices by name.
type rig struct {
	t    testing.TB
	mgr  *stack.Manager
	mu   sync.Mutex
	mems map[string]stack.BlockDevice
	mem  int64 // what the targets accounted (Ctor.Memory)
}

func newRig(t testing.TB, extra ...*stack.TargetType) *rig {
	r := &rig{t: t, mems: map[string]stack.BlockDevice{}}
	clk := &clock.Manual{}
	clk.Set(1e9)
	reg, err := stack.NewRegistry(append([]*stack.TargetType{Type, OriginType, MergeType, stack.Linear, stack.Zero, stack.Error}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.mgr = stack.NewManager(stack.ManagerOptions{Registry: reg, Context: context.Background(), Clock: clk, Major: 240,
		Open: r.open, Memory: func(n int64) { r.mu.Lock(); r.mem += n; r.mu.Unlock() }})
	t.Cleanup(func() { r.mgr.Close() })
	return r
}

func (r *rig) open(arg string) (stack.BlockDevice, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := r.mems[arg]; d != nil {
		return d, nil
	}
	return stacktest.Opener{}.Open(arg)
}

// memDev adds a memory device of size bytes called name.
func (r *rig) memDev(name string, size int64) *stacktest.MemDevice {
	m := stacktest.NewMemDevice(name, size)
	r.add(name, m)
	return m
}

func (r *rig) add(name string, d stack.BlockDevice) {
	r.mu.Lock()
	r.mems[name] = d
	r.mu.Unlock()
}

func (r *rig) create(name, table string) *stack.Device {
	r.t.Helper()
	d, err := r.mgr.Create(stack.CreateOptions{Name: name, Minor: -1, Table: table})
	if err != nil {
		r.t.Fatalf("create %s %q: %v", name, table, err)
	}
	return d
}

// reload loads table into name and resumes it.
func (r *rig) reload(name, table string) error {
	if err := r.mgr.Load(name, table, ""); err != nil {
		return err
	}
	return r.mgr.Resume(name, stack.Flags{})
}

func (r *rig) mustReload(name, table string) {
	r.t.Helper()
	if err := r.reload(name, table); err != nil {
		r.t.Fatalf("reload %s %q: %v", name, table, err)
	}
}

func (r *rig) dev(name string) *stack.Device {
	r.t.Helper()
	d := r.mgr.Lookup(name)
	if d == nil {
		r.t.Fatalf("no device %s", name)
	}
	return d
}

func (r *rig) status(name string) string {
	r.t.Helper()
	return strings.TrimSpace(r.dev(name).FormatTable(stack.StatusInfo, false))
}

func (r *rig) table(name string) string {
	r.t.Helper()
	return strings.TrimSpace(r.dev(name).FormatTable(stack.StatusTable, false))
}

func (r *rig) write(name string, p []byte, off int64) error {
	_, err := r.dev(name).WriteAt(context.Background(), p, off)
	return err
}

func (r *rig) mustWrite(name string, p []byte, off int64) {
	r.t.Helper()
	if err := r.write(name, p, off); err != nil {
		r.t.Fatalf("write %s at %d: %v", name, off, err)
	}
}

func (r *rig) read(name string, off, n int64) ([]byte, error) {
	p := make([]byte, n)
	_, err := r.dev(name).ReadAt(context.Background(), p, off)
	return p, err
}

func (r *rig) mustRead(name string, off, n int64) []byte {
	r.t.Helper()
	p, err := r.read(name, off, n)
	if err != nil {
		r.t.Fatalf("read %s at %d: %v", name, off, err)
	}
	return p
}

// fill returns n bytes of a pattern of seed.
func fill(seed uint64, n int) []byte {
	p := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

// memBytes returns a copy of a memory device's bytes.
func memBytes(t testing.TB, d stack.BlockDevice) []byte {
	t.Helper()
	p := make([]byte, d.Size())
	if _, err := d.ReadAt(context.Background(), p, 0); err != nil {
		t.Fatal(err)
	}
	return p
}

// kernelCOW lays out a persistent store as the kernel writes it, chunk cs
// sectors, of size bytes: a valid header, then the exceptions olds[i] ->
// the i-th data chunk, areas in place and the area after the last full
// one zeroed; data[i] is written to the i-th data chunk when given.
func kernelCOW(cs uint32, size int64, olds []uint64, data [][]byte) []byte {
	cb := int64(cs) * stack.SectorSize
	e := uint64(cb / entrySize)
	b := make([]byte, size)
	le := binary.LittleEndian
	le.PutUint32(b[0:], Magic)
	le.PutUint32(b[4:], 1)
	le.PutUint32(b[8:], DiskVersion)
	le.PutUint32(b[12:], cs)
	for i, old := range olds {
		area, j := uint64(i)/e, uint64(i)%e
		nw := areaLocation(e, area) + 1 + j
		at := int64(areaLocation(e, area))*cb + int64(j)*entrySize
		le.PutUint64(b[at:], old)
		le.PutUint64(b[at+8:], nw)
		if i < len(data) && data[i] != nil {
			copy(b[int64(nw)*cb:], data[i])
		}
	}
	return b
}

func isErrno(err error, e syscall.Errno) bool { return errors.Is(err, e) }

func hexdiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			lo := i &^ 15
			return fmt.Sprintf("first difference at %#x:\n got %x\nwant %x", i, a[lo:min(lo+32, len(a))], b[lo:min(lo+32, len(b))])
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("lengths %d and %d", len(a), len(b))
	}
	return ""
}

var bgCtx = context.Background()
