package stacktest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/golden"
	"github.com/dmfuse/dmfuse/stack"
)

// TableDevs returns the devices the table cases of CheckTables open: memory
// devices of 16384 sectors named by MAJOR:MINOR (8:16, 8:32, 8:48), as
// dmsetup prints block devices, and one path with a space in it
// ("dir/a b.img").
func TableDevs() Opener {
	o := Opener{}
	for _, n := range []string{"8:16", "8:32", "8:48", "dir/a b.img"} {
		o[n] = NewMemDevice(n, 16384*stack.SectorSize)
	}
	return o
}

// CheckTables builds every case of dir/tables.in with the types of reg over
// the devices of TableDevs, and compares the TABLE and INFO output, or the
// error, with dir/tables.golden (golden.Check; `go test -update` rewrites
// it). Cases are separated by "---" lines, and each starts with a "# name"
// line: a case whose name holds "rejected" must fail to build, every other
// must build, and its TABLE form must build again to the same table.
func CheckTables(t *testing.T, reg *stack.Registry, dir string) {
	t.Helper()
	in, err := os.ReadFile(filepath.Join(dir, "tables.in"))
	if err != nil {
		t.Fatal(err)
	}
	build := func(text string) (*stack.Table, error) {
		lines, err := stack.ParseTable(text)
		if err != nil {
			return nil, err
		}
		return stack.Build(lines, stack.BuildOptions{Registry: reg, Clock: &clock.Manual{}, Context: context.Background(), Open: TableDevs().Open})
	}
	var out strings.Builder
	for _, c := range strings.Split(string(in), "---\n") {
		name, text, _ := strings.Cut(c, "\n")
		fmt.Fprintf(&out, "== %s\n", strings.TrimPrefix(name, "# "))
		tb, err := build(text)
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
		fmt.Fprintf(&out, "table:\n%sstatus:\n%s", tb.Format(stack.StatusTable), tb.Format(stack.StatusInfo))
		again, err := build(tb.Format(stack.StatusTable))
		if err != nil {
			t.Errorf("%s: table output does not parse back: %v", name, err)
		} else {
			if a, b := again.Format(stack.StatusTable), tb.Format(stack.StatusTable); a != b {
				t.Errorf("%s: round trip changed the table:\n%s\nvs\n%s", name, a, b)
			}
			again.Close()
		}
		tb.Close()
	}
	golden.Check(t, filepath.Join(dir, "tables.golden"), []byte(out.String()))
}
