package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// testDevs are in-memory devices named by MAJOR:MINOR (8:16, 8:32, 8:48), as
// dmsetup prints block devices, and one path with a space in it.
func testDevs() map[string]*MemDevice {
	m := map[string]*MemDevice{}
	for _, n := range []string{"8:16", "8:32", "8:48", "dir/a b.img"} {
		m[n] = NewMemDevice(n, 16384*SectorSize)
	}
	return m
}

func testRegistry(t testing.TB) *Registry {
	r, err := NewRegistry(Linear, Striped, Zero, Error, Flakey, Dust)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func buildText(t testing.TB, text string, devs map[string]*MemDevice) (*Table, error) {
	lines, err := ParseTable(text)
	if err != nil {
		return nil, err
	}
	return Build(lines, BuildOptions{Registry: testRegistry(t), Clock: clock.System, Context: context.Background(),
		Open: func(arg string) (BlockDevice, error) {
			if d, ok := devs[arg]; ok {
				return d, nil
			}
			return nil, Errorf("Device lookup failed")
		}})
}

// TestTablesGolden builds every case of testdata/tables.in and compares the
// table and status output (or the error) with testdata/tables.golden. The
// TABLE form must load again: device paths are printed escaped, as
// drivers/md/dm-table.c: dm_split_args reads a backslash-escaped space. The
// error cases follow drivers/md/dm-target.c: io_err_ctr, which with exactly
// two arguments parses the offset and opens the device (io_err_get_args),
// and drivers/md/dm-table.c: device_area_is_invalid, which checks that area
// through io_err_iterate_devices.
func TestTablesGolden(t *testing.T) {
	in, err := os.ReadFile("testdata/tables.in")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, c := range strings.Split(string(in), "---\n") {
		name, text, _ := strings.Cut(c, "\n")
		fmt.Fprintf(&out, "== %s\n", strings.TrimPrefix(name, "# "))
		tb, err := buildText(t, text, testDevs())
		if err != nil {
			fmt.Fprintf(&out, "error: %v\n", err)
			if !strings.Contains(name, "rejected") {
				t.Errorf("%s: unexpected error %v", name, err)
			}
			continue
		}
		if strings.Contains(name, "rejected") {
			t.Errorf("%s: accepted", name)
		}
		fmt.Fprintf(&out, "table:\n%sstatus:\n%s", tb.Format(StatusTable), tb.Format(StatusInfo))
		// The TABLE form must build again to the same table.
		again, err := buildText(t, tb.Format(StatusTable), testDevs())
		if err != nil {
			t.Errorf("%s: table output does not parse back: %v", name, err)
		} else if a, b := again.Format(StatusTable), tb.Format(StatusTable); a != b {
			t.Errorf("%s: round trip changed the table:\n%s\nvs\n%s", name, a, b)
		}
		tb.Close()
	}
	checkGolden(t, "tables.golden", out.String())
}

func TestSpecVectors(t *testing.T) {
	cases := []struct{ in, table, status string }{
		{"0 2048 linear 8:16 0", "0 2048 linear 8:16 0\n", "0 2048 linear \n"},
		{"0 4096 striped 2 8 8:16 0 8:32 0", "0 4096 striped 2 8 8:16 0 8:32 0\n", "0 4096 striped 2 8:16 8:32 1 AA\n"},
		{"0 2048 zero", "0 2048 zero \n", "0 2048 zero \n"},
		{"0 2048 error 8:16 0", "0 2048 error \n", "0 2048 error \n"},
	}
	for _, c := range cases {
		tb, err := buildText(t, c.in, testDevs())
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if got := tb.Format(StatusTable); got != c.table {
			t.Errorf("%s: table %q, want %q", c.in, got, c.table)
		}
		if got := tb.Format(StatusInfo); got != c.status {
			t.Errorf("%s: status %q, want %q", c.in, got, c.status)
		}
	}
}

func TestRejectedReasons(t *testing.T) {
	cases := map[string]string{
		"1 1024 linear 8:16 0":                         "line 1: linear: Gap in table",
		"0 1024 linear 8:16 0\n512 1024 linear 8:32 0": "line 2: linear: Gap in table",
		"0 0 zero":               "line 1: zero: zero-length target",
		"0 2048 foo":             "line 1: foo: unknown target type",
		"0 2048 linear 8:16":     "line 1: linear: Invalid argument count",
		"0 2048 linear 8:16 10x": "line 1: linear: Invalid device sector",
		"0 2048 zero 1":          "line 1: zero: No arguments required",
		"0 4096 striped 3 8 8:16 0 8:32 0 8:48 0": "line 1: striped: Target length not divisible by number of stripes",
		"0 4000 striped 2 3 8:16 0 8:32 0":        "line 1: striped: Target length not divisible by chunk size",
		"0 4096 striped 2 8 8:16 0":               "line 1: striped: Not enough destinations specified",
		"0 4096 striped 0 8":                      "line 1: striped: Invalid stripe count",
		"0 4096 striped 2 0 8:16 0 8:32 0":        "line 1: striped: Invalid chunk_size",
		"0 2048":                                  "line 1: Invalid format on line 1",
		"# nothing":                               "no targets specified",
	}
	for in, want := range cases {
		_, err := buildText(t, in, testDevs())
		if err == nil {
			t.Errorf("%q accepted", in)
			continue
		}
		if err.Error() != want {
			t.Errorf("%q: error %q, want %q", in, err, want)
		}
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: error %v is not EINVAL", in, err)
		}
	}
}

func TestSplitArgs(t *testing.T) {
	cases := map[string][]string{
		"":                 nil,
		"   ":              nil,
		"a b\t c":          {"a", "b", "c"},
		`a\ b c`:           {"a b", "c"},
		`a\\b`:             {`a\b`},
		`a\`:               {`a\`},
		`\ `:               {" "},
		"x\n y":            {"x", "y"},
		`path\ with\ sp 0`: {"path with sp", "0"},
	}
	for in, want := range cases {
		got := SplitArgs(in)
		if fmt.Sprint(got) != fmt.Sprint(want) || len(got) != len(want) {
			t.Errorf("SplitArgs(%q) = %q, want %q", in, got, want)
		}
		var esc []string
		for _, a := range got {
			esc = append(esc, EscapeArg(a))
		}
		if back := SplitArgs(strings.Join(esc, " ")); fmt.Sprint(back) != fmt.Sprint(got) {
			t.Errorf("escape round trip of %q: %q", got, back)
		}
	}
}

// FuzzTable parses and builds arbitrary table text; what is accepted must
// format, parse and build again to the same text.
func FuzzTable(f *testing.F) {
	in, err := os.ReadFile("testdata/tables.in")
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range strings.Split(string(in), "---\n") {
		f.Add(c)
	}
	devs := testDevs() // shared: fuzzed tables do no I/O
	f.Fuzz(func(t *testing.T, text string) {
		tb, err := buildText(t, text, devs)
		if err != nil {
			var te *TableError
			if !errors.As(err, &te) {
				t.Fatalf("error %v is not a *TableError", err)
			}
			return
		}
		defer tb.Close()
		out := tb.Format(StatusTable)
		again, err := buildText(t, out, devs)
		if err != nil {
			t.Fatalf("formatted table %q does not build: %v", out, err)
		}
		defer again.Close()
		if got := again.Format(StatusTable); got != out {
			t.Fatalf("round trip: %q -> %q", out, got)
		}
		if again.Size() != tb.Size() {
			t.Fatalf("size changed: %d -> %d", tb.Size(), again.Size())
		}
	})
}
