package stats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// StatsMessage handles one of the device-mapper core's dm-stats messages
// (spec §4.7), given as words with the message name first, for a device of
// sizeSectors sectors:
//
//	@stats_create <range> <step> [<n> <opt>{n}] [<program_id> [<aux_data>]]
//	@stats_delete <id>
//	@stats_clear <id>
//	@stats_list [<program_id>]
//	@stats_print <id> [<first_line> <num_lines>]
//	@stats_print_clear <id> [<first_line> <num_lines>]
//	@stats_set_aux <id> <aux_data>
//
// Message names are matched without regard to case, as the kernel does.
// handled is false if args[0] is none of these. Arguments are read as the
// kernel reads them (sscanf, so a number is plain decimal digits and nothing
// may follow it); numbers too large for their kernel type are refused. A
// message that fails changes nothing; its error wraps the kernel's errno
// (EINVAL for bad arguments, ENOENT for an unknown region, EOVERFLOW for too
// many areas, ENOMEM past the memory cap, ENFILE for too many regions).
func (d *Disk) StatsMessage(args []string, sizeSectors uint64) (out string, handled bool, err error) {
	if len(args) == 0 {
		return "", false, nil
	}
	name := strings.ToLower(args[0])
	switch name {
	case "@stats_create":
		var sp RegionSpec
		if sp, err = ParseStatsCreate(args, sizeSectors); err == nil {
			var id int
			if id, err = d.StatsCreate(sp); err == nil {
				out = strconv.Itoa(id)
			}
		}
	case "@stats_delete", "@stats_clear":
		var id int
		if len(args) != 2 {
			err = wordCount(args)
		} else if id, err = parseID(args[1]); err == nil {
			if name == "@stats_delete" {
				err = d.StatsDelete(id)
			} else {
				err = d.StatsClear(id)
			}
		}
	case "@stats_list":
		switch len(args) {
		case 1:
			out = d.StatsList("", true)
		case 2:
			out = d.StatsList(args[1], false)
		default:
			err = wordCount(args)
		}
	case "@stats_print", "@stats_print_clear":
		out, err = d.statsPrintMessage(args, name == "@stats_print_clear")
	case "@stats_set_aux":
		var id int
		if len(args) != 3 {
			err = wordCount(args)
		} else if id, err = parseID(args[1]); err == nil {
			err = d.StatsSetAux(id, args[2])
		}
	default:
		return "", false, nil
	}
	if err != nil {
		se := &StatsError{Reason: err.Error(), Errno: syscall.EINVAL}
		errors.As(err, &se)
		if se.Errno == syscall.EINVAL {
			return "", true, &StatsError{Reason: "Invalid parameters for message " + args[0] + ": " + se.Reason, Errno: se.Errno}
		}
		return "", true, &StatsError{Reason: args[0] + ": " + se.Reason, Errno: se.Errno}
	}
	return out, true, nil
}

func (d *Disk) statsPrintMessage(args []string, reset bool) (string, error) {
	if len(args) != 2 && len(args) != 4 {
		return "", wordCount(args)
	}
	id, err := parseID(args[1])
	if err != nil {
		return "", err
	}
	first, n := uint64(0), ^uint64(0)
	if len(args) == 4 {
		if args[2] != "-" {
			if first, err = parseUint(args[2], 64, "first line"); err != nil {
				return "", err
			}
		}
		if args[3] != "-" {
			if n, err = parseUint(args[3], 64, "line count"); err != nil {
				return "", err
			}
		}
	}
	return d.StatsPrint(id, first, n, reset)
}

// invalid is the kernel's "Invalid parameters for message" (EINVAL), with the
// word and the reason.
func invalid(format string, a ...any) error {
	return &StatsError{Reason: fmt.Sprintf(format, a...), Errno: syscall.EINVAL}
}

func wordCount(args []string) error {
	return invalid("%d argument(s) after the message name", len(args)-1)
}

// isDigits reports whether s is a non-empty run of decimal digits: what the
// kernel's sscanf takes for %u, %lu and %llu with nothing after it.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseUint reads an unsigned decimal of at most bits bits.
func parseUint(s string, bits int, what string) (uint64, error) {
	if !isDigits(s) {
		return 0, invalid("%s %q: not an unsigned decimal number", what, s)
	}
	v, err := strconv.ParseUint(s, 10, bits)
	if err != nil {
		return 0, invalid("%s %q: out of range", what, s)
	}
	return v, nil
}

