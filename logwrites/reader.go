package logwrites

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultWindow is the read-ahead window of a Reader when Open is given 0.
const DefaultWindow = 4 << 20

// ReadError is a read of the log that came up short: What is "super",
// "entry" or "data"; Err is the error of the read, nil when the log simply
// ended (replay-log then prints errno 0).
type ReadError struct {
	What string
	Pos  int64 // byte offset of the read
	Err  error
}

func (e *ReadError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("log ends inside the %s at byte %d", e.What, e.Pos)
	}
	return fmt.Sprintf("reading the %s at byte %d: %v", e.What, e.Pos, e.Err)
}

func (e *ReadError) Unwrap() error { return e.Err }

// MalformedError is a header unit that fails Valid.
type MalformedError struct {
	Pos  int64 // byte offset of the header unit
	Unit int64 // Pos in log units, as replay-log prints it
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("malformed entry header at log unit %d (byte %d)", e.Unit, e.Pos)
}

// Errors of Open for a log whose super is not one.
var (
	ErrMagic = errors.New("not a dm-log-writes log: magic doesn't match")
)

// VersionError is a super with a version other than Version.
type VersionError struct{ Version uint64 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("log format version %d, want %d", e.Version, Version)
}

// SectorSizeError is a super whose log unit is smaller than a header
// (CheckSize) or larger than MaxSectorSize.
type SectorSizeError struct{ SectorSize uint32 }

func (e *SectorSizeError) Error() string {
	return fmt.Sprintf("log unit of %d bytes in the super: want %d to %d", e.SectorSize, CheckSize, MaxSectorSize)
}

// Entry is one entry header as read.
type Entry struct {
	Header
	// Index is the entry's number, from 0.
	Index uint64
	// Pos is the byte offset of its header unit.
	Pos int64
	// Unit is the header unit as read: CheckSize bytes or more, at most one
	// log unit. It is valid until the next call to Next.
	Unit []byte
}

// Mark returns the name of a mark entry.
func (e *Entry) Mark() string { return MarkName(e.Unit, e.DataLen) }

// Reader walks a log entry by entry through a read-ahead window of fixed
// size, so that a log of any size is read with the same memory. It trusts
// nothing in the log: every length is checked before it is used, and a torn
// or garbage log ends in an error, never in a panic or a large allocation.
type Reader struct {
	src   io.ReaderAt
	size  int64 // bytes; < 0 when unknown
	super Super
	s     int64
	pos   int64  // byte offset of the next header unit
	index uint64 // entries read

	win  []byte
	wOff int64 // log offset of win[0]
	wLen int   // valid bytes in win
}

// Open reads the super of the log in src and returns a Reader positioned at
// entry 0. size is the log's size in bytes, or negative when unknown (then a
// short read is found only when it happens). window is the size of the
// read-ahead buffer (0: DefaultWindow); it grows to one log unit if smaller.
func Open(src io.ReaderAt, size int64, window int) (*Reader, error) {
	var b [HeaderSize]byte
	if n, err := src.ReadAt(b[:], 0); n < HeaderSize {
		if err == io.EOF {
			err = nil
		}
		return nil, &ReadError{What: "super", Pos: 0, Err: err}
	}
	sb := ParseSuper(b[:])
	if sb.Magic != Magic {
		return nil, ErrMagic
	}
	if sb.Version != Version {
		return nil, &VersionError{Version: sb.Version}
	}
	// The kernel writes a power of two from 512 up; replay-log takes any
	// size, and so does the Reader, within bounds that keep its buffers
	// small.
	s := sb.SectorSize
	if s < CheckSize || s > MaxSectorSize {
		return nil, &SectorSizeError{SectorSize: s}
	}
	if window <= 0 {
		window = DefaultWindow
	}
	window = max(window, int(s))
	return &Reader{src: src, size: size, super: sb, s: int64(s), pos: int64(s), win: make([]byte, window)}, nil
}

// Super returns the log's super block.
func (r *Reader) Super() Super { return r.super }

// SectorSize returns the log unit S in bytes.
func (r *Reader) SectorSize() int64 { return r.s }

// Index returns the number of entries read so far: the index of the next one.
func (r *Reader) Index() uint64 { return r.index }

// Pos returns the byte offset where the next entry's header unit starts.
func (r *Reader) Pos() int64 { return r.pos }

// More reports whether the super counts entries not read yet. Entries past
// the super's count may be on the device, but only the count is trusted, as
// replay-log trusts it.
func (r *Reader) More() bool { return r.index < r.super.NrEntries }

