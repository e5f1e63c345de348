// Package dmarg reads the numbers in target arguments and messages by the
// Linux kernel's rules, so that dmfuse accepts and refuses the same words as
// device-mapper. It imports nothing from dmfuse: stack, selectors and stats all
// use it.
//
// The kernel reads such numbers with one of two families of functions:
//
//   - sscanf (lib/vsprintf.c: vsscanf, simple_strntoull), almost always as
//     sscanf(arg, "%u%c", &v, &dummy) == 1. The conversion skips leading
//     white space (the kernel's isspace, which includes 0xA0), then needs a
//     decimal digit: %u and %llu take no sign at all, %d takes one '-'. The
//     base is 10 whatever the prefix, so "010" is ten and "0x10" stops at
//     the 'x'. There is no overflow check: the value wraps modulo 2^64 and
//     is then cut to the width of its destination, so "4294967297" read with
//     %u is 1 and "18446744073709551616" read with %llu is 0. The trailing
//     "%c" matches any character left after the number, trailing white space
//     and newlines included, and makes the call return 2: a failure.
//     Uint32, Uint64, Int32 and Scanner follow these rules.
//   - kstrtouint and kstrtoull (lib/kstrtox.c) with base 10: one leading '+'
//     is allowed, no white space before the digits, one trailing newline is
//     allowed, nothing else may follow; a value too large for the type is
//     -ERANGE, anything else malformed -EINVAL. Kstrtouint and Kstrtoull
//     follow these rules.
//
// Userspace tools that dmfuse stands in for read their numbers with the C
// library's strtoull(s, &end, 0) (replay-log's --start-mark and
// --check): Strtoull follows glibc's rules.
//
// A C string ends at its first NUL; so does every string read here.
//
// Where each rule applies:
//
//	dm-table.c dm_read_arg, dm_read_arg_group    %u%c     Uint32 (stack.Args.Uint, Args.Group)
//	dm-linear.c, dm-flakey.c, dm-delay.c,
//	  dm-dust.c, dm-stripe.c: <offset>           %llu%c   Uint64 (stack.ParseSector)
//	dm-stripe.c stripe_ctr: #stripes, chunk_size kstrtouint Kstrtouint (stack.ParseUint32)
//	dm-dust.c dust_ctr: blksz                    kstrtouint Kstrtouint (stack.ParseUint32)
//	dm-dust.c dust_message: block, count         %llu%c, %u%c
//	dm-flakey.c parse_features                   dm_read_arg (%u%c)
//	dm-mpath.c parse_features, parse_hw_handler,
//	  parse_priority_group, multipath_ctr        dm_read_arg (%u%c)
//	dm-mpath.c switch_pg_num, bypass_pg_num      %u%c
//	dm-round-robin.c, dm-queue-length.c,
//	  dm-service-time.c, dm-historical-service-time.c:
//	  selector and per-path arguments            %u%c
//	dm-stats.c message_stats_create: range       %llu+%llu%c (== 2)
//	  step                                       /%u%c, else %llu%c
//	  #feature args                              %u%c (else program_id)
//	  histogram boundaries                       %llu%c, the %c a ','
//	dm-stats.c @stats_delete, @stats_clear,
//	  @stats_print, @stats_set_aux: region id    %d%c
//	dm-stats.c @stats_print: lines               %lu%c (64 bits)
package dmarg

import (
	"math"
	"strings"
	"syscall"
)

// Error is a number that kstrtouint or kstrtoull refuses.
type Error struct {
	Reason string
	Errno  syscall.Errno // EINVAL or ERANGE, as the kernel returns them
}

func (e *Error) Error() string { return e.Reason }

// Unwrap returns the errno.
func (e *Error) Unwrap() error { return e.Errno }

var (
	// ErrInvalid is kstrto*'s -EINVAL: not a decimal number.
	ErrInvalid error = &Error{Reason: "not an unsigned decimal number", Errno: syscall.EINVAL}
	// ErrRange is kstrto*'s -ERANGE: a number too large for its type.
	ErrRange error = &Error{Reason: "number out of range", Errno: syscall.ERANGE}
)

// cString returns s up to its first NUL, as C code sees it.
func cString(s string) string {
	if i := strings.IndexByte(s, 0); i >= 0 {
		return s[:i]
	}
	return s
}

// IsSpace is the kernel's isspace (lib/ctype.c): the ASCII white space
// characters and 0xA0.
func IsSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\v', '\f', '\r', 0xa0:
		return true
	}
	return false
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// Scanner reads a string from left to right as the kernel's vsscanf does, one
// conversion or literal at a time, so that a call such as
//
//	sscanf(a, "%llu+%llu%c", &start, &len, &dummy) == 2
//
// reads as
//
//	sc := dmarg.NewScanner(a)
//	start, ok1 := sc.Uint64()
//	ok := ok1 && sc.Literal('+')
//	len, ok2 := sc.Uint64()
//	ok = ok && ok2 && sc.Done()
//
// The zero Scanner reads the empty string.
type Scanner struct{ s string }

// NewScanner returns a Scanner over s (up to its first NUL).
func NewScanner(s string) Scanner { return Scanner{s: cString(s)} }

