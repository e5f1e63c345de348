package multipath

import (
	"context"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestMultipathLimits: multipath takes discards and write-zeroes
// (drivers/md/dm-mpath.c: multipath_ctr sets num_discard_bios and
// num_write_zeroes_bios) where its paths take them (dm-table.c:
// dm_table_supports_discards, dm_table_supports_write_zeroes).
func TestMultipathLimits(t *testing.T) {
	reg, err := stack.NewRegistry(Type)
	if err != nil {
		t.Fatal(err)
	}
	nd, _ := stacktest.NewMemFaultDevice("nd", 16384*stack.SectorSize)
	nd.SetLimits(stack.Limits{WriteZeroes: true})
	open := stacktest.TableDevs()
	open["nd"] = nd
	for _, tc := range []struct {
		table string
		want  stack.Limits
	}{
		{"0 2048 multipath 0 0 1 1 round-robin 0 2 1 8:16 1 8:32 1", stack.Limits{Discard: true, WriteZeroes: true}},
		{"0 2048 multipath 0 0 1 1 round-robin 0 2 1 8:16 1 nd 1", stack.Limits{WriteZeroes: true}},
	} {
		lines, err := stack.ParseTable(tc.table)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := stack.Build(lines, stack.BuildOptions{Registry: reg, Clock: clock.System, Context: context.Background(), Open: open.Open})
		if err != nil {
			t.Fatalf("%q: %v", tc.table, err)
		}
		if got := tb.Limits(); got != tc.want {
			t.Errorf("%q: limits %+v, want %+v", tc.table, got, tc.want)
		}
		tb.Close()
	}
}
