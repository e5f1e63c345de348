package delay

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
)

// Type is the delay target type (dm-delay v1.5.0). The delay targets of a
// Manager share one scheduler on the real clock (Ctor.Shared).
var Type = &stack.TargetType{
	Name:    "delay",
	Version: [3]int{1, 5, 0},
	New: func(c *stack.Ctor, args []string) (stack.Target, error) {
		v, err := c.Shared.Get(schedulerKey{}, func() (any, error) { return NewRealScheduler() })
		if err != nil {
			return nil, &stack.ArgError{Reason: "Cannot start delay scheduler: " + err.Error(), Errno: errnoOf(err, syscall.ENOMEM)}
		}
		return New(v.(*Scheduler), c, args)
	},
}

// schedulerKey is the key of the scheduler in a stack.SharedSet.
type schedulerKey struct{}

// NewType returns a delay target type whose targets are served by s (a
// scheduler on a manual clock, in tests).
func NewType(s *Scheduler) *stack.TargetType {
	return &stack.TargetType{
		Name:    "delay",
		Version: Type.Version,
		New: func(c *stack.Ctor, args []string) (stack.Target, error) {
			return New(s, c, args)
		},
	}
}

// class is one of the read, write and flush classes: the stack.Remap its I/O
// passes through once it has waited, and how long it waits.
type class struct {
	stack.Remap
	ms    float64
	delay int64 // ns; 0 passes straight through
}

// Target is a constructed delay target.
type Target struct {
	q      *queue
	nargs  int
	cls    [numClasses]*class
	closed bool
}

var (
	_ stack.Target       = (*Target)(nil)
	_ stack.Flusher      = (*Target)(nil)
	_ stack.Discarder    = (*Target)(nil)
	_ stack.Presuspender = (*Target)(nil)
	_ stack.Resumer      = (*Target)(nil)
	_ stack.MapAccounter = (*Target)(nil)
)

// New constructs a delay target served by s. The table syntax is dm-delay's:
//
//	<dev> <offset> <delay>                                            (3 args)
//	<rdev> <roff> <rdelay> <wdev> <woff> <wdelay>                     (6 args)
//	<rdev> <roff> <rdelay> <wdev> <woff> <wdelay> <fdev> <foff> <fdelay>  (9 args)
//
// Reads use the first triple; writes and discards the second (the first
// with 3 args); flushes the third (the write triple with 6 args, the only
// one with 3). Offsets are sectors into the device. Delays are milliseconds
// up to 4294967295; unlike dm-delay, dmfuse also accepts a decimal fraction
// (0.25), kept to the nanosecond. A delay of 0 passes the class through
// without waiting.
//
// dm-delay takes discards but not write-zeroes (drivers/md/dm-delay.c:
// delay_ctr sets num_flush_bios and num_discard_bios only), so ZERO_RANGE
// reaches it as writes of zeros, delayed as writes.
func New(s *Scheduler, c *stack.Ctor, args []string) (*Target, error) {
	n := len(args)
	if n != 3 && n != 6 && n != 9 {
		return nil, stack.Errorf("Requires exactly 3, 6 or 9 arguments")
	}
	t := &Target{nargs: n}
	for i := 0; i < n; i += 3 {
		cl, err := newClass(c, args[i:i+3], i)
		if err != nil {
			return nil, err
		}
		t.cls[i/3] = cl
	}
	if n == 3 {
		t.cls[classWrite] = t.cls[classRead]
	}
	if n < 9 {
		t.cls[classFlush] = t.cls[classWrite]
	}
	t.q = newQueue(s)
	return t, nil
}

// newClass parses one `<dev> <offset> <delay>` triple in the order of
// drivers/md/dm-delay.c: delay_class_ctr: offset, delay, then the device
// lookup (stack.OpenRemap, which also checks the area). first is the index
// of args[0] among all the arguments.
func newClass(c *stack.Ctor, args []string, first int) (*class, error) {
	sec, err := stack.ParseSector(args[1])
	if err != nil {
		return nil, stack.Errorf("Invalid device sector: argument %d %q", first+2, args[1])
	}
	ms, err := ParseDelay(args[2])
	if err != nil {
		return nil, stack.Errorf("Invalid delay: argument %d %q", first+3, args[2])
	}
	r, err := stack.OpenRemap(c, args[0], sec, c.Len)
	if err != nil {
		return nil, err
	}
	return &class{Remap: r, ms: ms, delay: int64(math.Round(ms * 1e6))}, nil
}

// errnoOf returns the errno err carries, or def.
func errnoOf(err error, def syscall.Errno) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return def
}

// maxDelayMs is the largest delay, dm-delay's unsigned 32-bit milliseconds.
const maxDelayMs = math.MaxUint32

