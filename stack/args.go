package stack

import (
	"strconv"
	"strings"
)

// SplitArgs splits a target's parameter string into arguments as the kernel
// does (dm_split_args): runs of whitespace separate arguments, a backslash
// escapes the next character and is removed, a backslash at the very end is
// kept, and an empty string gives no arguments.
func SplitArgs(s string) []string {
	var out []string
	var cur strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			in = true
		case isSpace(c):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// EscapeArg escapes whitespace and backslashes in one argument so that
// SplitArgs gives it back unchanged.
func EscapeArg(a string) string {
	if !strings.ContainsAny(a, " \t\n\v\f\r\\") {
		return a
	}
	var b strings.Builder
	for i := 0; i < len(a); i++ {
		if isSpace(a[i]) || a[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(a[i])
	}
	return b.String()
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// Args reads a target's arguments in order, like the kernel's dm_arg_set.
type Args struct {
	args []string
}

// NewArgs returns a reader over args.
func NewArgs(args []string) *Args { return &Args{args: args} }

// Len is the number of arguments left.
func (a *Args) Len() int { return len(a.args) }

// Rest returns the arguments left without consuming them.
func (a *Args) Rest() []string { return a.args }

// Next consumes one argument; ok is false when none is left.
func (a *Args) Next() (s string, ok bool) {
	if len(a.args) == 0 {
		return "", false
	}
	s, a.args = a.args[0], a.args[1:]
	return s, true
}

// Skip consumes n arguments (or all that are left).
func (a *Args) Skip(n int) {
	if n > len(a.args) {
		n = len(a.args)
	}
	a.args = a.args[n:]
}

// Uint consumes one unsigned 32-bit decimal in [min, max] (dm_read_arg);
// on failure it returns an *ArgError with reason errMsg.
func (a *Args) Uint(min, max uint32, errMsg string) (uint32, error) {
	s, ok := a.Next()
	if !ok {
		return 0, Errorf("%s", errMsg)
	}
	v, err := ParseUint32(s)
	if err != nil || v < min || v > max {
		return 0, Errorf("%s", errMsg)
	}
	return v, nil
}

// Group consumes a count in [min, max] that must not exceed the arguments
// left after it (dm_read_arg_group).
func (a *Args) Group(min, max uint32, errMsg string) (uint32, error) {
	v, err := a.Uint(min, max, errMsg)
	if err != nil {
		return 0, err
	}
	if int(v) > len(a.args) {
		return 0, Errorf("%s", errMsg)
	}
	return v, nil
}

// ParseUint32 parses an unsigned 32-bit decimal as the kernel's kstrtouint
// does: the whole token must be a number; a leading '+' is allowed.
func ParseUint32(s string) (uint32, error) {
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "+"), 10, 32)
	return uint32(v), err
}

// ParseUint64 parses an unsigned 64-bit decimal (kstrtoull, sscanf "%llu%c").
func ParseUint64(s string) (uint64, error) {
	return strconv.ParseUint(strings.TrimPrefix(s, "+"), 10, 64)
}

// ParseSector parses a sector number used as an offset into a device; the
// result must fit in bytes as an int64.
func ParseSector(s string) (int64, error) {
	v, err := ParseUint64(s)
	if err != nil || v > maxSectors {
		return 0, strconv.ErrRange
	}
	return int64(v), nil
}

// maxSectors is the largest device size in sectors (LLONG_MAX >> 9).
const maxSectors = 1<<54 - 1
