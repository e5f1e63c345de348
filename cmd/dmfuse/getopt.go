package main

import (
	"fmt"
	"io"
	"strings"
)

// longOpt is one entry of a getopt_long option table.
type longOpt struct {
	name   string
	hasArg bool // required_argument; no_argument otherwise
	val    byte // what getopt_long returns: 0 for table options, else a short option letter
}

// getopt parses a command line as glibc's getopt_long does with a short
// option string of letters without arguments and a table of long options,
// so that a port of a C tool reads every command line the tool reads, and
// rejects the same ones with the same messages:
//
//   - arguments that are not options are skipped (permuted to the end) and
//     "--" ends the options; with POSIXLY_CORRECT set, the first
//     non-option ends them;
//   - a long option is --name, --name=value or --name value; a prefix of a
//     name is accepted when it is unique, or when every name it fits has
//     the same argument kind and value as the first of them in table order
//     (then the first is taken), else it is ambiguous;
//   - short options may be clustered (-vv).
type getopt struct {
	prog   string
	args   []string
	shorts string
	longs  []longOpt
	posix  bool
	errw   io.Writer

	i   int // next argument
	sub int // position inside a cluster of short options, 0 when none
}

// gotOpt is one option found: long is its index in the table, or -1 for a
// short option (short is then its letter).
type gotOpt struct {
	long  int
	short byte
	arg   string
}

// next returns the next option. ok is false when the options are over; bad
// is true (and the message printed) for an option getopt_long answers with
// '?'.
func (g *getopt) next() (o gotOpt, ok, bad bool) {
	for g.sub == 0 {
		if g.i >= len(g.args) {
			return o, false, false
		}
		a := g.args[g.i]
		if a == "--" {
			g.i = len(g.args)
			return o, false, false
		}
		if len(a) < 2 || a[0] != '-' {
			if g.posix {
				return o, false, false
			}
			g.i++
			continue
		}
		if strings.HasPrefix(a, "--") {
			return g.long(a[2:])
		}
		g.sub = 1
	}
	a := g.args[g.i]
	c := a[g.sub]
	g.sub++
	if g.sub >= len(a) {
		g.sub = 0
		g.i++
	}
	if c == ':' || strings.IndexByte(g.shorts, c) < 0 {
		fmt.Fprintf(g.errw, "%s: invalid option -- '%c'\n", g.prog, c)
		return o, true, true
	}
	return gotOpt{long: -1, short: c}, true, false
}

// long handles one --body argument.
func (g *getopt) long(body string) (o gotOpt, ok, bad bool) {
	g.i++
	name, value, hasValue := strings.Cut(body, "=")
	found := -1
	for k, l := range g.longs {
		if l.name == name {
			found = k
			break
		}
	}
	if found < 0 {
		var ambig []int
		for k, l := range g.longs {
			if !strings.HasPrefix(l.name, name) {
				continue
			}
			if found < 0 {
				found = k
				continue
			}
			if f := g.longs[found]; f.hasArg != l.hasArg || f.val != l.val {
				if ambig == nil {
					ambig = append(ambig, found)
				}
				ambig = append(ambig, k)
			}
		}
		if ambig != nil {
			fmt.Fprintf(g.errw, "%s: option '--%s' is ambiguous; possibilities:", g.prog, body)
			for _, k := range ambig {
				fmt.Fprintf(g.errw, " '--%s'", g.longs[k].name)
			}
			fmt.Fprintln(g.errw)
			return o, true, true
		}
	}
	if found < 0 {
		fmt.Fprintf(g.errw, "%s: unrecognized option '--%s'\n", g.prog, body)
		return o, true, true
	}
	l := g.longs[found]
	o = gotOpt{long: found, short: l.val}
	switch {
	case hasValue && !l.hasArg:
		fmt.Fprintf(g.errw, "%s: option '--%s' doesn't allow an argument\n", g.prog, l.name)
		return o, true, true
	case hasValue:
		o.arg = value
	case l.hasArg:
		if g.i >= len(g.args) {
			fmt.Fprintf(g.errw, "%s: option '--%s' requires an argument\n", g.prog, l.name)
			return o, true, true
		}
		o.arg = g.args[g.i]
		g.i++
	}
	return o, true, false
}

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
