package dmsetup

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestDmsetupGetopt(t *testing.T) {
	for _, c := range []struct {
		args  []string
		posix bool
		opts  []option
		words []string
		msg   string
	}{
		{args: []string{"create", "test", "--table", "0 8 zero"}, opts: []option{{"table", "0 8 zero"}}, words: []string{"create", "test"}},
		{args: []string{"--noudevsync", "create", "x", "--table=a=b"}, opts: []option{{"noudevsync", ""}, {"table", "a=b"}}, words: []string{"create", "x"}},
		{args: []string{"remove", "--retry", "dust1"}, opts: []option{{"retry", ""}}, words: []string{"remove", "dust1"}},
		{args: []string{"message", "x", "0", "--", "-foo", "--bar"}, words: []string{"message", "x", "0", "-foo", "--bar"}},
		{args: []string{"-vv", "-j253", "-m", "4", "info"}, opts: []option{{"verbose", ""}, {"verbose", ""}, {"major", "253"}, {"minor", "4"}}, words: []string{"info"}},
		{args: []string{"-cC", "info"}, opts: []option{{"columns", ""}, {"columns", ""}}, words: []string{"info"}},
		{args: []string{"--verbose", "info", "x"}, opts: []option{{"verbose", "info"}}, words: []string{"x"}},
		{args: []string{"--tab", "0 8 zero", "create", "t1"}, opts: []option{{"table", "0 8 zero"}}, words: []string{"create", "t1"}},
		{args: []string{"--sep", ","}, opts: []option{{"separator", ","}}},
		{args: []string{"-", "x"}, words: []string{"-", "x"}},
		{args: []string{"info", "-c"}, posix: true, words: []string{"info", "-c"}},
		{args: []string{"-c", "info", "-c"}, posix: true, opts: []option{{"columns", ""}}, words: []string{"info", "-c"}},
		{args: []string{"--ta", "x"}, msg: "dmsetup: option '--ta' is ambiguous; possibilities: '--table' '--target'"},
		{args: []string{"--no", "x"}, msg: "dmsetup: option '--no' is ambiguous; possibilities: '--noflush' '--nogroup' '--noheadings' '--nolockfs' '--nomonitor' '--noopencount' '--nosuffix' '--notable' '--notimesuffix' '--noudevrules' '--noudevsync'"},
		{args: []string{"--bogus=1"}, msg: "dmsetup: unrecognized option '--bogus=1'"},
		{args: []string{"--"}, words: nil},
		{args: []string{"--force=1"}, msg: "dmsetup: option '--force' doesn't allow an argument"},
		{args: []string{"info", "--uuid"}, msg: "dmsetup: option '--uuid' requires an argument"},
		{args: []string{"-u"}, msg: "dmsetup: option requires an argument -- 'u'"},
		{args: []string{"-fx"}, msg: "dmsetup: invalid option -- 'x'"},
		{args: []string{"-:"}, msg: "dmsetup: invalid option -- ':'"},
	} {
		opts, words, msg := getopt("dmsetup", c.args, c.posix)
		if !reflect.DeepEqual(opts, c.opts) || !reflect.DeepEqual(words, c.words) || msg != c.msg {
			t.Errorf("%q: got %v %q %q, want %v %q %q", c.args, opts, words, msg, c.opts, c.words, c.msg)
		}
	}
}

// FuzzGetopt: scanning never fails but with one line of glibc's wording,
// every word it returns was on the command line, and every option it
// returns is one of dmsetup's.
func FuzzGetopt(f *testing.F) {
	for _, s := range []string{"create\x00t\x00--table\x000 8 zero", "-vvj3\x00-m\x004", "--ta=x", "--\x00-x", "-u", "--verbose\x00info"} {
		f.Add(s)
	}
	known := map[string]bool{}
	for _, o := range longOptions {
		known[o.name] = true
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		opts, words, msg := getopt("dmsetup", args, false)
		if msg != "" {
			if !strings.HasPrefix(msg, "dmsetup: ") || opts != nil || words != nil {
				t.Fatalf("%q: failure %q with results %v %v", args, msg, opts, words)
			}
			return
		}
		in := map[string]int{}
		for _, a := range args {
			in[a]++
		}
		for _, w := range words {
			if in[w] == 0 {
				t.Fatalf("%q: word %q was not given", args, w)
			}
			in[w]--
		}
		for _, o := range opts {
			if !known[o.name] {
				t.Fatalf("%q: unknown option %q", args, o.name)
			}
		}
	})
}

// FuzzTableLines: what parseLines accepts it prints in a form it parses
// again to the same words (a comment cut from the parameters may leave the
// blanks before it, which the daemon's split ignores).
func FuzzTableLines(f *testing.F) {
	for _, s := range []string{"0 8 zero", "0 10 zero\n# c\n\n  10 10 error  # comment\n", "0 10", "+1 2 x y\tz", "a b c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var errb bytes.Buffer
		r := &run{env: &Env{Stderr: &errb}}
		text, n, ok := r.parseLines(s, "")
		if !ok {
			if !strings.HasPrefix(errb.String(), "Invalid format on line ") || strings.Count(errb.String(), "\n") != 1 {
				t.Fatalf("%q: failure %q", s, errb.String())
			}
			return
		}
		again, n2, ok := r.parseLines(text, "")
		if !ok || !reflect.DeepEqual(strings.Fields(again), strings.Fields(text)) || n2 != n || strings.Count(text, "\n") != n {
			t.Fatalf("%q: %q (%d) reparses to %q (%d, %v)", s, text, n, again, n2, ok)
		}
	})
}
