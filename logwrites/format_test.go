package logwrites

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
)

func TestFlagNames(t *testing.T) {
	for flags, want := range map[uint64]string{
		0:                          "NONE",
		FlagFlush:                  "FLUSH",
		FlagFUA | FlagMetadata:     "FUA|METADATA",
		FlagDiscard:                "DISCARD",
		FlagMark:                   "MARK",
		0x20:                       "UNKNOWN.0x20",
		FlagFlush | 0x40 | 1<<63:   "FLUSH|UNKNOWN.0x8000000000000040",
		FlagFlush | FlagFUA | 0x1f: "FLUSH|FUA|DISCARD|MARK|METADATA",
	} {
		if got := FlagNames(flags); got != want {
			t.Errorf("FlagNames(%#x) = %q, want %q", flags, got, want)
		}
	}
}

func TestValidAndMarks(t *testing.T) {
	unit := make([]byte, 512)
	if Valid(unit) {
		t.Error("an all-zero header is valid")
	}
	PutHeader(unit, Header{Flags: FlagMark, DataLen: 4}, "mkfs")
	if !Valid(unit) || MarkName(unit, 4) != "mkfs" {
		t.Errorf("mark header: valid %v, name %q", Valid(unit), MarkName(unit, 4))
	}
	for _, tc := range []struct {
		name string
		want bool
	}{{"mkfs", true}, {"mkf", false}, {"mkfs2", false}, {"", false}} {
		if got := MarkMatches(tc.name, unit, 4); got != tc.want {
			t.Errorf("MarkMatches(%q) = %v", tc.name, got)
		}
	}
	// strncmp over data_len+1 bytes: a data_len of 2^64-1 compares nothing.
	if !MarkMatches("other", unit, 1<<64-1) {
		t.Error("data_len 2^64-1 must match anything, as strncmp(n=0) does")
	}
	PutHeader(unit, Header{Flags: FlagMark | FlagMetadata, DataLen: 4}, "mkfs")
	if Valid(unit) {
		t.Error("a header whose flags are not exactly MARK must have a zero byte 32")
	}
	PutHeader(unit, Header{Sector: 1, NrSectors: 1}, "")
	if !Valid(unit) {
		t.Error("a plain write header is not valid")
	}
	unit[HeaderSize] = 1
	if Valid(unit) {
		t.Error("a stray byte after a write header is valid")
	}
}

func TestSuperRoundTrip(t *testing.T) {
	b := bytes.Repeat([]byte{0xee}, 4096)
	s := Super{Magic: Magic, Version: Version, NrEntries: 1<<40 + 3, SectorSize: 4096}
	PutSuper(b, s)
	if ParseSuper(b) != s || string(b[:8]) != "rhswfsj\x00" || !bytes.Equal(b[28:], make([]byte, 4096-28)) {
		t.Errorf("super %x...", b[:40])
	}
}

// testEntry is an entry of a generated log with its data.
type testEntry struct {
	Header
	name string
	data []byte
}

// genLog lays out random entries.
func genLog(r *rand.Rand, s, n int) ([]byte, []testEntry) {
	var ents []testEntry
	log := make([]byte, s)
	for range n {
		var e testEntry
		switch r.IntN(5) {
		case 0:
			e.Flags = FlagFlush
		case 1:
			e.Flags = FlagMark
			e.name = strings.Repeat("m", r.IntN(MaxMarkLen(s)+1))
			e.DataLen = uint64(len(e.name))
		case 2:
			e.Flags = FlagDiscard
			e.Sector, e.NrSectors = r.Uint64N(1<<30), 1+r.Uint64N(1<<20)
		default:
			e.Flags = uint64(r.IntN(2)) * FlagFUA
			e.Sector, e.NrSectors = r.Uint64N(1<<30), 1+r.Uint64N(64)
			e.data = make([]byte, int(e.NrSectors)*s)
			for i := range e.data {
				e.data[i] = byte(r.Uint32())
			}
		}
		unit := make([]byte, s)
		PutHeader(unit, e.Header, e.name)
		log = append(log, unit...)
		log = append(log, e.data...)
		ents = append(ents, e)
	}
	PutSuper(log[:s], Super{Magic: Magic, Version: Version, NrEntries: uint64(n), SectorSize: uint32(s)})
	return log, ents
}

