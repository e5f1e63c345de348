package fault

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/stack"
)

// engine is one device's rules, model and stores over the device below:
// what the fault target and the Go API's Device share.
type engine struct {
	dev   stack.BlockDevice
	base  int64 // byte offset on dev
	begin int64 // the sector numbers rules see start here (bytes)
	size  int64 // bytes
	cfg   *config
	q     *delay.Queue
	t0    int64
	self  any // identity in an atlas
	event func()

	rules atomic.Pointer[ruleSet]
	state atomic.Pointer[string]
	ios   atomic.Uint64
	log   *eventLog
	hist  *history
	undo  *undoLog
	ov    overlay
	lat   latent
	atl   *atlas
	repl  map[uint64][]Event

	relMu   sync.Mutex
	release chan struct{} // closed to release stalls
	stalled atomic.Int64  // I/Os in a stall for ever now
}

// ruleSet is the rules in force, swapped whole by messages.
type ruleSet struct {
	rules []*Rule
	stale bool // some rule is stale: writes keep history
	lie   bool // some rule lies on flushes: writes keep an undo log
}

func newRuleSet(rules []*Rule) *ruleSet {
	rs := &ruleSet{rules: rules}
	for _, r := range rules {
		rs.stale = rs.stale || r.Action.kind == actStale
		rs.lie = rs.lie || r.Action.kind == actLie
	}
	return rs
}

func newEngine(cfg *config, dev stack.BlockDevice, base, begin, size int64, q *delay.Queue) *engine {
	e := &engine{dev: dev, base: base, begin: begin, size: size, cfg: cfg, q: q, log: newEventLog(cfg.logN),
		hist: newHistory(cfg.histLim), undo: &undoLog{limit: cfg.histLim}, release: make(chan struct{}), event: func() {}}
	e.ov.limit = cfg.histLim
	e.rules.Store(newRuleSet(cfg.rules))
	one := "1"
	e.state.Store(&one)
	e.t0 = e.now()
	if len(cfg.replay) > 0 {
		e.repl = map[uint64][]Event{}
		for _, ev := range cfg.replay {
			e.repl[ev.Index] = append(e.repl[ev.Index], ev)
		}
	}
	e.self = e
	return e
}

func (e *engine) now() int64 { return e.q.Now() }

// fired is a rule that fires on an I/O, with its draw.
type fired struct {
	r    *Rule
	draw uint64
	n    uint64 // the rule's match number
}

// terminal actions end an I/O: no later rule is looked at.
func terminal(k actKind) bool {
	switch k {
	case actError, actDrop, actPhantom, actMisdirect, actTear, actLie:
		return true
	}
	return false
}

// evaluate returns the rules that fire on one I/O (op o, FUA, sectors [s,
// s+n), bytes, its index and arrival time), in rule order, up to the first
// terminal one.
func (e *engine) evaluate(o Op, fua bool, s, n, bytes int64, idx uint64, now int64, out []fired) []fired {
	rs := e.rules.Load()
	if e.repl != nil {
		for _, ev := range e.repl[idx] {
			for _, r := range rs.rules {
				if r.Name == ev.Rule && r.Action.text == ev.Action {
					out = append(out, fired{r: r, draw: ev.Draw})
					e.fire(r, ev.Draw, o, s, n, idx, now)
				}
			}
		}
		return out
	}
	st := *e.state.Load()
	t := now - e.t0
	for _, r := range rs.rules {
		if !r.ops.has(o, fua) {
			continue
		}
		if r.hi > 0 && (o == OpFlush || s >= r.hi || s+n <= r.lo) {
			continue
		}
		if bytes < r.minSize || r.maxSize > 0 && bytes > r.maxSize {
			continue
		}
		if r.state != "" && r.state != st {
			continue
		}
		if t < r.winFrom || r.winTo > 0 && t >= r.winTo {
			continue
		}
		if r.cycOn > 0 && !r.inCycle(e.cfg.seed, t) {
			continue
		}
		m := r.matched.Add(1)
		if m <= r.after {
			continue
		}
		k := m - r.after
		if r.nth > 0 && k != r.nth || r.every > 0 && k%r.every != 0 {
			continue
		}
		if r.budget > 0 && r.budgetMu.Add(-bytes) >= 0 {
			continue
		}
		if r.p > 0 && unit(draw(e.cfg.seed, r.key, m, 0)) >= r.p {
			continue
		}
		if r.atlas && e.atl != nil && !e.atl.allow(e.self, s, n) {
			continue
		}
		if r.first > 0 && !r.claim() {
			continue
		} else if r.first == 0 {
			r.fired.Add(1)
		}
		d := draw(e.cfg.seed, r.key, m, 1)
		out = append(out, fired{r: r, draw: d, n: m})
		e.fire(r, d, o, s, n, idx, now)
		if terminal(r.Action.kind) {
			break
		}
	}
	return out
}

