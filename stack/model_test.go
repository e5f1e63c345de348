package stack_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/multipath"
	"github.com/dmfuse/dmfuse/stack"
)

// The model test builds random stacks of devices through a Manager, runs
// random I/O on the top device from several goroutines while a control
// goroutine reloads devices to equivalent tables, suspends and resumes them
// and fails and reinstates multipath paths, and compares every byte read
// with a plain byte slice. A failure prints the seed of its round; rerun it
// with
//
//	go test ./stack -run TestModel -model.seed N -model.rounds 1
var (
	modelSeed   = flag.Uint64("model.seed", 1, "first seed of TestModel")
	modelRounds = flag.Int("model.rounds", 6, "random stacks TestModel builds (seeds model.seed, model.seed+1, ...)")
	modelOps    = flag.Int("model.ops", 600, "I/O operations per worker per round of TestModel")
)

const modelWorkers = 4

func TestModel(t *testing.T) {
	rounds := *modelRounds
	if testing.Short() {
		rounds = min(rounds, 2)
	}
	for i := range rounds {
		seed := *modelSeed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("reproduce with: go test ./stack -run 'TestModel/seed=%d$' -model.seed %d -model.rounds 1", seed, seed)
				}
			})
			runModel(t, seed)
		})
	}
}

// mseg is one segment of a generated table. Remapping kinds (linear, delay,
// flakey, dust) map [0, len) to dev at off and may be split in two without
// changing the mapping; a striped segment is rendered whole.
type mseg struct {
	kind    string
	len     int64 // sectors
	dev     string
	off     int64
	extra   string   // arguments after "<dev> <off>"
	stripes []string // striped: "<dev> <off>" per stripe
	chunk   int64
}

// mdev is one generated device: either a list of segments or a multipath
// table over paths, which a reload may give another path selector.
type mdev struct {
	name  string
	size  int64 // sectors
	segs  []mseg
	paths []string // multipath
	// failed: paths currently failed by a message (multipath).
	failed map[string]bool
}

type model struct {
	t    *testing.T
	rng  *rand.Rand
	mgr  *stack.Manager
	dir  string
	devs []*mdev // in creation order: each may stack on earlier ones
	// files are the backing files with the sectors allocated so far.
	files []string
	used  []int64
	n     int
}

const modelFileSectors = 8192

func newModel(t *testing.T, seed uint64, dir string) *model {
	return &model{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), dir: dir}
}

