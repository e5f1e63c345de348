package stats

import (
	"bytes"
	"fmt"
	"strconv"
)

// DiskstatsLine is one line of /proc/diskstats: major, minor, name and up to
// 17 numbers (older kernels print 11 or 15; the missing ones are 0).
type DiskstatsLine struct {
	Major, Minor uint32
	Name         string
	Fields       [17]uint64
}

// appendPadded appends v right-aligned in width columns (never cut).
func appendPadded(b []byte, v uint64, width int) []byte {
	var tmp [20]byte
	s := strconv.AppendUint(tmp[:0], v, 10)
	for i := len(s); i < width; i++ {
		b = append(b, ' ')
	}
	return append(b, s...)
}

// AppendDiskstatsLine appends l in the kernel's /proc/diskstats format:
// "%4u %7u %s" followed by " %u" seventeen times and a newline.
func AppendDiskstatsLine(b []byte, l *DiskstatsLine) []byte {
	b = appendPadded(b, uint64(l.Major), 4)
	b = append(b, ' ')
	b = appendPadded(b, uint64(l.Minor), 7)
	b = append(b, ' ')
	b = append(b, l.Name...)
	for _, v := range l.Fields {
		b = append(b, ' ')
		b = strconv.AppendUint(b, v, 10)
	}
	return append(b, '\n')
}

// AppendDiskstats appends the /proc/diskstats line of a device, as
// block/genhd.c: diskstats_show prints it: "%4u %7u %s" and 17 numbers.
func AppendDiskstats(b []byte, major, minor uint32, name string, s *Snapshot) []byte {
	l := DiskstatsLine{Major: major, Minor: minor, Name: name, Fields: s.Fields()}
	return AppendDiskstatsLine(b, &l)
}

// AppendStat appends the /sys/block/X/stat line of a device (block/genhd.c:
// part_stat_show): the same 17 numbers, each "%8u", separated by single spaces,
// then a newline.
func AppendStat(b []byte, s *Snapshot) []byte {
	for i, v := range s.Fields() {
		if i > 0 {
			b = append(b, ' ')
		}
		b = appendPadded(b, v, 8)
	}
	return append(b, '\n')
}

// AppendInflight appends the /sys/block/X/inflight line (block/genhd.c:
// part_inflight_show): "%8u %8u\n", reads then writes in flight.
func AppendInflight(b []byte, s *Snapshot) []byte {
	b = appendPadded(b, uint64(s.InFlight[0]), 8)
	b = append(b, ' ')
	b = appendPadded(b, uint64(s.InFlight[1]), 8)
	return append(b, '\n')
}

// ParseDiskstats parses /proc/diskstats text. Each non-empty line must have
// major, minor, name and 11, 15 or 17 numbers (the line lengths of kernels
// before 4.18, before 5.5, and since), separated by spaces or tabs.
func ParseDiskstats(data []byte) ([]DiskstatsLine, error) {
	var out []DiskstatsLine
	for n := 1; len(data) > 0; n++ {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		var l DiskstatsLine
		if err := parseLine(&l, f); err != nil {
			return nil, fmt.Errorf("diskstats line %d: %w", n, err)
		}
		out = append(out, l)
	}
	return out, nil
}

func parseLine(l *DiskstatsLine, f [][]byte) error {
	switch len(f) - 3 {
	case 11, 15, 17:
	default:
		return fmt.Errorf("%d fields, want 14, 18 or 20", len(f))
	}
	maj, err := strconv.ParseUint(string(f[0]), 10, 32)
	if err != nil {
		return fmt.Errorf("major: %w", err)
	}
	min, err := strconv.ParseUint(string(f[1]), 10, 32)
	if err != nil {
		return fmt.Errorf("minor: %w", err)
	}
	l.Major, l.Minor, l.Name = uint32(maj), uint32(min), string(f[2])
	for i, v := range f[3:] {
		if l.Fields[i], err = strconv.ParseUint(string(v), 10, 64); err != nil {
			return fmt.Errorf("field %d: %w", i+1, err)
		}
	}
	return nil
}