// claim counts a firing of a rule limited to its first n, false past them.
func (r *Rule) claim() bool {
	for {
		f := r.fired.Load()
		if f >= r.first {
			return false
		}
		if r.fired.CompareAndSwap(f, f+1) {
			return true
		}
	}
}

// inCycle reports whether t (ns since load) lies in the ON part of the
// rule's cycle, each cycle's start shifted by up to the jitter.
func (r *Rule) inCycle(seed uint64, t int64) bool {
	p := r.cycOn + r.cycOff
	k := t / p
	for _, i := range []int64{k, k - 1} {
		if i < 0 {
			continue
		}
		start := i * p
		if r.jitter > 0 {
			start += int64(unit(draw(seed, r.key^0xc1c1e, uint64(i), 0)) * float64(r.jitter))
		}
		if t >= start && t < start+r.cycOn {
			return true
		}
	}
	return false
}

// fire records a firing: the state it moves to and, for a fault, its
// event.
func (e *engine) fire(r *Rule, d uint64, o Op, s, n int64, idx uint64, now int64) {
	if r.next != "" {
		next := r.next
		e.state.Store(&next)
	}
	if r.Action.kind != actCount {
		e.log.add(Event{Index: idx, Time: now - e.t0, Op: o, Sector: s, Sectors: n, Rule: r.Name, Action: r.Action.text, Draw: d})
	}
}

// wait serves the delays of an I/O: the fired rules' stalls and delays,
// then the performance model's completion time.
func (e *engine) wait(ctx context.Context, fs []fired, o Op, fua bool, off, n int64, idx uint64) error {
	cl := delay.ClassWrite
	switch o {
	case OpRead:
		cl = delay.ClassRead
	case OpFlush:
		cl = delay.ClassFlush
	}
	for _, f := range fs {
		a := &f.r.Action
		switch a.kind {
		case actStall:
			if a.dur > 0 {
				if err := e.q.Wait(ctx, cl, a.dur); err != nil {
					return err
				}
				continue
			}
			e.relMu.Lock()
			rel := e.release
			e.relMu.Unlock()
			stack.Waiting(ctx)
			e.stalled.Add(1)
			select {
			case <-rel:
				e.stalled.Add(-1)
			case <-ctx.Done():
				e.stalled.Add(-1)
				return fmt.Errorf("fault: stall: %w: %w", syscall.EINTR, ctx.Err())
			}
		case actDelay:
			d := a.dist.Sample(func(sub uint64) uint64 { return draw(e.cfg.seed, f.r.key, f.n, 2+sub) })
			if err := e.q.Wait(ctx, cl, d); err != nil {
				return err
			}
		}
	}
	m := e.cfg.model
	if m.empty() {
		return nil
	}
	now := e.now()
	done := m.complete(e.cfg.seed, idx, o, fua, e.begin+off, n, now-e.t0) + e.t0
	return e.q.Wait(ctx, cl, done-now)
}

// ReadAt reads through the rules and the model (the Target's and the
// Device's).
func (e *engine) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return e.read(ctx, p, off)
}

// WriteAt writes through the rules and the model.
func (e *engine) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return e.write(ctx, p, off)
}

// Flush flushes through the rules and the model.
func (e *engine) Flush(ctx context.Context) error { return e.flush(ctx) }

// Discard discards through the rules and the model.
func (e *engine) Discard(ctx context.Context, off, n int64) error {
	return e.changeExtent(ctx, off, n, false)
}

// WriteZeroes writes zeros through the rules and the model.
func (e *engine) WriteZeroes(ctx context.Context, off, n int64) error {
	return e.changeExtent(ctx, off, n, true)
}

