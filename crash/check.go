package crash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/logwrites"
)

// Cuts says which entries of a log are cut points.
type Cuts struct {
	Flush, FUA bool
	// Every makes every Every-th write a cut (0: none).
	Every uint64
	// Marks are mark names whose entries are cuts.
	Marks []string
	// From, when set, keeps only the cuts after the first mark of this
	// name.
	From string
}

// ParseCut adds one --at value to c: flush, fua, every:N or mark:NAME.
func (c *Cuts) ParseCut(s string) error {
	switch {
	case s == "flush":
		c.Flush = true
	case s == "fua":
		c.FUA = true
	case strings.HasPrefix(s, "every:"):
		n, err := strconv.ParseUint(s[len("every:"):], 10, 64)
		if err != nil || n == 0 {
			return fmt.Errorf("cut %q: want every:N, N a positive number of writes", s)
		}
		c.Every = n
	case strings.HasPrefix(s, "mark:") && len(s) > len("mark:"):
		c.Marks = append(c.Marks, s[len("mark:"):])
	default:
		return fmt.Errorf("cut %q: want flush, fua, every:N or mark:NAME", s)
	}
	return nil
}

// Entries returns the cut entries of rec for mode m, in log order. A cut
// at a flush is a crash while the flush is in flight: the entries before it
// happened and the writes since the previous flush may be lost, so the cut
// is the entry before the flush (in Prefix mode, replay-log's, the flush
// itself: nothing is lost there anyway).
func (c Cuts) Entries(rec *Record, m Mode) ([]uint64, error) {
	start := uint64(0)
	if c.From != "" {
		found := false
		for _, p := range rec.Points {
			if p.Flags&logwrites.FlagMark != 0 && p.Mark == c.From {
				start, found = p.Entry+1, true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("no mark %q in the log", c.From)
		}
	}
	seen := map[uint64]bool{}
	var out []uint64
	add := func(e uint64) {
		if e >= start && !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	for _, p := range rec.Points {
		switch {
		case p.Flags&logwrites.FlagMark != 0:
			for _, m := range c.Marks {
				if m == p.Mark {
					add(p.Entry)
				}
			}
		case c.Flush && p.Flags&logwrites.FlagFlush != 0:
			if m == Prefix {
				add(p.Entry)
			} else if p.Entry > 0 {
				add(p.Entry - 1)
			}
		case c.FUA && p.Flags&logwrites.FlagFUA != 0:
			add(p.Entry)
		}
	}
	if c.Every > 0 {
		for i := c.Every - 1; i < uint64(len(rec.Writes)); i += c.Every {
			add(rec.Writes[i].Entry)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Checker runs the user's check of one state.
type Checker struct {
	// Command runs with /bin/sh -c, with the state's device file in
	// DMFUSE_CRASH_DEV, its id in DMFUSE_CRASH_STATE and the cut entry in
	// DMFUSE_CRASH_CUT.
	Command string
	// Timeout kills a check that runs longer (its process group); it
	// counts as a failure.
	Timeout time.Duration
}

// Result is the check of one state.
type Result struct {
	ID      string  `json:"id"`
	Cut     uint64  `json:"cut"`
	OK      bool    `json:"ok"`
	Status  int     `json:"status"` // -1: killed (timeout or signal)
	Seconds float64 `json:"seconds"`
	Output  string  `json:"output,omitempty"` // the end of its output, when it failed
}

// run checks the device file dev of state id.
func (c Checker) run(dev, id string, cut uint64) Result {
	r := Result{ID: id, Cut: cut}
	t0 := time.Now()
	ctx := context.Background()
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	cmd := exec.Command("/bin/sh", "-c", c.Command)
	cmd.Env = append(os.Environ(), "DMFUSE_CRASH_DEV="+dev, "DMFUSE_CRASH_STATE="+id, "DMFUSE_CRASH_CUT="+strconv.FormatUint(cut, 10))
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	checks.Lock()
	if checks.stopped {
		checks.Unlock()
		r.Status, r.Output = -1, "interrupted"
		return r
	}
	if err := cmd.Start(); err != nil {
		checks.Unlock()
		r.Status, r.Output = -1, err.Error()
		return r
	}
	checks.running[cmd.Process.Pid] = true
	checks.Unlock()
	defer func() {
		checks.Lock()
		delete(checks.running, cmd.Process.Pid)
		checks.Unlock()
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		err = <-done
		fmt.Fprintf(&out, "\n(killed after %v)\n", c.Timeout)
	}
	r.Seconds = time.Since(t0).Seconds()
	var ee *exec.ExitError
	switch {
	case err == nil && ctx.Err() == nil:
		r.OK = true
	case errors.As(err, &ee):
		r.Status = ee.ExitCode()
	default:
		r.Status = -1
	}
	if !r.OK {
		r.Output = out.String()
	}
	return r
}

// checks are the process groups of the checks running now, by their
// leader's pid; once stopped, no check starts.
var checks = struct {
	sync.Mutex
	running map[int]bool
	stopped bool
}{running: map[int]bool{}}

// KillChecks kills the process group of every check running now and
// starts no other (a run that is interrupted leaves none behind).
func KillChecks() {
	checks.Lock()
	defer checks.Unlock()
	checks.stopped = true
	for pid := range checks.running {
		unix.Kill(-pid, unix.SIGKILL)
	}
}

// tail keeps the last 4 KiB written to it.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = append(t.b[:0], t.b[len(t.b)-4096:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimRight(t.b, "\n"))
}

// Base is the device as of some number of the log's writes, in a file of
// its own that the states of a cut are overlays on.
type Base struct {
	f       *os.File
	log     io.ReaderAt
	rec     *Record
	size    int64
	applied int
}

// NewBase makes the file path holding image (nil: zeros), size bytes.
func NewBase(path string, image *os.File, size int64, rec *Record, log io.ReaderAt) (*Base, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, err
	}
	if image != nil {
		if err := copyImage(f, image, size); err != nil {
			f.Close()
			return nil, fmt.Errorf("copying the image: %w", err)
		}
	}
	return &Base{f: f, log: log, rec: rec, size: size}, nil
}

// copyImage copies the first size bytes of image (or all it has) to f:
// with copy_file_range where both are files of one file system that takes
// it (no data passes through this process), else by reading and writing.
func copyImage(f, image *os.File, size int64) error {
	for off := int64(0); off < size; {
		n, err := unix.CopyFileRange(int(image.Fd()), &off, int(f.Fd()), nil, int(min(size-off, 1<<30)), 0)
		switch {
		case err == nil && n == 0:
			return nil
		case err == nil:
		case off == 0 && (err == unix.EXDEV || err == unix.EINVAL || err == unix.ENOSYS || err == unix.EOPNOTSUPP):
			_, err := io.Copy(f, io.NewSectionReader(image, 0, size))
			return err
		default:
			return err
		}
	}
	return nil
}

// Advance applies the writes up to the first n of the log, in order.
func (b *Base) Advance(n int) error {
	buf := make([]byte, 1<<20)
	for ; b.applied < n; b.applied++ {
		w := b.rec.Writes[b.applied]
		off, length := int64(w.Sector)*b.rec.Unit, int64(w.Count)*b.rec.Unit
		length = max(0, min(length, b.size-off))
		if w.Discard() || w.Data < 0 {
			if err := unix.Fallocate(int(b.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length); err != nil {
				clear(buf)
				for done := int64(0); done < length; {
					k := min(int64(len(buf)), length-done)
					if _, err := b.f.WriteAt(buf[:k], off+done); err != nil {
						return err
					}
					done += k
				}
			}
			continue
		}
		for done := int64(0); done < length; {
			k := min(int64(len(buf)), length-done)
			if _, err := b.log.ReadAt(buf[:k], w.Data+done); err != nil && err != io.EOF {
				return fmt.Errorf("log entry %d: reading its data: %w", w.Entry, err)
			}
			if _, err := b.f.WriteAt(buf[:k], off+done); err != nil {
				return err
			}
			done += k
		}
	}
	return nil
}

// Close closes and removes the file.
func (b *Base) Close() error {
	os.Remove(b.f.Name())
	return b.f.Close()
}

// Run is one run of the command: the log, how to cut it and how to check.
type Run struct {
	Rec     *Record
	Log     io.ReaderAt
	Base    *Base
	Server  *Server
	Check   Checker
	Options Options
	// Jobs is how many checks run at once.
	Jobs int
	// Done, when set, is called after each check of Cut, from the
	// goroutine that ran it.
	Done func(Result)
	// Inspect, when set, checks a state in process instead of Check and
	// Server (a library's own verifier): it returns whether the state is
	// fine.
	Inspect func(o *Overlay, s State) bool
}

// Cut checks every state of the cut after entry cut, Jobs at a time, and
// returns their results and the states, in the same order, and whether
// they are all the cut's states. The base is advanced to the cut's last
// flush first.
func (r *Run) Cut(cut uint64) ([]Result, []State, bool, error) {
	from, _ := r.Rec.Span(cut)
	if err := r.Base.Advance(from); err != nil {
		return nil, nil, false, err
	}
	states, all := r.Rec.States(cut, r.Options)
	results := make([]Result, len(states))
	sem := make(chan struct{}, max(r.Jobs, 1))
	var wg sync.WaitGroup
	for i, s := range states {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = r.check(s)
			if r.Done != nil {
				r.Done(results[i])
			}
		}()
	}
	wg.Wait()
	return results, states, all, nil
}

// CheckState builds state s as a file and runs the check on it. The base
// must be at s's cut.
func (r *Run) CheckState(s State) Result { return r.check(s) }

// File returns the base's file.
func (b *Base) File() *os.File { return b.f }

// check builds state s as a file and runs the check on it.
func (r *Run) check(s State) Result {
	o := NewOverlay(r.Rec, s, r.Base.f, r.Log, r.Base.size)
	if r.Inspect != nil {
		return Result{ID: r.Rec.ID(s), Cut: s.Cut, OK: r.Inspect(o, s)}
	}
	dev := r.Server.Add(o)
	defer r.Server.Remove(dev)
	return r.Check.run(dev, r.Rec.ID(s), s.Cut)
}

// Shrink looks for a smallest set of the lost items of state s, which
// failed its check with result failed, that still fails (delta debugging:
// ddmin), with the base at s's cut. It returns that state and its result.
func (r *Run) Shrink(s State, failed Result) (State, Result) {
	unit := s.Unit
	var items []item
	for _, l := range s.Lost {
		if l.Units == nil {
			items = append(items, item{l.Write, -1})
			continue
		}
		for _, u := range l.Units {
			items = append(items, item{l.Write, int64(u)})
		}
	}
	mode := Subset
	if unit > 0 {
		mode = Sector
	}
	build := func(it []item) State {
		return stateOf(s.Cut, mode, unit, s.Fill, s.Seed, it, func(int) bool { return true })
	}
	last := failed
	fails := func(it []item) bool {
		res := r.check(build(it))
		if !res.OK {
			last = res
		}
		return !res.OK
	}
	if fails(nil) {
		return build(nil), last
	}
	n := 2
	for len(items) >= 2 {
		chunks := split(items, n)
		reduced := false
		for _, c := range chunks {
			if fails(c) {
				items, n, reduced = c, 2, true
				break
			}
		}
		if !reduced && n > 2 {
			for i := range chunks {
				comp := complement(chunks, i)
				if fails(comp) {
					items, n, reduced = comp, max(n-1, 2), true
					break
				}
			}
		}
		if !reduced {
			if n >= len(items) {
				break
			}
			n = min(2*n, len(items))
		}
	}
	// Every check that failed made its items the current ones: last is
	// the result of these.
	return build(items), last
}

func split(it []item, n int) [][]item {
	var out [][]item
	for i := 0; i < n; i++ {
		a, b := i*len(it)/n, (i+1)*len(it)/n
		if b > a {
			out = append(out, it[a:b])
		}
	}
	return out
}

func complement(chunks [][]item, skip int) []item {
	var out []item
	for i, c := range chunks {
		if i != skip {
			out = append(out, c...)
		}
	}
	return out
}

// Describe names the lost writes of s by log entry and sectors.
func (rec *Record) Describe(s State) []string {
	var out []string
	for _, l := range s.Lost {
		w := rec.Writes[l.Write]
		kind := "write"
		if w.Discard() {
			kind = "discard"
		}
		line := fmt.Sprintf("entry %d: %s of units %d+%d (%d-byte units)", w.Entry, kind, w.Sector, w.Count, rec.Unit)
		if l.Units != nil {
			var b strings.Builder
			writeRanges(&b, l.Units)
			line += fmt.Sprintf(", torn: its %d-byte units %s lost", s.Unit, b.String())
		} else {
			line += ", lost"
		}
		out = append(out, line)
	}
	return out
}

// WorkDir makes a folder for a run's base and states under dir ("": the
// system's temporary folder).
func WorkDir(dir string) (string, error) {
	return os.MkdirTemp(dir, "dmfuse-crash-")
}

// StatesDir is the folder of the state files in a work folder.
func StatesDir(work string) string { return filepath.Join(work, "states") }
