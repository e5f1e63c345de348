package stacktest

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
)

// Rule is one fault of a FaultDevice, in the manner of an error-injecting
// file system: which I/O it matches, when it fires, and what it does then.
//
// An I/O matches when its operation is in Ops and its byte range overlaps
// [Off, Off+Len) (Len 0: any range; a flush has no range and matches any).
// The first After matching I/Os pass untouched; the rule then fires on
// every matching I/O, or on the next Times of them when Times is above 0.
// When it fires, Hook runs, then the I/O is held while Hold is set (see
// Fault.Held), then it fails with Err, or, when Err is nil, goes on to the
// device below. Rules fire in the order they were injected; the first one
// whose Err is set ends the I/O.
type Rule struct {
	Ops      ioop.Set
	Off, Len int64
	After    int64
	Times    int64
	Hook     func(ctx context.Context, op ioop.Op, off, n int64)
	Hold     bool
	Err      error
}

// Held is one I/O a Hold rule holds: what it is, and Release, which lets it
// go on (to Err or the device below).
type Held struct {
	Op       ioop.Op
	Off, Len int64
	release  chan struct{}
	once     sync.Once
}

// Release lets the held I/O go on. Releasing twice does nothing.
func (h *Held) Release() { h.once.Do(func() { close(h.release) }) }

// Fault is a rule injected into a FaultDevice.
type Fault struct {
	r       Rule
	d       *FaultDevice
	matched atomic.Int64 // matching I/Os seen
	fired   atomic.Int64
	held    chan *Held
	mu      sync.Mutex
	waiting []*Held // held and not yet released
	removed bool
}

// Fired returns how many I/Os the rule has fired on.
func (f *Fault) Fired() int64 { return f.fired.Load() }

// Held returns the channel on which a Hold rule delivers each I/O it holds,
// in the order they arrive; the I/O waits until its Release. At most 1024
// held I/Os wait there unread before the next one blocks in the delivery.
func (f *Fault) Held() <-chan *Held { return f.held }

// Remove takes the rule out of its device and releases every I/O it holds.
func (f *Fault) Remove() {
	f.d.mu.Lock()
	rules := make([]*Fault, 0, len(*f.d.rules.Load()))
	for _, g := range *f.d.rules.Load() {
		if g != f {
			rules = append(rules, g)
		}
	}
	f.d.rules.Store(&rules)
	f.d.mu.Unlock()
	f.mu.Lock()
	f.removed = true
	waiting := f.waiting
	f.waiting = nil
	f.mu.Unlock()
	for _, h := range waiting {
		h.Release()
	}
}

// match reports whether the rule fires on an I/O of op over [off, off+n).
func (f *Fault) match(op ioop.Op, off, n int64) bool {
	r := &f.r
	if !r.Ops.Has(op) {
		return false
	}
	if r.Len > 0 && op != ioop.Flush && (off+n <= r.Off || off >= r.Off+r.Len) {
		return false
	}
	if f.matched.Add(1) <= r.After {
		return false
	}
	if r.Times > 0 && f.fired.Add(1) > r.Times {
		f.fired.Add(-1)
		return false
	}
	if r.Times <= 0 {
		f.fired.Add(1)
	}
	return true
}

