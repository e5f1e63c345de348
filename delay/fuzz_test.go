package delay

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
)

func FuzzParseDelay(f *testing.F) {
	for _, s := range []string{"0", "100", "0.25", "+5", "4294967295", "4294967296", "1e3", "0.0000001", "1.", ".5",
		"007.500", "NaN", "inf", "0x10", "-0", "1_000", "4294967295.0000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseDelay(s)
		if err != nil {
			return
		}
		if v < 0 || v > maxDelayMs || v != v {
			t.Fatalf("ParseDelay(%q) = %v", s, v)
		}
		out := FormatDelay(v)
		if strings.ContainsAny(out, "eE+-") {
			t.Fatalf("FormatDelay(%v) = %q: not plain decimal", v, out)
		}
		back, err := ParseDelay(out)
		if err != nil || back != v {
			t.Fatalf("FormatDelay(%v) = %q parses to %v, %v", v, out, back, err)
		}
		if FormatDelay(back) != out {
			t.Fatalf("printing %q is not stable", out)
		}
	})
}

// FuzzNew: any parameter string either builds a target whose TABLE status
// builds the same target again, or fails with a reason.
func FuzzNew(f *testing.F) {
	for _, s := range []string{"8:16 0 100", "8:16 0 0 8:32 0 400", "8:16 0 50 8:16 0 100 8:16 0 333",
		"8:16 0 100 8:32", "8:16 10x 1", "8:16 0 0.25", "nosuch 0 1", "8:16 4000 1", "8:16 +0 +1.5 8:48 1 0"} {
		f.Add(s)
	}
	r := newRig(f)
	f.Fuzz(func(t *testing.T, params string) {
		tg, err := New(r.s, r.ctor(96), stack.SplitArgs(params))
		if err != nil {
			var ae *stack.ArgError
			if !errors.As(err, &ae) || ae.Reason == "" {
				t.Fatalf("%q: error %v is not an ArgError with a reason", params, err)
			}
			return
		}
		defer tg.Close()
		table := tg.Status(stack.StatusTable)
		again, err := New(r.s, r.ctor(96), stack.SplitArgs(table))
		if err != nil {
			t.Fatalf("%q: TABLE %q is refused: %v", params, table, err)
		}
		defer again.Close()
		if got := again.Status(stack.StatusTable); got != table {
			t.Fatalf("%q: TABLE %q prints back as %q", params, table, got)
		}
		if got := tg.Status(stack.StatusInfo); got != "0 0 0" {
			t.Fatalf("%q: idle INFO %q", params, got)
		}
		// With a zero delay I/O passes straight through; otherwise presuspend
		// lets it through without the clock moving.
		tg.Presuspend(false)
		if _, err := tg.ReadAt(context.Background(), make([]byte, 512), 0); err != nil {
			t.Fatalf("%q: read: %v", params, err)
		}
	})
}