// releaseStalls lets every stall for ever go.
func (e *engine) releaseStalls() {
	e.relMu.Lock()
	close(e.release)
	e.release = make(chan struct{})
	e.relMu.Unlock()
}

// read reads len(p) bytes at device byte off (of the engine's range).
func (e *engine) read(ctx context.Context, p []byte, off int64) (int, error) {
	idx := e.ios.Add(1) - 1
	abs := e.begin + off
	s, n := abs/sector, (int64(len(p))+sector-1)/sector
	var buf [4]fired
	fs := e.evaluate(OpRead, false, s, n, int64(len(p)), idx, e.now(), buf[:0])
	if err := e.wait(ctx, fs, OpRead, false, off, int64(len(p)), idx); err != nil {
		return 0, err
	}
	if e.lat.check(s, n, false) {
		return 0, syscall.EIO
	}
	for _, f := range fs {
		if f.r.Action.kind == actError {
			return 0, f.r.Action.errno
		}
	}
	k, err := e.dev.ReadAt(ctx, p, e.base+off)
	if err != nil {
		return k, err
	}
	e.ov.apply(s, p)
	for _, f := range fs {
		a := &f.r.Action
		switch a.kind {
		case actStale:
			e.hist.stale(s, p, int(a.n))
		case actCorrupt:
			e.corrupt(p, s, a, f.draw)
		case actLatent:
			e.lat.mark(s, n, int(a.n))
		}
	}
	return k, nil
}