func modelRegistry(t *testing.T) *stack.Registry {
	reg, err := stack.NewRegistry(stack.Linear, stack.Striped, stack.Zero, stack.Error, stack.Flakey, stack.Dust, multipath.Type, delay.Type)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// region allocates n sectors of backing storage and returns (path, offset).
func (m *model) region(n int64) (string, int64) {
	for i := range m.files {
		if m.used[i]+n <= modelFileSectors && m.rng.IntN(2) == 0 {
			off := m.used[i]
			m.used[i] += n
			return m.files[i], off
		}
	}
	p := filepath.Join(m.dir, fmt.Sprintf("b%d.img", len(m.files)))
	size := max(int64(modelFileSectors), n)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Truncate(p, size*stack.SectorSize); err != nil {
		m.t.Fatal(err)
	}
	m.files = append(m.files, p)
	m.used = append(m.used, n)
	return p, 0
}

// lower returns a device argument and an offset where n sectors of fresh
// storage start: a region of a backing file, or a new mapped device
// (itself a random stack) when depth allows.
func (m *model) lower(n int64, depth int) (string, int64) {
	if depth > 0 && m.rng.IntN(3) == 0 {
		pad := int64(m.rng.IntN(8))
		d := m.genDevice(n+pad, depth-1)
		return d.name, pad
	}
	return m.region(n)
}

func (m *model) newName(prefix string) string {
	m.n++
	return fmt.Sprintf("%s%d", prefix, m.n)
}

// genDevice creates a device of size sectors with a random table and returns it.
func (m *model) genDevice(size int64, depth int) *mdev {
	d := &mdev{name: m.newName("d"), size: size}
	for pos := int64(0); pos < size; {
		rem := size - pos
		n := rem
		if rem > 8 && m.rng.IntN(4) != 0 {
			n = 1 + m.rng.Int64N(rem/2+1)
		}
		var s mseg
		switch k := m.rng.IntN(7); {
		case k == 0:
			stripes, chunk := 2+m.rng.Int64N(3), 1+m.rng.Int64N(16)
			if n < stripes*chunk {
				if rem < stripes*chunk {
					goto remap
				}
				n = stripes * chunk
			}
			n -= n % (stripes * chunk)
			s = mseg{kind: "striped", len: n, chunk: chunk}
			for range stripes {
				dev, off := m.lower(n/stripes, depth)
				s.stripes = append(s.stripes, fmt.Sprintf("%s %d", dev, off))
			}
			d.segs = append(d.segs, s)
			pos += n
			continue
		case k == 1 && depth > 0:
			mp := m.genMultipath(n, depth-1)
			d.segs = append(d.segs, mseg{kind: "linear", len: n, dev: mp.name})
			pos += n
			continue
		}
	remap:
		s = mseg{len: n}
		s.dev, s.off = m.lower(n, depth)
		switch m.rng.IntN(5) {
		case 0:
			s.kind, s.extra = "linear", ""
		case 1:
			s.kind, s.extra = "delay", " 0"
		case 2:
			s.kind, s.extra = "flakey", " 1 0"
		case 3:
			if bs := int64(512) << m.rng.IntN(4); bs/stack.SectorSize <= n {
				s.kind, s.extra = "dust", fmt.Sprintf(" %d", bs)
			} else {
				s.kind = "linear"
			}
		default:
			s.kind = "linear"
		}
		d.segs = append(d.segs, s)
		pos += n
	}
	m.create(d)
	return d
}

// genMultipath creates path devices over one region and a multipath device
// over them.
func (m *model) genMultipath(size int64, depth int) *mdev {
	dev, off := m.lower(size, depth)
	d := &mdev{name: m.newName("mp"), size: size, failed: map[string]bool{}}
	for range 2 + m.rng.IntN(3) {
		p := &mdev{name: m.newName("p"), size: size, segs: []mseg{{kind: "linear", len: size, dev: dev, off: off}}}
		m.create(p)
		d.paths = append(d.paths, p.name)
	}
	m.create(d)
	return d
}

// table renders d's table; with vary, an equivalent variant (remapping
// segments split in two, another path selector).
func (m *model) table(d *mdev, vary bool) string {
	var b strings.Builder
	if d.paths != nil {
		sel, pathArgs := "round-robin", " 1"
		if vary {
			switch m.rng.IntN(4) {
			case 1:
				sel = "queue-length"
			case 2:
				sel, pathArgs = "service-time", " 1 1"
			}
		}
		fmt.Fprintf(&b, "0 %d multipath 0 0 1 1 %s 0 %d %d", d.size, sel, len(d.paths), strings.Count(pathArgs, " "))
		for _, p := range d.paths {
			b.WriteString(" " + p + pathArgs)
		}
		return b.String()
	}
	pos := int64(0)
	for _, s := range d.segs {
		if s.kind == "striped" {
			fmt.Fprintf(&b, "%d %d striped %d %d %s\n", pos, s.len, len(s.stripes), s.chunk, strings.Join(s.stripes, " "))
			pos += s.len
			continue
		}
		parts := []int64{s.len}
		if vary && s.len > 1 && m.rng.IntN(2) == 0 {
			k := 1 + m.rng.Int64N(s.len-1)
			if s.kind == "dust" {
				// Keep each part at least one block long.
				var bs int64
				fmt.Sscan(strings.TrimSpace(s.extra), &bs)
				bs /= stack.SectorSize
				k = k / bs * bs
				if k == 0 || s.len-k < bs {
					k = 0
				}
			}
			if k > 0 {
				parts = []int64{k, s.len - k}
			}
		}
		off := s.off
		for _, n := range parts {
			fmt.Fprintf(&b, "%d %d %s %s %d%s\n", pos, n, s.kind, s.dev, off, s.extra)
			pos += n
			off += n
		}
	}
	return b.String()
}

func (m *model) create(d *mdev) {
	m.t.Helper()
	text := m.table(d, false)
	if _, err := m.mgr.Create(stack.CreateOptions{Name: d.name, Minor: -1, Table: text, Dir: m.dir}); err != nil {
		m.t.Fatalf("create %s with table\n%s: %v", d.name, text, err)
	}
	m.devs = append(m.devs, d)
}

// rangeLock serialises operations on overlapping byte ranges, so that the
// model knows the order in which overlapping writes happened.
type rangeLock struct {
	mu   sync.Mutex
	cond sync.Cond
	held map[[2]int64]int
}

func newRangeLock() *rangeLock {
	l := &rangeLock{held: map[[2]int64]int{}}
	l.cond.L = &l.mu
	return l
}

func (l *rangeLock) lock(off, end int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		free := true
		for r := range l.held {
			if off < r[1] && r[0] < end {
				free = false
				break
			}
		}
		if free {
			l.held[[2]int64{off, end}]++
			return
		}
		l.cond.Wait()
	}
}