// parseID reads a region id: "%d", and not negative.
func parseID(s string) (int, error) {
	t := strings.TrimPrefix(s, "-")
	if !isDigits(t) {
		return 0, invalid("region id %q: not a number", s)
	}
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil || v < 0 {
		return 0, invalid("region id %q: must be 0 to %d", s, maxRegionID)
	}
	return int(v), nil
}

// ParseStatsCreate reads the words of an @stats_create message (the message
// name first) for a device of sizeSectors sectors, as the kernel's
// message_stats_create does.
func ParseStatsCreate(args []string, sizeSectors uint64) (RegionSpec, error) {
	sp := RegionSpec{ProgramID: "-", Aux: "-"}
	if len(args) < 3 {
		return sp, wordCount(args)
	}
	rest := args[1:]
	shift := func() (string, bool) {
		if len(rest) == 0 {
			return "", false
		}
		a := rest[0]
		rest = rest[1:]
		return a, true
	}

	a, _ := shift()
	if a == "-" {
		sp.Start, sp.Len = 0, sizeSectors
		if sp.Len == 0 {
			sp.Len = 1
		}
	} else {
		s, l, ok := strings.Cut(a, "+")
		if !ok || !isDigits(s) || !isDigits(l) {
			return sp, invalid("range %q: not - or <start>+<length>", a)
		}
		var err error
		if sp.Start, err = strconv.ParseUint(s, 10, 64); err != nil {
			return sp, invalid("range %q: start out of range", a)
		}
		if sp.Len, err = strconv.ParseUint(l, 10, 64); err != nil {
			return sp, invalid("range %q: length out of range", a)
		}
	}
	if end := sp.Start + sp.Len; sp.Start >= end {
		return sp, invalid("range %q: empty or past the last sector", a)
	}

	a, _ = shift()
	if div, ok := strings.CutPrefix(a, "/"); ok && isDigits(div) {
		n, err := strconv.ParseUint(div, 10, 32)
		if err != nil {
			return sp, invalid("step %q: area count out of range", a)
		}
		if n == 0 {
			return sp, invalid("step %q: area count must be at least 1", a)
		}
		sp.Step = sp.Len / n
		if sp.Len%n != 0 {
			sp.Step++
		}
		sp.Step = max(sp.Step, 1)
	} else {
		if !isDigits(a) {
			return sp, invalid("step %q: not <sectors> or /<areas>", a)
		}
		n, err := strconv.ParseUint(a, 10, 64)
		if err != nil || n == 0 {
			return sp, invalid("step %q: must be 1 to %d sectors", a, uint64(1<<64-1))
		}
		sp.Step = n
	}

	if len(rest) > 0 && isDigits(rest[0]) {
		a, _ = shift()
		n, err := strconv.ParseUint(a, 10, 32)
		if err != nil {
			return sp, invalid("option count %q: out of range", a)
		}
		for ; n > 0; n-- {
			opt, ok := shift()
			if !ok {
				return sp, invalid("option count %s: fewer options given", a)
			}
			switch {
			case strings.EqualFold(opt, "precise_timestamps"):
				sp.Precise = true
			case len(opt) >= 10 && strings.EqualFold(opt[:10], "histogram:"):
				if sp.Bounds != nil {
					return sp, invalid("option %q: histogram given twice", opt)
				}
				b, err := parseHistogram(opt[10:])
				if err != nil {
					return sp, invalid("option %q: %v", opt, err)
				}
				sp.Bounds = b
			default:
				return sp, invalid("option %q: unknown (precise_timestamps or histogram:b1,b2,...)", opt)
			}
		}
	}
	if a, ok := shift(); ok {
		sp.ProgramID = a
	}
	if a, ok := shift(); ok {
		sp.Aux = a
	}
	if len(rest) > 0 {
		return sp, invalid("extra argument %q after aux_data", rest[0])
	}
	return sp, nil
}

// parseHistogram reads histogram boundaries: unsigned decimals separated by
// commas, strictly increasing and above 0.
func parseHistogram(h string) ([]uint64, error) {
	var b []uint64
	last := uint64(0)
	for _, f := range strings.Split(h, ",") {
		if !isDigits(f) {
			return nil, fmt.Errorf("boundary %q: not an unsigned decimal number", f)
		}
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("boundary %q: out of range", f)
		}
		if v <= last {
			return nil, fmt.Errorf("boundary %d: not above %d (boundaries must be strictly increasing and above 0)", v, last)
		}
		last = v
		b = append(b, v)
	}
	return b, nil
}
