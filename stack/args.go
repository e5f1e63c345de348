package stack

import (
	"strings"

	"github.com/dmfuse/dmfuse/internal/dmarg"
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

// Uint consumes one number in [min, max], read as the kernel's dm_read_arg
// reads it (sscanf "%u%c": leading white space skipped, no sign, wrapping to
// 32 bits; see package dmarg); on failure it returns an *ArgError with reason
// errMsg.
func (a *Args) Uint(min, max uint32, errMsg string) (uint32, error) {
	s, ok := a.Next()
	if !ok {
		return 0, Errorf("%s", errMsg)
	}
	v, ok := dmarg.Uint32(s)
	if !ok || v < min || v > max {
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
// does (dmarg.Kstrtouint): the whole word is the number, one leading '+' and
// one trailing newline are allowed, a value too large is an error.
func ParseUint32(s string) (uint32, error) { return dmarg.Kstrtouint(s) }

// ParseUint64 parses an unsigned 64-bit decimal as the kernel's kstrtoull
// does (dmarg.Kstrtoull).
func ParseUint64(s string) (uint64, error) { return dmarg.Kstrtoull(s) }

// ParseSector parses a sector number used as an offset into a device as the
// kernel's targets read it, with sscanf "%llu%c" (dmarg.Uint64); the result
// must also fit in bytes as an int64.
func ParseSector(s string) (int64, error) {
	v, ok := dmarg.Uint64(s)
	if !ok {
		return 0, dmarg.ErrInvalid
	}
	if v > maxSectors {
		return 0, dmarg.ErrRange
	}
	return int64(v), nil
}

// maxSectors is the largest device size in sectors (LLONG_MAX >> 9).
const maxSectors = 1<<54 - 1