func (l *rangeLock) unlock(off, end int64) {
	l.mu.Lock()
	k := [2]int64{off, end}
	if l.held[k]--; l.held[k] == 0 {
		delete(l.held, k)
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// memDir returns a temporary folder on tmpfs (/dev/shm) when there is one,
// so that flushes cost nothing, else one under t.TempDir.
func memDir(t *testing.T) string {
	if dir, err := os.MkdirTemp("/dev/shm", "dmfuse-model-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

func runModel(t *testing.T, seed uint64) {
	dir := memDir(t)
	m := newModel(t, seed, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.mgr = stack.NewManager(stack.ManagerOptions{Registry: modelRegistry(t), Context: ctx})
	t.Cleanup(func() { m.mgr.Close() })

	size := int64(256 + m.rng.IntN(2048))
	top := m.genDevice(size, 2)
	var layout strings.Builder
	for _, d := range m.devs {
		fmt.Fprintf(&layout, "%s:\n%s\n", d.name, m.table(d, false))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stack (top %s):\n%s", top.name, layout.String())
		}
	})
	dev := m.mgr.Lookup(top.name)
	nbytes := size * stack.SectorSize
	if dev.Size() != nbytes {
		t.Fatalf("top device size %d, want %d", dev.Size(), nbytes)
	}

	want := make([]byte, nbytes) // the backing files start sparse: zeros
	locks := newRangeLock()
	var wg sync.WaitGroup
	errs := make(chan error, modelWorkers+1)
	for w := range modelWorkers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)+1))
		wg.Go(func() {
			if err := modelWorker(ctx, rng, dev, want, locks); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
				cancel()
			}
		})
	}
	stop := make(chan struct{})
	ctlDone := make(chan struct{})
	crng := rand.New(rand.NewPCG(seed, 0xc0))
	var steps int
	go func() {
		defer close(ctlDone)
		var err error
		if steps, err = m.control(crng, stop); err != nil {
			errs <- fmt.Errorf("control: %w", err)
			cancel()
		}
	}()
	wg.Wait()
	close(stop)
	<-ctlDone
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	t.Logf("%d devices, top %s of %d sectors, %d x %d I/Os, %d control steps", len(m.devs), top.name, size, modelWorkers, *modelOps, steps)

	got := make([]byte, nbytes)
	if n, err := dev.ReadAt(context.Background(), got, 0); err != nil || int64(n) != nbytes {
		t.Fatalf("final read: %d, %v", n, err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("final read differs from the model at byte %d (sector %d)", i, i/stack.SectorSize)
	}
	if err := dev.Flush(context.Background()); err != nil {
		t.Fatalf("flush: %v", err)
	}

	// The data is on the backing files: the same stack, built again by a new
	// manager after the first one removed everything, reads the same bytes.
	m.mgr.Close()
	m.mgr = stack.NewManager(stack.ManagerOptions{Registry: modelRegistry(t), Context: ctx})
	t.Cleanup(func() { m.mgr.Close() })
	for _, d := range m.devs {
		text := m.table(d, true)
		if _, err := m.mgr.Create(stack.CreateOptions{Name: d.name, Minor: -1, Table: text, Dir: dir}); err != nil {
			t.Fatalf("re-create %s: %v", d.name, err)
		}
	}
	clear(got)
	if n, err := m.mgr.Lookup(top.name).ReadAt(context.Background(), got, 0); err != nil || int64(n) != nbytes {
		t.Fatalf("read after re-creating the stack: %d, %v", n, err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("after re-creating the stack the data differs from the model at byte %d", i)
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// modelWorker runs random I/O on dev, keeping want up to date under the
// range lock.
func modelWorker(ctx context.Context, rng *rand.Rand, dev *stack.Device, want []byte, locks *rangeLock) error {
	size := int64(len(want))
	buf := make([]byte, 128<<10)
	for i := range *modelOps {
		if ctx.Err() != nil {
			return nil
		}
		var off, n int64
		switch rng.IntN(3) {
		case 0: // sector-aligned
			off = rng.Int64N(size/stack.SectorSize) * stack.SectorSize
			n = (1 + rng.Int64N(64)) * stack.SectorSize
		case 1: // anything
			off = rng.Int64N(size)
			n = 1 + rng.Int64N(16<<10)
		default: // near the end, sometimes past it
			off = size - rng.Int64N(8<<10)
			n = 1 + rng.Int64N(12<<10)
		}
		off = max(off, 0)
		end := max(min(off+n, size), off)
		op := rng.IntN(20)
		locks.lock(off, max(end, off+1))
		var err error
		switch {
		case op < 8: // read
			p := buf[:n]
			got, rerr := dev.ReadAt(ctx, p, off)
			switch {
			case rerr != nil:
				err = fmt.Errorf("op %d: read %d@%d: %v", i, n, off, rerr)
			case int64(got) != end-off:
				err = fmt.Errorf("op %d: read %d@%d returned %d, want %d", i, n, off, got, end-off)
			default:
				if j := firstDiff(p[:got], want[off:end]); j >= 0 {
					err = fmt.Errorf("op %d: read %d@%d: byte %d (device offset %d) is %#x, model has %#x",
						i, n, off, j, off+int64(j), p[j], want[off+int64(j)])
				}
			}
		case op < 16: // write
			p := buf[:n]
			for k := range p {
				p[k] = byte(rng.Uint32())
			}
			got, werr := dev.WriteAt(ctx, p, off)
			switch {
			case off >= size:
				if werr == nil {
					err = fmt.Errorf("op %d: write %d@%d past the end succeeded", i, n, off)
				}
			case werr != nil:
				err = fmt.Errorf("op %d: write %d@%d: %v", i, n, off, werr)
			case int64(got) != end-off:
				err = fmt.Errorf("op %d: write %d@%d returned %d, want %d", i, n, off, got, end-off)
			default:
				copy(want[off:end], p)
			}
		case op < 17:
			if ferr := dev.Flush(ctx); ferr != nil {
				err = fmt.Errorf("op %d: flush: %v", i, ferr)
			}
		case op < 19: // discard: the backing files punch holes, which read as zeros
			if derr := dev.Discard(ctx, off, n); derr != nil {
				err = fmt.Errorf("op %d: discard %d@%d: %v", i, n, off, derr)
			} else if off < size {
				clear(want[off:end])
			}
		default:
			if zerr := dev.WriteZeroes(ctx, off, n); zerr != nil {
				err = fmt.Errorf("op %d: write-zeroes %d@%d: %v", i, n, off, zerr)
			} else if off < size {
				clear(want[off:end])
			}
		}
		locks.unlock(off, max(end, off+1))
		if err != nil {
			return err
		}
	}
	return nil
}

// control reloads, suspends and resumes random devices and fails and
// reinstates multipath paths until stop is closed. At most one device is
// suspended at a time: a device suspended below another one that is being
// suspended would wait for I/O held by the first, as in dm.
func (m *model) control(rng *rand.Rand, stop <-chan struct{}) (int, error) {
	mgr := m.mgr
	for step := 0; ; step++ {
		select {
		case <-stop:
			return step, nil
		default:
		}
		d := m.devs[rng.IntN(len(m.devs))]
		switch k := rng.IntN(10); {
		case k < 4: // reload to an equivalent table and resume
			text := m.table(d, true)
			if err := mgr.Load(d.name, text, m.dir); err != nil {
				return step, fmt.Errorf("step %d: load %s:\n%s: %v", step, d.name, text, err)
			}
			if err := mgr.Resume(d.name, stack.Flags{}); err != nil {
				return step, fmt.Errorf("step %d: resume %s after load: %v", step, d.name, err)
			}
			clear(d.failed) // a new multipath table starts with every path usable
		case k < 7: // suspend, perhaps reload while suspended, resume
			noflush, reloaded := rng.IntN(2) == 0, false
			if err := mgr.Suspend(d.name, stack.Flags{NoFlush: noflush}); err != nil {
				return step, fmt.Errorf("step %d: suspend %s (noflush %v): %v", step, d.name, noflush, err)
			}
			if rng.IntN(2) == 0 {
				if err := mgr.Load(d.name, m.table(d, true), m.dir); err != nil {
					return step, fmt.Errorf("step %d: load %s while suspended: %v", step, d.name, err)
				}
				reloaded = true
			}
			time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
			if err := mgr.Resume(d.name, stack.Flags{}); err != nil {
				return step, fmt.Errorf("step %d: resume %s: %v", step, d.name, err)
			}
			if reloaded {
				clear(d.failed)
			}
		case k < 9 && d.paths != nil: // fail or reinstate a path, keeping one usable
			p := d.paths[rng.IntN(len(d.paths))]
			usable := len(d.paths) - len(d.failed)
			switch {
			case d.failed[p]:
				if _, err := mgr.Message(context.Background(), d.name, 0, []string{"reinstate_path", p}); err != nil {
					return step, fmt.Errorf("step %d: %s: reinstate_path %s: %v", step, d.name, p, err)
				}
				delete(d.failed, p)
			case usable > 1:
				if _, err := mgr.Message(context.Background(), d.name, 0, []string{"fail_path", p}); err != nil {
					return step, fmt.Errorf("step %d: %s: fail_path %s: %v", step, d.name, p, err)
				}
				d.failed[p] = true
			}
		default:
			time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
		}
	}
}