// TestReaderRoundTrip walks generated logs with windows smaller than an
// entry's data, alternating Data and SkipData, and finds every entry.
func TestReaderRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range []int{512, 4096} {
		log, ents := genLog(r, s, 200)
		for _, window := range []int{0, 1, 5000, 1 << 16} {
			rd, err := Open(bytes.NewReader(log), int64(len(log)), window)
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range ents {
				if !rd.More() {
					t.Fatalf("More false at entry %d of %d", i, len(ents))
				}
				e, err := rd.Next(s)
				if err != nil {
					t.Fatalf("entry %d: %v", i, err)
				}
				if e.Header != want.Header || e.Index != uint64(i) || e.Flags == FlagMark && e.Mark() != want.name {
					t.Fatalf("entry %d: %+v, want %+v %q", i, e.Header, want.Header, want.name)
				}
				if i%2 == 0 {
					if err := rd.SkipData(e); err != nil {
						t.Fatal(err)
					}
					continue
				}
				var got []byte
				if err := rd.Data(e, func(chunk []byte, off int64) error {
					if off != int64(len(got)) {
						t.Fatalf("chunk at %d after %d bytes", off, len(got))
					}
					got = append(got, chunk...)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want.data) {
					t.Fatalf("entry %d: data differs", i)
				}
			}
			if rd.More() || rd.Pos() != int64(len(log)) {
				t.Errorf("after the last entry: More %v, Pos %d of %d", rd.More(), rd.Pos(), len(log))
			}
		}
	}
}

// TestReaderErrors: torn and garbage logs end in errors that say what and
// where.
func TestReaderErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	log, _ := genLog(r, 512, 3)
	for _, tc := range []struct {
		name string
		log  []byte
		want func(error) bool
	}{
		{"short super", log[:20], func(err error) bool {
			var re *ReadError
			return errors.As(err, &re) && re.What == "super" && re.Err == nil
		}},
		{"magic", append([]byte("xhswfsj\x00"), log[8:]...), func(err error) bool { return errors.Is(err, ErrMagic) }},
		{"version", func() []byte { b := bytes.Clone(log); b[8] = 9; return b }(), func(err error) bool {
			var ve *VersionError
			return errors.As(err, &ve) && ve.Version == 9
		}},
		{"sector size", func() []byte { b := bytes.Clone(log); b[24], b[25] = 8, 0; return b }(), func(err error) bool {
			var se *SectorSizeError
			return errors.As(err, &se) && se.SectorSize == 8
		}},
	} {
		if _, err := Open(bytes.NewReader(tc.log), int64(len(tc.log)), 0); !tc.want(err) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}

	// A torn entry header, torn data, a malformed header, a seek past
	// the largest offset.
	b := buildOne(512, Header{Sector: 0, NrSectors: 4}, 4*512)
	rd, _ := Open(bytes.NewReader(b[:512+100]), -1, 0)
	if _, err := rd.Next(512); !isRead(err, "entry") {
		t.Errorf("torn header: %v", err)
	}
	rd, _ = Open(bytes.NewReader(b[:len(b)-1]), int64(len(b)-1), 0)
	e, err := rd.Next(512)
	if err != nil {
		t.Fatal(err)
	}
	called := false
	if err := rd.Data(e, func([]byte, int64) error { called = true; return nil }); !isRead(err, "data") || called {
		t.Errorf("torn data with a known size: %v (fn called %v)", err, called)
	}
	rd, _ = Open(bytes.NewReader(b[:len(b)-1]), -1, 1024)
	e, _ = rd.Next(512)
	if err := rd.Data(e, func([]byte, int64) error { return nil }); !isRead(err, "data") {
		t.Errorf("torn data, size unknown: %v", err)
	}
	bad := bytes.Clone(b)
	bad[512+HeaderSize] = 'A'
	rd, _ = Open(bytes.NewReader(bad), int64(len(bad)), 0)
	var me *MalformedError
	if _, err := rd.Next(512); !errors.As(err, &me) || me.Unit != 1 || rd.Pos() != 512 {
		t.Errorf("malformed header: %v, Pos %d", err, rd.Pos())
	}
	for _, nr := range []uint64{1 << 54, 1<<55 - 1, 1 << 63} { // 2^63 bytes; 2^64-512, which wraps to a move back; 2^72
		huge := buildOne(512, Header{Sector: 0, NrSectors: nr}, 0)
		rd, _ = Open(bytes.NewReader(huge), -1, 0)
		e, _ = rd.Next(512)
		if err := rd.SkipData(e); !errors.Is(err, syscall.EINVAL) || rd.Pos() != 1024 {
			t.Errorf("skip of %d units: %v, Pos %d", nr, err, rd.Pos())
		}
		if err := rd.Data(e, func([]byte, int64) error { return nil }); !isRead(err, "data") {
			t.Errorf("data of %d units: %v", nr, err)
		}
	}
}