// Literal matches one ordinary format character: the next character of the
// string must be c.
func (sc *Scanner) Literal(c byte) bool {
	if sc.s == "" || sc.s[0] != c {
		return false
	}
	sc.s = sc.s[1:]
	return true
}

// Done reports whether the string is used up: a "%c" at this point would not
// match, so sscanf would not count it.
func (sc *Scanner) Done() bool { return sc.s == "" }

// number is one integer conversion in base 10: white space, an optional '-'
// if signed, at least one digit, then as many digits as follow, the value
// wrapping modulo 2^64 (simple_strntoull). A '-' negates the result as
// simple_strntoll does. On failure nothing is consumed.
func (sc *Scanner) number(signed bool) (uint64, bool) {
	s := sc.s
	i := 0
	for i < len(s) && IsSpace(s[i]) {
		i++
	}
	neg := signed && i < len(s) && s[i] == '-'
	if neg {
		i++
	}
	if i == len(s) || !isDigit(s[i]) {
		return 0, false
	}
	var v uint64
	for ; i < len(s) && isDigit(s[i]); i++ {
		v = v*10 + uint64(s[i]-'0')
	}
	sc.s = s[i:]
	if neg {
		v = -v
	}
	return v, true
}

// Uint64 is one %llu (or %lu, which is 64 bits wide where dmfuse runs).
func (sc *Scanner) Uint64() (uint64, bool) { return sc.number(false) }

// Uint32 is one %u: the 64-bit value cut to 32 bits.
func (sc *Scanner) Uint32() (uint32, bool) {
	v, ok := sc.number(false)
	return uint32(v), ok
}

// Int32 is one %d: the 64-bit value cut to a 32-bit int.
func (sc *Scanner) Int32() (int32, bool) {
	v, ok := sc.number(true)
	return int32(v), ok
}

// Uint32 is sscanf(s, "%u%c", &v, &dummy) == 1. On failure it returns 0.
func Uint32(s string) (uint32, bool) { return whole(s, (*Scanner).Uint32) }

// Uint64 is sscanf(s, "%llu%c", &v, &dummy) == 1 (and "%lu%c").
func Uint64(s string) (uint64, bool) { return whole(s, (*Scanner).Uint64) }

// Int32 is sscanf(s, "%d%c", &v, &dummy) == 1.
func Int32(s string) (int32, bool) { return whole(s, (*Scanner).Int32) }

// whole is one conversion that must use up s: what "%c" after it checks.
func whole[T uint32 | uint64 | int32](s string, conv func(*Scanner) (T, bool)) (T, bool) {
	sc := NewScanner(s)
	if v, ok := conv(&sc); ok && sc.Done() {
		return v, true
	}
	return 0, false
}

// Kstrtoull is kstrtoull(s, 10, &v).
func Kstrtoull(s string) (uint64, error) {
	s = cString(s)
	s = strings.TrimPrefix(s, "+")
	var v uint64
	n := 0
	overflow := false
	for ; n < len(s) && isDigit(s[n]); n++ {
		d := uint64(s[n] - '0')
		if v > (math.MaxUint64-d)/10 {
			overflow = true
		}
		v = v*10 + d
	}
	switch rest := strings.TrimPrefix(s[n:], "\n"); {
	case overflow:
		return 0, ErrRange
	case n == 0 || rest != "":
		return 0, ErrInvalid
	}
	return v, nil
}

// Kstrtouint is kstrtouint(s, 10, &v).
func Kstrtouint(s string) (uint32, error) {
	v, err := Kstrtoull(s)
	if err != nil {
		return 0, err
	}
	if v > math.MaxUint32 {
		return 0, ErrRange
	}
	return uint32(v), nil
}

// Strtoull parses s as C's Strtoull(s, &end, 0) does and reports whether
// the whole string was consumed (*end == '\0'): leading white space, an
// optional sign (a minus negates modulo 2^64), 0x for hexadecimal, a
// leading 0 for octal; no digits at all gives 0 with end at the start, so
// "" is 0 and consumed; an overflow gives 2^64-1.
func Strtoull(s string) (uint64, bool) {
	i := 0
	for i < len(s) && (s[i] == ' ' || s[i] >= '\t' && s[i] <= '\r') {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	base := uint64(10)
	if i < len(s) && s[i] == '0' {
		base = 8
		if i+2 < len(s) && (s[i+1] == 'x' || s[i+1] == 'X') && hexDigit(s[i+2]) < 16 {
			base = 16
			i += 2
		}
	}
	start := i
	var v uint64
	over := false
	for ; i < len(s); i++ {
		d := uint64(hexDigit(s[i]))
		if d >= base {
			break
		}
		if v > (1<<64-1-d)/base {
			over = true
		}
		v = v*base + d
	}
	if i == start {
		return 0, len(s) == 0
	}
	if over {
		return 1<<64 - 1, i == len(s)
	}
	if neg {
		v = -v
	}
	return v, i == len(s)
}

// hexDigit returns the value of a digit in base up to 16, or 16 for
// anything else.
func hexDigit(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 16
}
