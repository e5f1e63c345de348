package thin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
	"github.com/dmfuse/dmfuse/thin/metadata"
)

// rig is a Manager with the thin types over memStores, memory devices by
// name, and a manual clock.
type rig struct {
	t      testing.TB
	mgr    *stack.Manager
	clock  *clock.Manual
	mu     sync.Mutex
	mems   map[string]*stacktest.MemDevice
	stores []*memStore
}

func newRig(t testing.TB) *rig {
	r := &rig{t: t, clock: &clock.Manual{}, mems: map[string]*stacktest.MemDevice{}}
	r.clock.Set(1e9)
	pt, tt := NewTypes(func(d metadata.Device, o metadata.Options) (metadata.Store, error) {
		s, err := openMemStore(d, o)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.stores = append(r.stores, s)
		r.mu.Unlock()
		return s, nil
	})
	reg, err := stack.NewRegistry(pt, tt, stack.Linear)
	if err != nil {
		t.Fatal(err)
	}
	r.mgr = stack.NewManager(stack.ManagerOptions{Registry: reg, Context: context.Background(), Clock: r.clock, Open: r.open})
	t.Cleanup(func() { r.mgr.RemoveAll(stack.Flags{}) })
	return r
}

// open resolves the table arguments that name no device of the manager
// (the manager resolves its own): memory devices.
func (r *rig) open(arg string) (stack.BlockDevice, error) {
	r.mu.Lock()
	m := r.mems[arg]
	r.mu.Unlock()
	if m != nil {
		return m, nil
	}
	return nil, stack.Errorf("Device lookup failed: %s: no such mapped device", arg)
}

// mem adds a memory device.
func (r *rig) mem(name string, size int64) *stacktest.MemDevice {
	m := stacktest.NewMemDevice(name, size)
	r.mu.Lock()
	r.mems[name] = m
	r.mu.Unlock()
	return m
}

// store returns the last store opened.
func (r *rig) store() *memStore {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stores[len(r.stores)-1]
}

func (r *rig) create(name, table string) *stack.Device {
	r.t.Helper()
	d, err := r.mgr.Create(stack.CreateOptions{Name: name, Minor: -1, Table: table})
	if err != nil {
		r.t.Fatalf("create %s %q: %v", name, table, err)
	}
	return d
}

func (r *rig) createErr(name, table string) error {
	_, err := r.mgr.Create(stack.CreateOptions{Name: name, Minor: -1, Table: table})
	return err
}

func (r *rig) msg(dev string, words ...string) error {
	_, err := r.mgr.Message(context.Background(), dev, 0, words)
	return err
}

func (r *rig) mustMsg(dev string, words ...string) {
	r.t.Helper()
	if err := r.msg(dev, words...); err != nil {
		r.t.Fatalf("message %s %q: %v", dev, words, err)
	}
}

func (r *rig) status(d *stack.Device) string {
	return strings.TrimSuffix(d.FormatTable(stack.StatusInfo, false), "\n")
}

func (r *rig) table(d *stack.Device) string {
	return strings.TrimSuffix(d.FormatTable(stack.StatusTable, false), "\n")
}

// pool makes a memory device meta (4 MiB), a linear device data of
// blocks of 64 KiB over memory device databack (64 blocks), and a pool
// device "pool" over them.
func (r *rig) pool(blocks int64, lowWater int, features string) *stack.Device {
	r.mem("meta", 4<<20)
	r.mem("databack", 64*65536)
	r.create("data", fmt.Sprintf("0 %d linear databack 0", blocks*128))
	return r.create("pool", fmt.Sprintf("0 %d thin-pool meta data 128 %d %s", blocks*128, lowWater, features))
}

// grow reloads data and pool with blocks blocks.
func (r *rig) grow(blocks int64, lowWater int, features string) error {
	r.t.Helper()
	if err := r.mgr.Load("data", fmt.Sprintf("0 %d linear databack 0", blocks*128), ""); err != nil {
		r.t.Fatal(err)
	}
	if err := r.mgr.Resume("data", stack.Flags{}); err != nil {
		r.t.Fatal(err)
	}
	if err := r.mgr.Load("pool", fmt.Sprintf("0 %d thin-pool meta data 128 %d %s", blocks*128, lowWater, features), ""); err != nil {
		r.t.Fatal(err)
	}
	return r.mgr.Resume("pool", stack.Flags{})
}

// thin creates thin device id and a device for it of size bytes.
func (r *rig) thin(name string, id int, size int64) *stack.Device {
	r.t.Helper()
	if err := r.msg("pool", "create_thin", fmt.Sprint(id)); err != nil && !errors.Is(err, syscall.EEXIST) {
		r.t.Fatal(err)
	}
	return r.create(name, fmt.Sprintf("0 %d thin pool %d", size/512, id))
}

func write(t *testing.T, d *stack.Device, b []byte, off int64) {
	t.Helper()
	if n, err := d.WriteAt(context.Background(), b, off); err != nil || n != len(b) {
		t.Fatalf("write %d bytes at %d: %d, %v", len(b), off, n, err)
	}
}

func read(t *testing.T, d *stack.Device, n int, off int64) []byte {
	t.Helper()
	b := make([]byte, n)
	if m, err := d.ReadAt(context.Background(), b, off); err != nil || m != n {
		t.Fatalf("read %d bytes at %d: %d, %v", n, off, m, err)
	}
	return b
}

func fill(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }

// errnoIs checks that err carries errno e.
func errnoIs(t *testing.T, what string, err error, e syscall.Errno) {
	t.Helper()
	if !errors.Is(err, e) {
		t.Errorf("%s: %v, want %v", what, err, e)
	}
}
