package main

// strtoull parses s as C's strtoull(s, &end, 0) does and reports whether
// the whole string was consumed (*end == '\0'): leading white space, an
// optional sign (a minus negates modulo 2^64), 0x for hexadecimal, a
// leading 0 for octal; no digits at all gives 0 with end at the start, so
// "" is 0 and consumed; an overflow gives 2^64-1.
func strtoull(s string) (uint64, bool) {
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
