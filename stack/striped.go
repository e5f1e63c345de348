package stack

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Striped spreads a segment over several devices in chunks, round robin.
var Striped = &TargetType{Name: "striped", Version: [3]int{1, 7, 0}, New: newStriped}

// stripeErrorLimit is how many errors of a stripe raise a table event.
const stripeErrorLimit = 15

// stripe is one stripe: its area on its device, and its error count.
type stripe struct {
	Remap
	errors atomic.Uint32
}

type striped struct {
	stripes []stripe
	chunk   int64 // bytes
	chunkS  int64 // sectors
	event   func()
}

var (
	_ Flusher    = (*striped)(nil)
	_ Discarder  = (*striped)(nil)
	_ ZeroWriter = (*striped)(nil)
	_ MaxIOer    = (*striped)(nil)
)

// newStriped constructs a striped target.
//
//	<num_stripes> <chunk_sectors> (<dev> <offset>){num_stripes}
//
// Neither the stripe count nor the chunk size has to be a power of two; the
// segment length must divide by the stripe count, and each stripe's length by
// the chunk size. Offsets are in sectors.
func newStriped(c *Ctor, args []string) (Target, error) {
	if len(args) < 2 {
		return nil, Errorf("Not enough arguments")
	}
	n, err := ParseUint32(args[0])
	if err != nil || n == 0 {
		return nil, Errorf("Invalid stripe count")
	}
	chunk, err := ParseUint32(args[1])
	if err != nil || chunk == 0 {
		return nil, Errorf("Invalid chunk_size")
	}
	if c.Len%int64(n) != 0 {
		return nil, Errorf("Target length not divisible by number of stripes")
	}
	width := c.Len / int64(n)
	if width%int64(chunk) != 0 {
		return nil, Errorf("Target length not divisible by chunk size")
	}
	if int64(len(args)) != 2+2*int64(n) {
		return nil, Errorf("Not enough destinations specified")
	}
	s := &striped{stripes: make([]stripe, n), chunk: int64(chunk) * SectorSize, chunkS: int64(chunk), event: c.Event}
	for i := range s.stripes {
		r, err := OpenArea(c, args[2+2*i], args[3+2*i], "Couldn't parse stripe destination", width)
		if err != nil {
			var ae *ArgError
			if errors.As(err, &ae) && !strings.HasPrefix(ae.Reason, "Couldn't") {
				return nil, Errorf("Couldn't parse stripe destination: %s", ae.Reason)
			}
			return nil, err
		}
		s.stripes[i].Remap = r
	}
	return s, nil
}

// MapSector maps a target-relative byte offset to a stripe index and the byte
// offset on that stripe's device (before the stripe's own offset).
func (s *striped) mapOff(o int64) (int, int64) {
	chunk := o / s.chunk
	within := o % s.chunk
	n := int64(len(s.stripes))
	return int(chunk % n), (chunk/n)*s.chunk + within
}

// MaxIO keeps every piece inside one chunk.
func (s *striped) MaxIO() int64 { return s.chunk }

func (s *striped) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	i, o := s.mapOff(off)
	st := &s.stripes[i]
	n, err := st.ReadAt(ctx, p, o)
	s.noteError(st, err)
	return n, err
}

func (s *striped) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	i, o := s.mapOff(off)
	st := &s.stripes[i]
	n, err := st.WriteAt(ctx, p, o)
	s.noteError(st, err)
	return n, err
}

// noteError counts an I/O error against every stripe on the failing device
// and raises a table event while the count is below the limit.
func (s *striped) noteError(st *stripe, err error) {
	if err == nil || errors.Is(err, syscall.EOPNOTSUPP) {
		return
	}
	for i := range s.stripes {
		x := &s.stripes[i]
		if x.Dev != st.Dev {
			continue
		}
		if x.errors.Add(1) < stripeErrorLimit && s.event != nil {
			s.event()
		}
	}
}

// Flush sends a flush to every stripe.
func (s *striped) Flush(ctx context.Context) error {
	var first error
	for i := range s.stripes {
		if err := s.stripes[i].Flush(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// stripeStart returns the first byte offset on stripe i's device (before its
// own offset) that holds target data at or after target offset o.
func (s *striped) stripeStart(o int64, i int) int64 {
	st, dev := s.mapOff(o)
	switch {
	case st == i:
		return dev
	case st < i:
		return dev - dev%s.chunk
	default:
		return dev - dev%s.chunk + s.chunk
	}
}

// eachStripe calls f with the part of [off, off+n) that lives on each stripe,
// as a range of the stripe's area (before its offset on the device).
func (s *striped) eachStripe(off, n int64, f func(st *stripe, o, l int64) error) error {
	var first error
	for i := range s.stripes {
		b, e := s.stripeStart(off, i), s.stripeStart(off+n, i)
		if e <= b {
			continue
		}
		st := &s.stripes[i]
		if err := f(st, b, e-b); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Discard sends each stripe the part of the range that lives on it.
func (s *striped) Discard(ctx context.Context, off, n int64) error {
	return s.eachStripe(off, n, func(st *stripe, o, l int64) error { return st.Discard(ctx, o, l) })
}

// WriteZeroes sends each stripe the part of the range that lives on it.
func (s *striped) WriteZeroes(ctx context.Context, off, n int64) error {
	return s.eachStripe(off, n, func(st *stripe, o, l int64) error { return st.Dev.WriteZeroes(ctx, st.Off+o, l) })
}

// Status: TABLE `<n> <chunk> <dev> <off>...`; INFO `<n> <dev> ... 1 <A|D per
// stripe>` (drivers/md/dm-stripe.c: stripe_status). Device names are
// escaped (EscapeArg), so that the TABLE form loads again.
func (s *striped) Status(t StatusType) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(len(s.stripes)))
	if t == StatusTable {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(s.chunkS, 10))
		for i := range s.stripes {
			b.WriteByte(' ')
			b.WriteString(s.stripes[i].Table())
		}
		return b.String()
	}
	b.WriteByte(' ')
	for i := range s.stripes {
		b.WriteString(EscapeArg(s.stripes[i].Dev.Name()))
		b.WriteByte(' ')
	}
	b.WriteString("1 ")
	for i := range s.stripes {
		if s.stripes[i].errors.Load() > 0 {
			b.WriteByte('D')
		} else {
			b.WriteByte('A')
		}
	}
	return b.String()
}

func (s *striped) Close() error { return nil }
