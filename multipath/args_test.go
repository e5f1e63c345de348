package multipath

import (
	"context"
	"errors"
	"io"
	"log"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestMultipathNumberRules: the counts of a multipath table are read as
// dm_read_arg reads them (sscanf "%u%c": no '+', a value too large wraps to
// 32 bits).
func TestMultipathNumberRules(t *testing.T) {
	c := &stack.Ctor{Len: 2048, Clock: &clock.Manual{}, Context: context.Background(),
		Open: stacktest.Opener{"8:16": stacktest.NewMemDevice("8:16", 8192*stack.SectorSize)}.Open}
	for _, tc := range []struct{ params, table string }{
		{"+0 0 0 0", ""},
		{"0 +0 0 0", ""},
		{"4294967296 0 0 0", "0 0 0 0 "},
		{"0 0 4294967297 1 round-robin 0 1 0 8:16", "0 0 1 1 round-robin 0 1 1 8:16 1 "},
		{"0 0 1 1 round-robin 0 +1 0 8:16", ""},
		{"0 0 1 1 round-robin 0 1 4294967296 8:16", "0 0 1 1 round-robin 0 1 1 8:16 1 "},
		{"0 0 1 1 round-robin 0 1 1 8:16 +1", ""},
		{"0 0 1 1 round-robin 0 1 1 8:16 4294967297", "0 0 1 1 round-robin 0 1 1 8:16 1 "},
	} {
		tg, err := Type.New(c, stack.SplitArgs(tc.params))
		if tc.table == "" {
			if err == nil {
				tg.Close()
				t.Errorf("%q: accepted, want refused", tc.params)
			} else if !errors.Is(err, syscall.EINVAL) {
				t.Errorf("%q: %v is not EINVAL", tc.params, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.params, err)
			continue
		}
		if got := tg.Status(stack.StatusTable); got != tc.table {
			t.Errorf("%q: table %q, want %q", tc.params, got, tc.table)
		}
		tg.Close()
	}
}

// TestMultipathMessageNumberRules: the group numbers of switch_group and
// disable_group are read with sscanf "%u%c".
func TestMultipathMessageNumberRules(t *testing.T) {
	c := &stack.Ctor{Len: 2048, Clock: &clock.Manual{}, Context: context.Background(),
		Open: stacktest.Opener{"8:16": stacktest.NewMemDevice("8:16", 8192*stack.SectorSize)}.Open}
	mp, err := Type.New(c, stack.SplitArgs("0 0 2 1 round-robin 0 1 0 8:16 round-robin 0 1 0 8:16"))
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	mp.(*multipath).logger = log.New(io.Discard, "", 0)
	for _, m := range []struct {
		msg string
		ok  bool
	}{
		{"switch_group +1", false},
		{"switch_group 1 ", false},
		{"switch_group 4294967298", true},  // group 2
		{"disable_group 4294967297", true}, // group 1
	} {
		args := stack.SplitArgs(m.msg)
		if strings.HasSuffix(m.msg, " ") {
			args = strings.SplitN(m.msg, " ", 2) // keep the trailing character in the word
		}
		out, err := mp.(stack.Messager).Message(context.Background(), args)
		if m.ok && err != nil || !m.ok && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: %q, %v; want accepted %v", m.msg, out, err, m.ok)
		}
	}
	if st := mp.Status(stack.StatusInfo); !strings.Contains(st, " 2 2 D ") {
		t.Errorf("status %q: want group 2 next and group 1 disabled", st)
	}
}
