package stats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/dmarg"
)

// StatsMessage handles one of the device-mapper core's dm-stats messages
// (drivers/md/dm-stats.c: dm_stats_message), given as words with the message
// name first, for a device of sizeSectors sectors:
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
// kernel reads them (sscanf: leading white space is skipped, no '+' is
// taken, nothing may follow the number, and a number too large for its
// kernel type wraps; see package dmarg). A
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
			if first, err = parsePrintArg(args[2], "first line"); err != nil {
				return "", err
			}
		}
		if args[3] != "-" {
			if n, err = parsePrintArg(args[3], "line count"); err != nil {
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

// parsePrintArg reads a @stats_print line number or line count: sscanf
// "%lu%c", 64 bits wide.
func parsePrintArg(s, what string) (uint64, error) {
	v, ok := dmarg.Uint64(s)
	if !ok {
		return 0, invalid("%s %q: not an unsigned decimal number", what, s)
	}
	return v, nil
}

// parseID reads a region id: sscanf "%d%c", and not negative.
func parseID(s string) (int, error) {
	v, ok := dmarg.Int32(s)
	if !ok {
		return 0, invalid("region id %q: not a number", s)
	}
	if v < 0 {
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
	ok := false
	if a == "-" {
		sp.Start, sp.Len = 0, sizeSectors
		if sp.Len == 0 {
			sp.Len = 1
		}
	} else if sp.Start, sp.Len, ok = scanRange(a); !ok {
		return sp, invalid("range %q: not - or <start>+<length>", a)
	}
	if end := sp.Start + sp.Len; sp.Start >= end {
		return sp, invalid("range %q: empty or past the last sector", a)
	}

	a, _ = shift()
	if n, ok := scanDivisor(a); ok {
		if n == 0 {
			return sp, invalid("step %q: area count must be at least 1", a)
		}
		sp.Step = sp.Len / uint64(n)
		if sp.Len%uint64(n) != 0 {
			sp.Step++
		}
		sp.Step = max(sp.Step, 1)
	} else if sp.Step, ok = dmarg.Uint64(a); !ok {
		return sp, invalid("step %q: not <sectors> or /<areas>", a)
	} else if sp.Step == 0 {
		return sp, invalid("step %q: must be 1 to %d sectors", a, uint64(1<<64-1))
	}

	// A first word that is a number (sscanf "%u%c") counts the options;
	// anything else is the program id.
	if n, ok := scanOptionCount(rest); ok {
		a, _ = shift()
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

// scanRange reads "<start>+<length>" as sscanf(a, "%llu+%llu%c") == 2.
func scanRange(a string) (start, n uint64, ok bool) {
	sc := dmarg.NewScanner(a)
	if start, ok = sc.Uint64(); !ok || !sc.Literal('+') {
		return 0, 0, false
	}
	if n, ok = sc.Uint64(); !ok || !sc.Done() {
		return 0, 0, false
	}
	return start, n, true
}

// scanDivisor reads "/<areas>" as sscanf(a, "/%u%c") == 1.
func scanDivisor(a string) (uint32, bool) {
	sc := dmarg.NewScanner(a)
	if !sc.Literal('/') {
		return 0, false
	}
	n, ok := sc.Uint32()
	return n, ok && sc.Done()
}

// scanOptionCount reads the first of the words left as an option count, if
// it is one (sscanf "%u%c").
func scanOptionCount(rest []string) (uint32, bool) {
	if len(rest) == 0 {
		return 0, false
	}
	return dmarg.Uint32(rest[0])
}

// parseHistogram reads histogram boundaries as parse_histogram does:
// unsigned decimals (sscanf "%llu%c", the %c a comma) separated by commas,
// strictly increasing and above 0.
func parseHistogram(h string) ([]uint64, error) {
	if i := strings.IndexByte(h, 0); i >= 0 {
		h = h[:i] // a C string
	}
	var b []uint64
	last := uint64(0)
	for _, f := range strings.Split(h, ",") {
		v, ok := dmarg.Uint64(f)
		if !ok {
			return nil, fmt.Errorf("boundary %q: not an unsigned decimal number", f)
		}
		if v <= last {
			return nil, fmt.Errorf("boundary %d: not above %d (boundaries must be strictly increasing and above 0)", v, last)
		}
		last = v
		b = append(b, v)
	}
	return b, nil
}