// write writes p at device byte off.
func (e *engine) write(ctx context.Context, p []byte, off int64) (int, error) {
	idx := e.ios.Add(1) - 1
	fua := stack.FUA(ctx)
	abs := e.begin + off
	s, n := abs/sector, (int64(len(p))+sector-1)/sector
	var buf [4]fired
	fs := e.evaluate(OpWrite, fua, s, n, int64(len(p)), idx, e.now(), buf[:0])
	if err := e.wait(ctx, fs, OpWrite, fua, off, int64(len(p)), idx); err != nil {
		return 0, err
	}
	if e.lat.check(s, n, true) {
		return 0, syscall.EIO
	}
	data := p
	for _, f := range fs {
		a := &f.r.Action
		switch a.kind {
		case actError:
			return 0, a.errno
		case actDrop:
			return len(p), nil
		case actPhantom:
			e.ov.put(s, p)
			return len(p), nil
		case actMisdirect:
			to := off + a.delta*sector
			if to >= 0 && to+int64(len(p)) <= e.size {
				if err := e.store(ctx, data, to); err != nil {
					return 0, err
				}
			}
			return len(p), nil
		case actTear:
			units := int64(len(p)) / a.unit
			if units < 2 {
				break
			}
			keep := 1 + int64(f.draw%uint64(units-1))
			if a.suffix {
				at := int64(len(p)) - keep*a.unit
				if err := e.store(ctx, data[at:], off+at); err != nil {
					return 0, err
				}
			} else if err := e.store(ctx, data[:keep*a.unit], off); err != nil {
				return 0, err
			}
			return len(p), nil
		case actCorrupt:
			if a.mode != corruptStuck {
				c := make([]byte, len(data))
				copy(c, data)
				e.corrupt(c, s, a, f.draw)
				data = c
			}
		case actLatent:
			defer e.lat.mark(s, n, int(a.n))
		}
	}
	if err := e.store(ctx, data, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// store writes p at off of the device below, keeping what stale reads and
// lying flushes need first.
func (e *engine) store(ctx context.Context, p []byte, off int64) error {
	e.keep(ctx, off, int64(len(p)))
	e.ov.forget((e.begin+off)/sector, int64(len(p))/sector)
	_, err := e.dev.WriteAt(ctx, p, e.base+off)
	return err
}

// keep records the old contents of [off, off+n) for the rules that need
// them.
func (e *engine) keep(ctx context.Context, off, n int64) {
	rs := e.rules.Load()
	if !rs.stale && !rs.lie {
		return
	}
	old := make([]byte, n)
	if _, err := e.dev.ReadAt(ctx, old, e.base+off); err != nil {
		return
	}
	if rs.stale {
		e.hist.push((e.begin+off)/sector, old)
	}
	if rs.lie {
		e.undo.push(off, old)
	}
}

// flush flushes the device below.
func (e *engine) flush(ctx context.Context) error {
	idx := e.ios.Add(1) - 1
	var buf [4]fired
	fs := e.evaluate(OpFlush, false, 0, 0, 0, idx, e.now(), buf[:0])
	if err := e.wait(ctx, fs, OpFlush, false, 0, 0, idx); err != nil {
		return err
	}
	for _, f := range fs {
		switch f.r.Action.kind {
		case actError:
			return f.r.Action.errno
		case actDrop:
			return nil
		case actLie:
			// Acknowledged, and what it was to make durable is lost:
			// the writes since the last flush are taken back, newest
			// first.
			recs := e.undo.take()
			for i := len(recs) - 1; i >= 0; i-- {
				if _, err := e.dev.WriteAt(ctx, recs[i].old, e.base+recs[i].off); err != nil {
					return err
				}
			}
			e.ov.clear()
			return nil
		}
	}
	e.undo.take() // what the flush made durable is not taken back
	e.ov.clear()
	return e.dev.Flush(ctx)
}

// discard (zeroes false) or write-zeroes n bytes at off.
func (e *engine) changeExtent(ctx context.Context, off, n int64, zeroes bool) error {
	idx := e.ios.Add(1) - 1
	o := OpDiscard
	if zeroes {
		o = OpZeroes
	}
	abs := e.begin + off
	s, ns := abs/sector, (n+sector-1)/sector
	var buf [4]fired
	fs := e.evaluate(o, false, s, ns, n, idx, e.now(), buf[:0])
	if err := e.wait(ctx, fs, o, false, off, n, idx); err != nil {
		return err
	}
	if e.lat.check(s, ns, true) {
		return syscall.EIO
	}
	for _, f := range fs {
		switch f.r.Action.kind {
		case actError:
			return f.r.Action.errno
		case actDrop, actPhantom, actMisdirect, actTear:
			return nil
		}
	}
	e.keep(ctx, off, n)
	e.ov.forget(s, ns)
	if zeroes {
		return e.dev.WriteZeroes(ctx, e.base+off, n)
	}
	return e.dev.Discard(ctx, e.base+off, n)
}

// corrupt changes p (sectors from s) as a says, from the rule's draw d
// alone (so that a replay, which has d, corrupts the same way); stuck bits
// come from the seed and the sector.
func (e *engine) corrupt(p []byte, s int64, a *Action, d uint64) {
	if len(p) == 0 {
		return
	}
	switch a.mode {
	case corruptByte:
		if a.off < int64(len(p)) {
			p[a.off] = a.val
		}
	case corruptRandom:
		for i := int64(0); i < a.n; i++ {
			x := draw(d, keyCorrupt, 0, uint64(i))
			p[x%uint64(len(p))] = byte(x >> 32)
		}
	case corruptBits:
		for i := int64(0); i < a.n; i++ {
			x := draw(d, keyCorrupt, 0, uint64(i))
			bit := x % uint64(len(p)*8)
			p[bit/8] ^= 1 << (bit % 8)
		}
	case corruptStuck:
		// Each sector has, with the probability, one bit stuck at a value:
		// the same bit and value on every read, from the seed and the
		// sector alone.
		for i := 0; i+sector <= len(p); i += sector {
			sec := uint64(s) + uint64(i/sector)
			x := draw(e.cfg.seed, keyStuck, sec, 0)
			if unit(x) >= a.prob {
				continue
			}
			y := draw(e.cfg.seed, keyStuck, sec, 1)
			bit := y % (sector * 8)
			if y>>63 == 1 {
				p[i+int(bit/8)] |= 1 << (bit % 8)
			} else {
				p[i+int(bit/8)] &^= 1 << (bit % 8)
			}
		}
	}
}

// status is the INFO status: the state, the I/O count, the faults logged,
// the latent sectors, the I/Os stalled for ever now, the rule count, then
// each rule's name, matches and firings.
func (e *engine) status() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %d %d %d %d %d", *e.state.Load(), e.ios.Load(), e.log.count(), e.lat.count(), e.stalled.Load(), len(e.rules.Load().rules))
	for _, r := range e.rules.Load().rules {
		fmt.Fprintf(&b, " %s:%d:%d", r.Name, r.matched.Load(), r.fired.Load())
	}
	return b.String()
}