func buildOne(s int, h Header, data int) []byte {
	b := make([]byte, 2*s+data)
	PutSuper(b[:s], Super{Magic: Magic, Version: Version, NrEntries: 1, SectorSize: uint32(s)})
	PutHeader(b[s:2*s], h, "")
	return b
}

func isRead(err error, what string) bool {
	var re *ReadError
	return errors.As(err, &re) && re.What == what
}

// errReaderAt fails every read past off.
type errReaderAt struct {
	b   []byte
	off int64
}

func (e errReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= e.off {
		return 0, syscall.EIO
	}
	n := copy(p, e.b[off:min(int64(len(e.b)), e.off)])
	if n < len(p) {
		return n, syscall.EIO
	}
	return n, nil
}

// TestReaderReadFailure: a failed read of the log is reported with its
// error, not as the end of the log.
func TestReaderReadFailure(t *testing.T) {
	b := buildOne(512, Header{Sector: 0, NrSectors: 4}, 4*512)
	rd, err := Open(errReaderAt{b, 1024}, -1, 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := rd.Next(512)
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.Data(e, func([]byte, int64) error { return nil }); !errors.Is(err, syscall.EIO) {
		t.Errorf("data read failing with EIO: %v", err)
	}
}

// FuzzReader walks whatever it is given as a log: the reader must end in
// an error or at the super's count, never panic, and hand out no more data
// than the log holds.
func FuzzReader(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, s := range []int{512, 4096} {
		log, _ := genLog(r, s, 6)
		f.Add(log, uint16(0))
		f.Add(log[:len(log)/2], uint16(700))
	}
	f.Add([]byte("rhswfsj\x00\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x28\x00\x00\x00"), uint16(1))
	f.Fuzz(func(t *testing.T, log []byte, opts uint16) {
		size := int64(len(log))
		if opts&1 != 0 {
			size = -1
		}
		rd, err := Open(bytes.NewReader(log), size, int(opts>>1))
		if err != nil {
			return
		}
		var total int64
		for steps := 0; rd.More(); steps++ {
			if steps > len(log) {
				t.Fatalf("%d entries read from a log of %d bytes", steps, len(log))
			}
			e, err := rd.Next(int(rd.SectorSize()))
			if err != nil {
				return
			}
			if e.Flags&FlagMark != 0 {
				_ = e.Mark()
			}
			if steps%2 == 0 {
				if rd.SkipData(e) != nil {
					return
				}
				continue
			}
			if err := rd.Data(e, func(chunk []byte, off int64) error {
				total += int64(len(chunk))
				if total > int64(len(log)) {
					t.Fatalf("%d bytes of data from a log of %d", total, len(log))
				}
				return nil
			}); err != nil {
				if errors.Is(err, io.EOF) {
					t.Fatalf("EOF leaked: %v", err)
				}
				return
			}
		}
	})
}