// hold holds the I/O until it is released or the rule removed.
func (f *Fault) hold(op ioop.Op, off, n int64) {
	h := &Held{Op: op, Off: off, Len: n, release: make(chan struct{})}
	f.mu.Lock()
	if f.removed {
		f.mu.Unlock()
		return
	}
	f.waiting = append(f.waiting, h)
	f.mu.Unlock()
	f.held <- h
	<-h.release
	f.mu.Lock()
	for i, w := range f.waiting {
		if w == h {
			f.waiting = append(f.waiting[:i], f.waiting[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
}

// FaultDevice wraps a stack.BlockDevice and injects faults by rules
// (Inject): it fails reads, writes, flushes, discards and write-zeroes on
// ranges or after a number of them with an error of the test's choice,
// runs hooks inside them, holds them until the test releases them, and
// counts every I/O that reaches it (Count). It prints as its device's name
// (or another, NewNamedFaultDevice), has its size and passes on its limits (stack.LimitsOf). It is the one
// fault-injecting device of the tests of dmfuse's targets.
type FaultDevice struct {
	dev    stack.BlockDevice
	name   string
	mu     sync.Mutex // serialises changes of rules
	rules  atomic.Pointer[[]*Fault]
	counts [ioop.NumOps]atomic.Int64
	limits atomic.Pointer[stack.Limits]
}

var (
	_ stack.BlockDevice = (*FaultDevice)(nil)
	_ stack.Limiter     = (*FaultDevice)(nil)
)

// NewFaultDevice returns a FaultDevice over dev with no rules: every I/O
// goes to dev unchanged.
func NewFaultDevice(dev stack.BlockDevice) *FaultDevice {
	return NewNamedFaultDevice(dev.Name(), dev)
}

// NewNamedFaultDevice returns a FaultDevice over dev that prints as name:
// two of them over one device are two paths to the same storage.
func NewNamedFaultDevice(name string, dev stack.BlockDevice) *FaultDevice {
	d := &FaultDevice{dev: dev, name: name}
	d.rules.Store(&[]*Fault{})
	return d
}

// NewMemFaultDevice returns a FaultDevice over a new memory device, and
// that device.
func NewMemFaultDevice(name string, size int64) (*FaultDevice, *MemDevice) {
	m := NewMemDevice(name, size)
	return NewFaultDevice(m), m
}

// Inject adds a rule, after those already there, and returns it.
func (d *FaultDevice) Inject(r Rule) *Fault {
	f := &Fault{r: r, d: d, held: make(chan *Held, 1024)}
	d.mu.Lock()
	rules := append(append([]*Fault{}, *d.rules.Load()...), f)
	d.rules.Store(&rules)
	d.mu.Unlock()
	return f
}

// Fail injects a rule that fails every I/O of ops with err (a shorthand
// for Inject(Rule{Ops: ops, Err: err})).
func (d *FaultDevice) Fail(ops ioop.Set, err error) *Fault {
	return d.Inject(Rule{Ops: ops, Err: err})
}

// Clear removes every rule, releasing the I/Os they hold.
func (d *FaultDevice) Clear() {
	for _, f := range *d.rules.Load() {
		f.Remove()
	}
}

// Count returns how many I/Os of ops have reached the device, failed ones
// included.
func (d *FaultDevice) Count(ops ioop.Set) int64 {
	var n int64
	for op := range ioop.NumOps {
		if ops.Has(op) {
			n += d.counts[op].Load()
		}
	}
	return n
}

// Device returns the device below.
func (d *FaultDevice) Device() stack.BlockDevice { return d.dev }

// enter counts an I/O and applies the rules; it returns the error to fail
// it with.
func (d *FaultDevice) enter(ctx context.Context, op ioop.Op, off, n int64) error {
	d.counts[op].Add(1)
	for _, f := range *d.rules.Load() {
		if !f.match(op, off, n) {
			continue
		}
		if f.r.Hook != nil {
			f.r.Hook(ctx, op, off, n)
		}
		if f.r.Hold {
			f.hold(op, off, n)
		}
		if f.r.Err != nil {
			return f.r.Err
		}
	}
	return nil
}

// ReadAt implements stack.BlockDevice.
func (d *FaultDevice) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := d.enter(ctx, ioop.Read, off, int64(len(p))); err != nil {
		return 0, err
	}
	return d.dev.ReadAt(ctx, p, off)
}

// WriteAt implements stack.BlockDevice.
func (d *FaultDevice) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := d.enter(ctx, ioop.Write, off, int64(len(p))); err != nil {
		return 0, err
	}
	return d.dev.WriteAt(ctx, p, off)
}

// Flush implements stack.BlockDevice.
func (d *FaultDevice) Flush(ctx context.Context) error {
	if err := d.enter(ctx, ioop.Flush, 0, 0); err != nil {
		return err
	}
	return d.dev.Flush(ctx)
}

// Discard implements stack.BlockDevice.
func (d *FaultDevice) Discard(ctx context.Context, off, n int64) error {
	if err := d.enter(ctx, ioop.Discard, off, n); err != nil {
		return err
	}
	return d.dev.Discard(ctx, off, n)
}

// WriteZeroes implements stack.BlockDevice.
func (d *FaultDevice) WriteZeroes(ctx context.Context, off, n int64) error {
	if err := d.enter(ctx, ioop.Zeroes, off, n); err != nil {
		return err
	}
	return d.dev.WriteZeroes(ctx, off, n)
}

// Size implements stack.BlockDevice: the size of the device below.
func (d *FaultDevice) Size() int64 { return d.dev.Size() }

// Name implements stack.BlockDevice: the name of the device below, or the
// one NewNamedFaultDevice gave.
func (d *FaultDevice) Name() string { return d.name }

// Limits implements stack.Limiter: the limits of the device below, or
// those SetLimits gave.
func (d *FaultDevice) Limits() stack.Limits {
	if l := d.limits.Load(); l != nil {
		return *l
	}
	return stack.LimitsOf(d.dev)
}

// SetLimits makes the device report l as its limits, as a block device
// whose queue limits refuse discards or write-zeroes does; the operations
// still reach the device below if a target sends them.
func (d *FaultDevice) SetLimits(l stack.Limits) { d.limits.Store(&l) }