// ParseDelay parses a delay in milliseconds: decimal digits with an optional
// leading '+' (as the kernel's kstrtouint takes) and an optional fraction
// (`0.25`), at most 4294967295. Exponents, signs other than '+', hex, inf and
// nan are refused.
func ParseDelay(s string) (float64, error) {
	t := strings.TrimPrefix(s, "+")
	intPart, frac, hasDot := strings.Cut(t, ".")
	if intPart == "" || !allDigits(intPart) || hasDot && (frac == "" || !allDigits(frac)) {
		return 0, strconv.ErrSyntax
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, err
	}
	if v > maxDelayMs {
		return 0, strconv.ErrRange
	}
	return v, nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// FormatDelay prints a delay as the shortest decimal that ParseDelay reads
// back to the same value, never in exponent form.
func FormatDelay(ms float64) string { return strconv.FormatFloat(ms, 'f', -1, 64) }

// wait delays one request of class c.
func (t *Target) wait(ctx context.Context, c *class, cl int) error {
	if c.delay > 0 {
		if err := t.q.wait(ctx, cl, c.delay); err != nil {
			return err
		}
	}
	stack.StartAccounting(ctx)
	return nil
}

// ReadAt delays the read by the read delay, then reads from the read device.
func (t *Target) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	c := t.cls[classRead]
	if err := t.wait(ctx, c, classRead); err != nil {
		return 0, err
	}
	return c.ReadAt(ctx, p, off)
}

// WriteAt delays the write by the write delay, then writes to the write device.
func (t *Target) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	c := t.cls[classWrite]
	if err := t.wait(ctx, c, classWrite); err != nil {
		return 0, err
	}
	return c.WriteAt(ctx, p, off)
}

// Flush delays the flush by the flush delay, then flushes the flush device.
func (t *Target) Flush(ctx context.Context) error {
	c := t.cls[classFlush]
	if err := t.wait(ctx, c, classFlush); err != nil {
		return err
	}
	return c.Flush(ctx)
}

// Discard is a write for dm-delay: delayed by the write delay, then passed
// to the write device.
func (t *Target) Discard(ctx context.Context, off, n int64) error {
	c := t.cls[classWrite]
	if err := t.wait(ctx, c, classWrite); err != nil {
		return err
	}
	return c.Discard(ctx, off, n)
}

// Status returns, for StatusTable, the read triple, then the write triple
// with 6 or 9 arguments and the flush triple with 9; for StatusInfo the
// number of requests queued now per class: `<reads> <writes> <flushes>`.
func (t *Target) Status(st stack.StatusType) string {
	var b []byte
	if st == stack.StatusInfo {
		n := t.q.counts()
		for c := range n {
			if c > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendInt(b, int64(n[c]), 10)
		}
		return string(b)
	}
	for i := 0; i < t.nargs/3; i++ {
		c := t.cls[i]
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, c.Table()...)
		b = append(b, ' ')
		b = append(b, FormatDelay(c.ms)...)
	}
	return string(b)
}

// AccountsAtMap marks delay as a target that starts accounting itself, when a
// request leaves the queue.
func (t *Target) AccountsAtMap() {}

// Presuspend stops delaying and releases every queued request at once.
func (t *Target) Presuspend(noflush bool) { t.q.flush() }

// Resume delays again.
func (t *Target) Resume() { t.q.resume() }

// Close releases what is still queued and lets the scheduler stop if this
// was its last target.
func (t *Target) Close() error {
	if !t.closed {
		t.closed = true
		t.q.close()
	}
	return nil
}

// Shared returns the scheduler on the real clock that the delay targets of
// c's Manager share (made with the first), for targets of other packages
// that wait as delay's do.
func Shared(c *stack.Ctor) (*Scheduler, error) {
	v, err := c.Shared.Get(schedulerKey{}, func() (any, error) { return NewRealScheduler() })
	if err != nil {
		return nil, err
	}
	return v.(*Scheduler), nil
}

// Classes of the requests a Queue delays: each waits in its own list, in
// deadline order.
const (
	ClassRead  = classRead
	ClassWrite = classWrite
	ClassFlush = classFlush
)

// Queue is one target's queue of delayed requests on a Scheduler, for
// targets of other packages: any delay per request, released at its
// deadline within the scheduler's accuracy.
type Queue struct{ q *queue }

// NewQueue returns a queue on s; Close it with its target.
func (s *Scheduler) NewQueue() *Queue { return &Queue{q: newQueue(s)} }

// Wait delays the calling request of class c (ClassRead, ClassWrite or
// ClassFlush) by d nanoseconds from the call; d <= 0 returns at once. It
// returns at once between Release and Resume. If ctx ends first it
// returns an error wrapping EINTR.
func (q *Queue) Wait(ctx context.Context, c int, d int64) error {
	if d <= 0 {
		return nil
	}
	return q.q.wait(ctx, c, d)
}

// Release lets every waiting request go at once and stops delaying until
// Resume (a presuspend).
func (q *Queue) Release() { q.q.flush() }

// Resume delays again after Release.
func (q *Queue) Resume() { q.q.resume() }

// Waiting is the number of requests waiting in q now.
func (q *Queue) Waiting() int {
	q.q.mu.Lock()
	defer q.q.mu.Unlock()
	n := 0
	for c := range q.q.mu.lists {
		n += q.q.mu.lists[c].n
	}
	return n
}

// Now is the scheduler's clock, in nanoseconds.
func (q *Queue) Now() int64 { return q.q.s.clock.Nanotime() }

// Close gives the queue up; no request may wait in it any more.
func (q *Queue) Close() { q.q.close() }
