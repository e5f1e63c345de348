package stack

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// formatConcise writes devices back in the concise format, escaping what
// the parser would read as syntax; a table goes in one field with its line
// breaks escaped.
func formatConcise(devs []ConfigDevice) string {
	esc := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			switch s[i] {
			case '\\', ',', ';', '\n', '#':
				b.WriteByte('\\')
			}
			b.WriteByte(s[i])
		}
		return b.String()
	}
	var b strings.Builder
	for _, d := range devs {
		minor := ""
		if d.Minor >= 0 {
			minor = strconv.Itoa(d.Minor)
		}
		flags := "rw"
		if d.ReadOnly {
			flags = "ro"
		}
		b.WriteString(esc(d.Name) + "," + esc(d.UUID) + "," + minor + "," + flags + "," +
			esc(strings.TrimSuffix(d.Table, "\n")) + ";\n")
	}
	return b.String()
}

// FuzzConciseRoundTrip checks that what ParseConcise accepts formats back
// to a config that parses to the same devices.
func FuzzConciseRoundTrip(f *testing.F) {
	for _, s := range []string{
		"a,,,rw,0 8 zero;b,,1,ro,0 8 linear a 0",
		"# c\nx,u,,,0 1 error\\;;",
		"base,,,rw,0 2048 linear ./base.img 0;\nfast,,,rw,0 1024 linear base 0,1024 1024 striped 2 8 ./a.img 0 ./b.img 0;",
		"ro1,my-uuid,7,ro,0 2048 zero\n",
		"a\\#b,\\,u\\\\,0,rw,  0 8 zero \\\n 8 8 zero ,16 8 error;;",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		devs, err := ParseConcise(text)
		if err != nil {
			return
		}
		out := formatConcise(devs)
		again, err := ParseConcise(out)
		if err != nil {
			t.Fatalf("%q parsed; formatted as %q it fails: %v", text, out, err)
		}
		if len(again) != len(devs) {
			t.Fatalf("%d devices became %d through %q", len(devs), len(again), out)
		}
		for i := range devs {
			a, b := devs[i], again[i]
			a.Line, b.Line = 0, 0
			if a != b {
				t.Fatalf("device %d: %+v became %+v through %q", i, a, b, out)
			}
		}
	})
}

// FuzzSplitArgs checks dm's argument splitting, which messages go through:
// no empty word, and the words escaped with EscapeArg and joined by blanks
// split back to themselves.
func FuzzSplitArgs(f *testing.F) {
	for _, s := range []string{"", "a b", `a\ b c\\`, "  x\t\ny  ", `trailing\`, `\\\ `, "@stats_create - /4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words := SplitArgs(s)
		esc := make([]string, len(words))
		for i, w := range words {
			if w == "" {
				t.Fatalf("%q: empty word in %q", s, words)
			}
			esc[i] = EscapeArg(w)
		}
		if again := SplitArgs(strings.Join(esc, " ")); !reflect.DeepEqual(again, words) {
			t.Fatalf("%q splits to %q; escaped and joined, to %q", s, words, again)
		}
	})
}

// FuzzScanConcise checks dmsetup's reading of the concise format: the
// devices it reads, quoted with QuoteConcise and joined again, read back
// to the same fields.
func FuzzScanConcise(f *testing.F) {
	for _, s := range []string{"c1,,,ro,0 8 zero,8 8 error;c2,UU,7,,0 1 zero", "x,,;", "x,,", "x\\", "a\\,b,u\\;,,,0 8 zero ;  x,,,,y\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var devs [][]string
		ScanConcise(s, false, func(e ConciseEntry) bool {
			if e.Err != nil || len(e.Fields) < 5 {
				return false
			}
			for i, f := range e.Fields {
				if i <= 4 && f != "" && isSpace(f[0]) || i >= 4 && f == "" {
					return false // blanks after a separator are not kept
				}
			}
			devs = append(devs, e.Fields)
			return true
		})
		var b strings.Builder
		for _, d := range devs {
			for j, f := range d {
				if j > 0 {
					b.WriteByte(',')
				}
				b.WriteString(QuoteConcise(f))
			}
			b.WriteByte(';')
		}
		var again [][]string
		ScanConcise(b.String(), false, func(e ConciseEntry) bool {
			if e.Err != nil {
				t.Fatalf("%q read from %q: %v", b.String(), s, e.Err)
			}
			again = append(again, e.Fields)
			return true
		})
		if len(devs) > 0 && !reflect.DeepEqual(again, devs) {
			t.Fatalf("%q read as %q; quoted, %q reads as %q", s, devs, b.String(), again)
		}
	})
}
