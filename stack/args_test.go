package stack

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// TestArgsNumberRules checks the argument readers against the kernel's rules:
// Args.Uint and Args.Group are dm_read_arg (sscanf "%u%c"), ParseUint32 and
// ParseUint64 are kstrtouint and kstrtoull, ParseSector is sscanf "%llu%c"
// bounded by the largest device size.
func TestArgsNumberRules(t *testing.T) {
	const bad = -1
	for _, c := range []struct {
		in                  string
		uint, u32, u64, sec int64 // bad: refused
	}{
		{"5", 5, 5, 5, 5},
		{"+5", bad, 5, 5, bad},
		{"-0", bad, bad, bad, bad},
		{"0x10", bad, bad, bad, bad},
		{"010", 10, 10, 10, 10},
		{" 5", 5, bad, bad, 5},
		{"5 ", bad, bad, bad, bad},
		{"5\n", bad, 5, 5, bad},
		{"", bad, bad, bad, bad},
		{"4294967295", 4294967295, 4294967295, 4294967295, 4294967295},
		{"4294967296", 0, bad, 4294967296, 4294967296},
		{"4294967297", 1, bad, 4294967297, 4294967297},
		{"18014398509481983", 4294967295, bad, 18014398509481983, 18014398509481983},
		{"18014398509481984", 0, bad, 18014398509481984, bad}, // past LLONG_MAX >> 9
		{"18446744073709551616", 0, bad, bad, 0},
		{"18446744073709551621", 5, bad, bad, 5},
	} {
		a := NewArgs([]string{c.in})
		v, err := a.Uint(0, 1<<32-1, "bad number")
		check(t, "Args.Uint", c.in, int64(v), err, c.uint)
		a = NewArgs([]string{c.in, "x", "y", "z", "w", "v"})
		v, err = a.Group(0, 5, "bad count")
		want := c.uint
		if want > 5 {
			want = bad
		}
		check(t, "Args.Group", c.in, int64(v), err, want)
		u32, err := ParseUint32(c.in)
		check(t, "ParseUint32", c.in, int64(u32), err, c.u32)
		u64, err := ParseUint64(c.in)
		if err == nil && u64 > 1<<62 {
			u64 = 1 << 62 // above what the table states
		}
		check(t, "ParseUint64", c.in, int64(u64), err, c.u64)
		sec, err := ParseSector(c.in)
		check(t, "ParseSector", c.in, sec, err, c.sec)
	}
}

func check(t *testing.T, what, in string, got int64, err error, want int64) {
	t.Helper()
	switch {
	case want < 0 && err == nil:
		t.Errorf("%s(%q) = %d, want refused", what, in, got)
	case want >= 0 && err != nil:
		t.Errorf("%s(%q): %v, want %d", what, in, err, want)
	case want >= 0 && got != want:
		t.Errorf("%s(%q) = %d, want %d", what, in, got, want)
	}
}

// TestTargetNumberRules checks that each target reads its numbers by the rule
// its kernel counterpart uses (see package dmarg for the list).
func TestTargetNumberRules(t *testing.T) {
	dev := NewMemDevice("8:16", 8192*SectorSize)
	dev2 := NewMemDevice("8:32", 8192*SectorSize)
	ctor := func(length int64) *Ctor {
		return &Ctor{Len: length, Clock: &clock.Manual{}, Context: context.Background(),
			Open: func(arg string) (BlockDevice, error) {
				for _, d := range []*MemDevice{dev, dev2} {
					if d.Name() == arg {
						return d, nil
					}
				}
				return nil, Errorf("Device lookup failed")
			}}
	}
	for _, c := range []struct {
		typ    *TargetType
		params string
		table  string // "" when refused
	}{
		// <offset>: sscanf "%llu%c".
		{Linear, "8:16 +8", ""},
		{Linear, "8:16 18446744073709551624", "8:16 8"},
		{Dust, "8:16 +16 1024", ""},
		{Dust, "8:16 18446744073709551632 1024", "8:16 16 1024"},
		{Flakey, "8:16 +8 4 2", ""},
		// dm_read_arg: no '+', wraps to 32 bits.
		{Flakey, "8:16 0 +4 2", ""},
		{Flakey, "8:16 0 4 +2", ""},
		{Flakey, "8:16 0 4294967296 2", "8:16 0 0 2 2 error_reads error_writes"},
		{Flakey, "8:16 0 4294967300 2", "8:16 0 4 2 2 error_reads error_writes"},
		{Flakey, "8:16 0 4 2 +1 drop_writes", ""},
		{Flakey, "8:16 0 4 2 4294967297 drop_writes", "8:16 0 4 2 1 drop_writes"},
		// kstrtouint: '+' allowed, no wrap.
		{Striped, "+2 +8 8:16 0 8:32 0", "2 8 8:16 0 8:32 0"},
		{Striped, "2 4294967304 8:16 0 8:32 0", ""},
		{Striped, "4294967298 8 8:16 0 8:32 0", ""},
		{Dust, "8:16 0 +1024", "8:16 0 1024"},
		{Dust, "8:16 0 4294968320", ""},
	} {
		length := int64(2048)
		tg, err := c.typ.New(ctor(length), SplitArgs(c.params))
		if c.table == "" {
			if err == nil {
				tg.Close()
				t.Errorf("%s %q: accepted, want refused", c.typ.Name, c.params)
			} else if !errors.Is(err, syscall.EINVAL) {
				t.Errorf("%s %q: %v is not EINVAL", c.typ.Name, c.params, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %q: %v", c.typ.Name, c.params, err)
			continue
		}
		if got := tg.Status(StatusTable); got != c.table {
			t.Errorf("%s %q: table %q, want %q", c.typ.Name, c.params, got, c.table)
		}
		tg.Close()
	}
}

// TestMessageNumberRules checks the numbers in target messages: dust reads
// block and count with sscanf ("%llu%c", "%u%c"). Multipath's are in its
// own package.
func TestMessageNumberRules(t *testing.T) {
	dev := NewMemDevice("8:16", 8192*SectorSize)
	c := &Ctor{Len: 2048, Clock: &clock.Manual{}, Context: context.Background(),
		Open: func(string) (BlockDevice, error) { return dev, nil }}
	tg, err := Dust.New(c, SplitArgs("8:16 0 512"))
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	d := tg.(Messager)
	if _, err := d.Message(context.Background(), []string{"quiet"}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		tg  Messager
		msg string
		ok  bool
	}{
		{d, "addbadblock +5", false},
		{d, "addbadblock 5 +1", false},
		{d, "addbadblock 5\n", false},
		{d, "addbadblock 18446744073709551621", true}, // block 5
		{d, "queryblock 5", true},
		{d, "addbadblock 6 4294967297", true}, // count 1
	} {
		args := SplitArgs(m.msg)
		if strings.HasSuffix(m.msg, " ") || strings.HasSuffix(m.msg, "\n") {
			args = strings.SplitN(m.msg, " ", 2) // keep the trailing character in the word
		}
		out, err := m.tg.Message(context.Background(), args)
		if m.ok && err != nil || !m.ok && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: %q, %v; want accepted %v", m.msg, out, err, m.ok)
		}
		if m.msg == "queryblock 5" && out != "dust_query_block: block 5 found in badblocklist" {
			t.Errorf("queryblock 5: %q, want block 5 added by the wrapped number", out)
		}
	}
	if got, _ := d.Message(context.Background(), []string{"listbadblocks"}); got != "5\n6\n" {
		t.Errorf("bad blocks %q, want 5 and 6", got)
	}
}