// Next reads the header unit at Pos and advances Pos past it (not past its
// data: see SkipData and Data). need is how many bytes of the unit must be
// readable: CheckSize when only seeking, SectorSize when the whole unit is
// wanted (a mark's name); more are read when the log has them. A header
// that fails Valid is a *MalformedError and Pos stays where it was.
func (r *Reader) Next(need int) (*Entry, error) {
	need = min(max(need, CheckSize), int(r.s))
	unit, err := r.view(r.pos, int(r.s), need)
	if err != nil {
		return nil, &ReadError{What: "entry", Pos: r.pos, Err: err}
	}
	if len(unit) < need {
		return nil, &ReadError{What: "entry", Pos: r.pos}
	}
	if !Valid(unit) {
		return nil, &MalformedError{Pos: r.pos, Unit: r.pos / r.s}
	}
	e := &Entry{Header: ParseHeader(unit), Index: r.index, Pos: r.pos, Unit: unit}
	r.index++
	r.pos += r.s
	return e, nil
}

// DataLen returns the length in bytes of the data that follows e's
// header: NrSectors log units for an entry with data, else 0. ok is false
// when that does not fit in 64 bits (a garbage header; replay-log would
// compute it modulo 2^64 and could walk backwards into a loop).
func (r *Reader) DataLen(e *Entry) (n uint64, ok bool) {
	if !e.HasData() {
		return 0, true
	}
	hi, lo := bits.Mul64(e.NrSectors, uint64(r.s))
	return lo, hi == 0
}

// SeekError is a move past an entry's data that cannot be made: its length
// overflows, or it ends past the largest file offset (lseek(2) fails there
// with EINVAL).
type SeekError struct {
	Pos       int64 // where the move started
	NrSectors uint64
}

func (e *SeekError) Error() string {
	return fmt.Sprintf("entry data of %d units from byte %d runs past the largest file offset", e.NrSectors, e.Pos)
}

// Unwrap returns EINVAL, as lseek does.
func (e *SeekError) Unwrap() error { return unix.EINVAL }

// SkipData moves Pos past e's data without reading it.
func (r *Reader) SkipData(e *Entry) error {
	n, ok := r.DataLen(e)
	if !ok || n > uint64(math.MaxInt64-r.pos) {
		return &SeekError{Pos: r.pos, NrSectors: e.NrSectors}
	}
	r.pos += int64(n)
	return nil
}

// Data streams e's data, in order, to fn in chunks of at most the window's
// size (each chunk is valid only during its call; off counts from the start
// of the data), and moves Pos past it. When the log's size is known, data
// that would run past its end fails before fn is called.
func (r *Reader) Data(e *Entry, fn func(chunk []byte, off int64) error) error {
	n, ok := r.DataLen(e)
	if !ok || n > uint64(math.MaxInt64-r.pos) || r.size >= 0 && r.pos+int64(n) > r.size {
		return &ReadError{What: "data", Pos: r.pos}
	}
	for done := int64(0); done < int64(n); {
		want := int(min(int64(n)-done, int64(len(r.win))))
		chunk, err := r.view(r.pos+done, want, want)
		if err != nil {
			return &ReadError{What: "data", Pos: r.pos + done, Err: err}
		}
		if len(chunk) < want {
			return &ReadError{What: "data", Pos: r.pos + done + int64(len(chunk))}
		}
		if err := fn(chunk, done); err != nil {
			return err
		}
		done += int64(want)
	}
	r.pos += int64(n)
	return nil
}

// view returns up to n bytes of the log from off (n <= len(r.win)), filling
// the window from off when it does not hold them. It returns fewer than n
// only at the end of the log; an error only for a failed read that left
// fewer than need bytes.
func (r *Reader) view(off int64, n, need int) ([]byte, error) {
	if off >= r.wOff && off-r.wOff <= int64(r.wLen) {
		if i := int(off - r.wOff); r.wLen-i >= n {
			return r.win[i : i+n], nil
		}
		// Keep what the window holds from off and read after it.
		i := int(off - r.wOff)
		r.wLen = copy(r.win, r.win[i:r.wLen])
	} else {
		r.wLen = 0
	}
	r.wOff = off
	m, err := r.src.ReadAt(r.win[r.wLen:], off+int64(r.wLen))
	r.wLen += m
	if err == io.EOF || r.wLen >= need {
		err = nil
	}
	return r.win[:min(n, r.wLen)], err
}

// Size returns the size in bytes of a log file or block device, or -1 when
// it cannot tell (a character device, a pipe).
func Size(f *os.File) int64 {
	st, err := f.Stat()
	if err != nil {
		return -1
	}
	switch {
	case st.Mode().IsRegular():
		return st.Size()
	case st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0:
		var sz uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&sz))); e != 0 || sz > math.MaxInt64 {
			return -1
		}
		return int64(sz)
	}
	return -1
}
