package logwrites

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Magic is the super block's magic number: the bytes "rhswfsj\0" on disk.
const Magic = 0x6a736677736872

// Version is the only log format version.
const Version = 1

// Entry flags (drivers/md/dm-log-writes.c: LOG_*_FLAG).
const (
	FlagFlush    = 1 << 0 // an empty flush (REQ_PREFLUSH)
	FlagFUA      = 1 << 1 // a write with REQ_FUA
	FlagDiscard  = 1 << 2 // a discard; no data follows the header
	FlagMark     = 1 << 3 // a mark; its name follows the header fields
	FlagMetadata = 1 << 4 // a REQ_META bio
)

// HeaderSize is the size of the fixed fields of a super or an entry header.
const HeaderSize = 32

// CheckSize is how much of a header unit replay-log reads when it only seeks
// (struct log_write_entry with its one byte of data, padded to 40): byte 32,
// the first byte after the fixed fields, must be zero unless the entry is a
// mark.
const CheckSize = 40

// EndMark is the mark the target logs when it is destroyed.
const EndMark = "dm-log-writes-end"

// MinSectorSize and MaxSectorSize bound the log unit of the target: the
// kernel logs in units of the data device's logical block size, a power of
// two from 512 up. A Reader takes units from CheckSize to MaxSectorSize.
const (
	MinSectorSize = 512
	MaxSectorSize = 1 << 20
)

// MaxMarkLen is the longest mark name the kernel stores for log unit s: the
// name is cut to s-32-1 bytes so that a zero byte always follows it
// (drivers/md/dm-log-writes.c: log_mark).
func MaxMarkLen(s int) int { return s - HeaderSize - 1 }

// Super is the log's super block.
type Super struct {
	Magic      uint64
	Version    uint64
	NrEntries  uint64
	SectorSize uint32
}

// PutSuper writes s into b (at least HeaderSize bytes) and zeros the rest of
// b: a full log unit is what the kernel writes. The 4 bytes after
// SectorSize, padding in the kernel's struct, are written as zeros.
func PutSuper(b []byte, s Super) {
	binary.LittleEndian.PutUint64(b[0:], s.Magic)
	binary.LittleEndian.PutUint64(b[8:], s.Version)
	binary.LittleEndian.PutUint64(b[16:], s.NrEntries)
	binary.LittleEndian.PutUint32(b[24:], s.SectorSize)
	clear(b[28:])
}

// ParseSuper decodes the first HeaderSize bytes of b; the padding is
// ignored.
func ParseSuper(b []byte) Super {
	return Super{
		Magic:      binary.LittleEndian.Uint64(b[0:]),
		Version:    binary.LittleEndian.Uint64(b[8:]),
		NrEntries:  binary.LittleEndian.Uint64(b[16:]),
		SectorSize: binary.LittleEndian.Uint32(b[24:]),
	}
}

// Header is the fixed part of an entry header.
type Header struct {
	Sector    uint64 // first unit written or discarded
	NrSectors uint64 // units written or discarded
	Flags     uint64
	DataLen   uint64 // mark name length; 0 for other entries
}

// PutHeader writes h into b (one log unit), then the mark name (if any)
// right after the fixed fields, and zeros the rest of b. name must fit:
// len(name) <= len(b)-HeaderSize.
func PutHeader(b []byte, h Header, name string) {
	binary.LittleEndian.PutUint64(b[0:], h.Sector)
	binary.LittleEndian.PutUint64(b[8:], h.NrSectors)
	binary.LittleEndian.PutUint64(b[16:], h.Flags)
	binary.LittleEndian.PutUint64(b[24:], h.DataLen)
	n := copy(b[HeaderSize:], name)
	clear(b[HeaderSize+n:])
}

// ParseHeader decodes the fixed fields of an entry header from b (at least
// HeaderSize bytes).
func ParseHeader(b []byte) Header {
	return Header{
		Sector:    binary.LittleEndian.Uint64(b[0:]),
		NrSectors: binary.LittleEndian.Uint64(b[8:]),
		Flags:     binary.LittleEndian.Uint64(b[16:]),
		DataLen:   binary.LittleEndian.Uint64(b[24:]),
	}
}

// Valid reports whether a header unit (at least CheckSize bytes of it) looks
// like an entry, by replay-log's rule (xfstests src/log-writes/log-writes.c:
// log_entry_valid): not all-zero flags with zero length, and, unless the
// flags are exactly FlagMark, a zero byte right after the fixed fields.
func Valid(unit []byte) bool {
	h := ParseHeader(unit)
	if h.Flags == 0 && h.NrSectors == 0 {
		return false
	}
	return h.Flags == FlagMark || unit[HeaderSize] == 0
}

// HasData reports whether an entry with header h is followed by data: every
// entry with a length except discards.
func (h Header) HasData() bool { return h.Flags&FlagDiscard == 0 && h.NrSectors != 0 }

// FlagNames prints flags as replay-log does (entry_flags_to_str): the names
// of the set bits in bit order joined by "|", unknown bits as UNKNOWN.0x<hex>,
// NONE when no bit is set.
func FlagNames(flags uint64) string {
	if flags == 0 {
		return "NONE"
	}
	var b strings.Builder
	for i, name := range [...]string{"FLUSH", "FUA", "DISCARD", "MARK", "METADATA"} {
		if bit := uint64(1) << i; flags&bit != 0 {
			if b.Len() > 0 {
				b.WriteByte('|')
			}
			b.WriteString(name)
			flags &^= bit
		}
	}
	if flags != 0 {
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		fmt.Fprintf(&b, "UNKNOWN.0x%x", flags)
	}
	return b.String()
}

// MarkName returns the name a mark header unit holds: the bytes after the
// fixed fields up to the first zero byte, at most DataLen of them.
func MarkName(unit []byte, dataLen uint64) string {
	b := unit[min(HeaderSize, len(unit)):]
	if dataLen < uint64(len(b)) {
		b = b[:dataLen]
	}
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// MarkMatches reports whether name matches the mark in a header unit as
// replay-log compares them (should_stop): strncmp(name, unit+32,
// data_len+1) == 0, that is, an exact match of the stored name, which the
// kernel always follows with a zero byte. Bytes past the end of unit count
// as zeros.
func MarkMatches(name string, unit []byte, dataLen uint64) bool {
	n := dataLen + 1 // wraps to 0 for a data_len of 2^64-1, which strncmp takes as equal
	for i := uint64(0); i < n; i++ {
		var a, b byte
		if i < uint64(len(name)) {
			a = name[i]
		}
		if j := HeaderSize + i; j < uint64(len(unit)) {
			b = unit[j]
		}
		if a != b {
			return false
		}
		if a == 0 {
			return true
		}
	}
	return true
}
