package thin

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
	"github.com/dmfuse/dmfuse/thin/metadata"
)

// FuzzPoolArgs builds thin-pool tables from any parameter string: a table
// that builds prints a table line that builds again to the same line, and
// one that fails says why with an errno.
func FuzzPoolArgs(f *testing.F) {
	for _, s := range []string{
		"meta data 128 0", "meta data 128 10 1 skip_block_zeroing", "meta data 2097152 0 0",
		"meta data 128 0 4 ignore_discard no_discard_passdown error_if_no_space skip_block_zeroing",
		"meta data 256 +5 1 read_only", "meta meta 128 0", "meta data 129 0", "meta data 128 0 5",
		"meta data 128 0 1 Error_If_No_Space trailing", "meta data 128 18446744073709551615",
	} {
		f.Add(s)
	}
	pt, _ := NewTypes(func(d metadata.Device, o metadata.Options) (metadata.Store, error) { return openMemStore(d, o) })
	reg, err := stack.NewRegistry(pt)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, params string) {
		if strings.ContainsAny(params, "\n#") {
			return
		}
		open := stacktest.Opener{"meta": stacktest.NewMemDevice("meta", 64<<10), "data": stacktest.NewMemDevice("data", 1<<20)}
		build := func(p string) (*stack.Table, error) {
			lines, err := stack.ParseTable("0 2048 thin-pool " + p)
			if err != nil {
				return nil, err
			}
			return stack.Build(lines, stack.BuildOptions{Registry: reg, Open: open.Open, Clock: &clock.Manual{}, Context: context.Background()})
		}
		tb, err := build(params)
		if err != nil {
			var e syscall.Errno
			if !errors.As(err, &e) || e == 0 {
				t.Fatalf("%q: error without an errno: %v", params, err)
			}
			return
		}
		line := tb.Format(stack.StatusTable)
		if err := tb.Close(); err != nil {
			t.Fatal(err)
		}
		_, after, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "thin-pool ")
		tb2, err := build(after)
		if err != nil {
			t.Fatalf("%q: table %q does not build again: %v", params, after, err)
		}
		if again := tb2.Format(stack.StatusTable); again != line {
			t.Errorf("%q: table %q, then %q", params, line, again)
		}
		_ = tb2.Close()
	})
}

// FuzzThinArgs builds thin tables from any parameter string over one pool.
func FuzzThinArgs(f *testing.F) {
	for _, s := range []string{"pool 1", "pool 1 origin", "pool 16777215", "pool 16777216", "pool +1", "pool 1 pool", "pool", "origin 1", "pool 2"} {
		f.Add(s)
	}
	r := newRig(f)
	r.pool(16, 0, "")
	r.mem("origin", 1<<20)
	if err := r.msg("pool", "create_thin", "1"); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, params string) {
		if strings.ContainsAny(params, "\n#") {
			return
		}
		d, err := r.mgr.Create(stack.CreateOptions{Name: "t", Minor: -1, Table: "0 2048 thin " + params})
		if err != nil {
			var e syscall.Errno
			if !errors.As(err, &e) || e == 0 {
				t.Fatalf("%q: error without an errno: %v", params, err)
			}
			return
		}
		defer func() {
			if err := r.mgr.Remove("t", stack.Flags{}); err != nil {
				t.Fatal(err)
			}
		}()
		if got := r.status(d); got != "0 2048 thin 0 -" {
			t.Errorf("%q: status %q", params, got)
		}
	})
}

// FuzzPoolMessage sends any message to a pool: it fails with one of the
// kernel's errnos or succeeds and commits, and the pool keeps working.
func FuzzPoolMessage(f *testing.F) {
	for _, s := range []string{
		"create_thin 1", "create_snap 2 1", "delete 1", "set_transaction_id 0 1", "reserve_metadata_snap",
		"release_metadata_snap", "CREATE_THIN +3", "create_thin 16777216", "delete", "trim 1 0", "create_snap 5 5",
	} {
		f.Add(s)
	}
	r := newRig(f)
	r.pool(16, 0, "")
	f.Fuzz(func(t *testing.T, msg string) {
		words := stack.SplitArgs(msg)
		if len(words) == 0 {
			return
		}
		err := r.msg("pool", words...)
		if err == nil {
			if r.store().Changed() {
				t.Errorf("%q: succeeded without a commit", msg)
			}
			return
		}
		ok := false
		for _, e := range []syscall.Errno{syscall.EINVAL, syscall.EEXIST, syscall.ENODATA, syscall.EBUSY} {
			ok = ok || errors.Is(err, e)
		}
		if !ok {
			t.Errorf("%q: %v", msg, err)
		}
		if poolFor(t, r).getMode() != modeWrite {
			t.Fatalf("%q: pool left write mode", msg)
		}
	})
}
