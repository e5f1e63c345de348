package getopt

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

var testLongs = []Option{
	{Name: "table", HasArg: true, Val: 1},
	{Name: "target", HasArg: true, Val: 2},
	{Name: "find", Val: 3},
	{Name: "fsck", HasArg: true, Val: 4},
	{Name: "verbose", Val: 'v'},
	{Name: "verify", Val: 'v'},
	{Name: "force", Val: 'f'},
}

const testShorts = "fj:v"

// scan runs a parser to the end and returns what it found, one string per
// option (its Long, Val and Arg), the other words, and the first error.
func scan(args []string, posix bool) (opts []string, words []string, err error) {
	p := &Parser{Prog: "prog", Args: args, Shorts: testShorts, Longs: testLongs, Posix: posix}
	for {
		o, ok, err := p.Next()
		if err != nil {
			return opts, nil, err
		}
		if !ok {
			return opts, p.Rest(), nil
		}
		opts = append(opts, fmt.Sprintf("%d/%d/%s", o.Long, o.Val, o.Arg))
	}
}

func TestParser(t *testing.T) {
	for _, c := range []struct {
		args  string
		posix bool
		opts  []string
		words []string
		err   string
	}{
		{args: "a --table x b", opts: []string{"0/1/x"}, words: []string{"a", "b"}},
		{args: "--table=a=b c", opts: []string{"0/1/a=b"}, words: []string{"c"}},
		{args: "--tab x --fi", opts: []string{"0/1/x", "2/3/"}},
		{args: "--ta x", err: "prog: option '--ta' is ambiguous; possibilities: '--table' '--target'"},
		{args: "--f", err: "prog: option '--f' is ambiguous; possibilities: '--find' '--fsck' '--force'"},
		{args: "--ver", opts: []string{"4/118/"}}, // verbose and verify: same kind and value
		{args: "--bogus=1", err: "prog: unrecognized option '--bogus=1'"},
		{args: "--find=x", err: "prog: option '--find' doesn't allow an argument"},
		{args: "--fsck", err: "prog: option '--fsck' requires an argument"},
		{args: "-vvf -j253 -j 4 w", opts: []string{"-1/118/", "-1/118/", "-1/102/", "-1/106/253", "-1/106/4"}, words: []string{"w"}},
		{args: "-vj", err: "prog: option requires an argument -- 'j'"},
		{args: "-vx", err: "prog: invalid option -- 'x'"},
		{args: "-:", err: "prog: invalid option -- ':'"},
		{args: "- a -- -v --find", words: []string{"-", "a", "-v", "--find"}},
		{args: "-v a -v", posix: true, opts: []string{"-1/118/"}, words: []string{"a", "-v"}},
		{args: "--"},
	} {
		opts, words, err := scan(strings.Fields(c.args), c.posix)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if msg != c.err || c.err == "" && (!reflect.DeepEqual(opts, c.opts) || !reflect.DeepEqual(words, c.words)) {
			t.Errorf("%q: got %q %q %q, want %q %q %q", c.args, opts, words, msg, c.opts, c.words, c.err)
		}
	}
}

// FuzzParser: a scan ends; every failure starts with the program name;
// every word set aside was on the command line; every option found is in
// the tables with an argument exactly when it takes one.
func FuzzParser(f *testing.F) {
	for _, s := range []string{"a\x00--table\x00x", "-vvj3\x00-j\x004", "--ta=x", "--\x00-x", "-j", "--verbose\x00info", "--=x"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, posix bool) {
		args := strings.Split(s, "\x00")
		p := &Parser{Prog: "prog", Args: args, Shorts: testShorts, Longs: testLongs, Posix: posix}
		for n := 0; ; n++ {
			if n > len(s)+1 {
				t.Fatalf("%q: more options than characters", args)
			}
			o, ok, err := p.Next()
			if err != nil {
				if m := err.Error(); !strings.HasPrefix(m, "prog: ") {
					t.Fatalf("%q: failure %q", args, m)
				}
				return
			}
			if !ok {
				break
			}
			switch {
			case o.Long >= 0:
				if l := testLongs[o.Long]; l.Val != o.Val || !l.HasArg && o.Arg != "" {
					t.Fatalf("%q: option %+v of %+v", args, o, l)
				}
			case o.Val > 0xff || strings.IndexByte(testShorts, byte(o.Val)) < 0:
				t.Fatalf("%q: unknown short option %+v", args, o)
			}
		}
		in := map[string]int{}
		for _, a := range args {
			in[a]++
		}
		for _, w := range p.Rest() {
			if in[w] == 0 {
				t.Fatalf("%q: word %q was not given", args, w)
			}
			in[w]--
		}
	})
}
