// Package getopt reads a command line as glibc's getopt_long does, so that a
// port of a C tool (dmsetup, replay-log) reads every command line the tool
// reads and rejects the same ones with the same messages:
//
//   - arguments that are not options are set aside (GNU permutation) and "--"
//     ends the options; with POSIXLY_CORRECT set (Parser.Posix), the first
//     argument that is not an option ends them;
//   - short options may be clustered (-vv); one that takes an argument takes
//     the rest of its word or else the next word (-j253, -j 253);
//   - a long option is --name, --name=value or --name value; a prefix of a
//     name is accepted when it is unique, or when every name it fits has the
//     same argument kind and value as the first of them in table order (then
//     the first is taken), else it is ambiguous.
//
// It imports nothing from dmfuse.
package getopt

import (
	"fmt"
	"strings"
)

// Option is one entry of a getopt_long option table.
type Option struct {
	// Name is the long name, without "--".
	Name string
	// HasArg is true for required_argument, false for no_argument.
	HasArg bool
	// Val is what getopt_long returns for the option: a short option
	// letter, or a value that tells the option apart. Two options that a
	// prefix fits are ambiguous only when their HasArg or Val differ.
	Val int
}

// Parser scans one command line. Set its fields, then call Next until it
// reports the end; Rest then returns the arguments that are not options.
type Parser struct {
	// Prog is the program name that messages start with.
	Prog string
	// Args is the command line without the program name.
	Args []string
	// Shorts is the short option string: letters, each followed by ':'
	// when the option takes an argument.
	Shorts string
	// Longs is the long option table, in the tool's order (which is the
	// order of the possibilities an ambiguous prefix lists).
	Longs []Option
	// Posix stops the options at the first argument that is not one.
	Posix bool

	i     int      // next argument
	sub   int      // position inside a cluster of short options, 0 when none
	words []string // the arguments that are not options, so far
	done  bool
}

// Opt is one option found.
type Opt struct {
	// Long is the option's index in Longs, or -1 for a short option.
	Long int
	// Val is the short option's letter, or the long option's Val.
	Val int
	// Arg is the option's argument ("" for none).
	Arg string
}

// Next returns the next option. ok is false once the options are over. A
// non-nil err is glibc's message (one line without its newline, starting with
// Prog) for an option getopt_long answers with '?'; ok is then true and the
// scan may go on.
func (p *Parser) Next() (o Opt, ok bool, err error) {
	for p.sub == 0 {
		if p.done || p.i >= len(p.Args) {
			p.done = true
			return o, false, nil
		}
		a := p.Args[p.i]
		if a == "--" {
			p.words = append(p.words, p.Args[p.i+1:]...)
			p.i, p.done = len(p.Args), true
			return o, false, nil
		}
		if len(a) < 2 || a[0] != '-' {
			if p.Posix {
				p.words = append(p.words, p.Args[p.i:]...)
				p.i, p.done = len(p.Args), true
				return o, false, nil
			}
			p.words = append(p.words, a)
			p.i++
			continue
		}
		if strings.HasPrefix(a, "--") {
			return p.long(a[2:])
		}
		p.sub = 1
	}
	a := p.Args[p.i]
	c := a[p.sub]
	p.sub++
	if p.sub >= len(a) {
		p.sub = 0
		p.i++
	}
	k := strings.IndexByte(p.Shorts, c)
	if c == ':' || k < 0 {
		return Opt{Long: -1, Val: int(c)}, true, fmt.Errorf("%s: invalid option -- '%c'", p.Prog, c)
	}
	o = Opt{Long: -1, Val: int(c)}
	if k+1 < len(p.Shorts) && p.Shorts[k+1] == ':' {
		if p.sub > 0 { // the rest of the word
			o.Arg = a[p.sub:]
			p.sub = 0
			p.i++
		} else {
			if p.i >= len(p.Args) {
				return o, true, fmt.Errorf("%s: option requires an argument -- '%c'", p.Prog, c)
			}
			o.Arg = p.Args[p.i]
			p.i++
		}
	}
	return o, true, nil
}

// long handles one --body argument.
func (p *Parser) long(body string) (o Opt, ok bool, err error) {
	p.i++
	name, value, hasValue := strings.Cut(body, "=")
	found := -1
	for k, l := range p.Longs {
		if l.Name == name {
			found = k
			break
		}
	}
	if found < 0 {
		var ambig []int
		for k, l := range p.Longs {
			if !strings.HasPrefix(l.Name, name) {
				continue
			}
			if found < 0 {
				found = k
				continue
			}
			if f := p.Longs[found]; f.HasArg != l.HasArg || f.Val != l.Val {
				if ambig == nil {
					ambig = append(ambig, found)
				}
				ambig = append(ambig, k)
			}
		}
		if ambig != nil {
			var b strings.Builder
			fmt.Fprintf(&b, "%s: option '--%s' is ambiguous; possibilities:", p.Prog, body)
			for _, k := range ambig {
				fmt.Fprintf(&b, " '--%s'", p.Longs[k].Name)
			}
			return Opt{Long: -1}, true, fmt.Errorf("%s", b.String())
		}
	}
	if found < 0 {
		return Opt{Long: -1}, true, fmt.Errorf("%s: unrecognized option '--%s'", p.Prog, body)
	}
	l := p.Longs[found]
	o = Opt{Long: found, Val: l.Val}
	switch {
	case hasValue && !l.HasArg:
		return o, true, fmt.Errorf("%s: option '--%s' doesn't allow an argument", p.Prog, l.Name)
	case hasValue:
		o.Arg = value
	case l.HasArg:
		if p.i >= len(p.Args) {
			return o, true, fmt.Errorf("%s: option '--%s' requires an argument", p.Prog, l.Name)
		}
		o.Arg = p.Args[p.i]
		p.i++
	}
	return o, true, nil
}

// Rest returns the arguments that are not options, in order: those set
// aside while scanning and, once Next has reported the end, those after "--"
// or, with Posix, from the first argument that is not an option on.
func (p *Parser) Rest() []string { return p.words }
