package selectors

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// refParseUint is an independent statement of sscanf("%u%c") == 1 into an
// unsigned int: the C string (up to NUL), leading kernel white space, then
// only decimal digits; the value wraps modulo 2^64 and is truncated to 32 bits.
func refParseUint(s string) (uint32, bool) {
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	for s != "" && strings.IndexByte(" \t\n\v\f\r\xa0", s[0]) >= 0 {
		s = s[1:]
	}
	if s == "" {
		return 0, false
	}
	var v uint64
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0') // wraps like simple_strtoull
	}
	return uint32(v), true
}

// splitArgs turns fuzz input into table words (as a table's whitespace split would).
func splitArgs(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "|")
}

func FuzzHSTArgs(f *testing.F) {
	for _, s := range []string{"", "972", "512|2", "1024", "0|0", "1|2|3", "x", "1023|4294967295", "|",
		"+972", "-0", " 512|2", "4294968268", "512|+2", "0x10", "972\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		args := splitArgs(in)
		s, err := newHST(args, &clock.Manual{})
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) || ae.Kernel != KernelCtrFailed || ae.Selector != "historical-service-time" {
				t.Fatalf("New(%q): %v", args, err)
			}
			return
		}
		base, thr := uint32(972), uint32(0)
		if len(args) > 2 {
			t.Fatalf("New(%q) accepted %d args", args, len(args))
		}
		if len(args) > 0 {
			v, ok := refParseUint(args[0])
			if !ok || v >= 1024 {
				t.Fatalf("New(%q) accepted base_weight", args)
			}
			base = v
		}
		if len(args) > 1 {
			v, ok := refParseUint(args[1])
			if !ok {
				t.Fatalf("New(%q) accepted threshold_multiplier", args)
			}
			thr = v
		}
		want := "2 " + strconv.FormatUint(uint64(base), 10) + " " + strconv.FormatUint(uint64(thr), 10) + " "
		if got := s.Status(nil, StatusTable); got != want {
			t.Fatalf("New(%q): group status %q, want %q", args, got, want)
		}
	})
}

// FuzzPathArgs checks every selector's per-path parser: the kernel's arg
// count limit, repeat_count clamping (not for HST), relative_throughput range.
func FuzzPathArgs(f *testing.F) {
	for _, s := range []string{"", "0", "1", "1000", "1|1", "1|4", "1|100", "1|101", "1|2|3", "x", "1|x", "4294967297|0",
		"+1", "-0", " 1", "1 ", "0x1", "1|+4", "1|4294967300", "1|\xa04"} {
		for i := range 4 {
			f.Add(uint8(i), s)
		}
	}
	names := []string{"round-robin", "queue-length", "service-time", "historical-service-time"}
	f.Fuzz(func(t *testing.T, which uint8, in string) {
		name := names[int(which)%len(names)]
		args := splitArgs(in)
		typ, _ := Lookup(name)
		s, err := typ.New(nil, &clock.Manual{})
		if err != nil {
			t.Fatal(err)
		}
		p := &Path{}
		err = s.AddPath(p, args)
		maxArgs := 1
		if name == "service-time" {
			maxArgs = 2
		}
		var wantErr string
		rc := uint32(1)
		rt := uint32(1)
		if len(args) > maxArgs {
			wantErr = name + " ps: incorrect number of arguments"
		} else if len(args) > 0 {
			v, ok := refParseUint(args[0])
			if !ok {
				wantErr = name + " ps: invalid repeat count"
			}
			rc = v
		}
		if wantErr == "" && len(args) == 2 {
			v, ok := refParseUint(args[1])
			if !ok || v > 100 {
				wantErr = "service-time ps: invalid relative_throughput value"
			}
			rt = v
		}
		if wantErr != "" {
			var ae *ArgError
			if !errors.As(err, &ae) || ae.Kernel != wantErr {
				t.Fatalf("%s AddPath(%q): %v, want %q", name, args, err, wantErr)
			}
			if p.pi != nil {
				t.Fatalf("failed AddPath bound the path")
			}
			return
		}
		if err != nil {
			t.Fatalf("%s AddPath(%q): %v", name, args, err)
		}
		if rc > 1 {
			rc = 1
		}
		var want string
		switch name {
		case "historical-service-time":
			want = "0 "
		case "service-time":
			want = strconv.Itoa(int(rc)) + " " + strconv.Itoa(int(rt)) + " "
		default:
			want = strconv.Itoa(int(rc)) + " "
		}
		if got := s.Status(p, StatusTable); got != want {
			t.Fatalf("%s AddPath(%q): TABLE %q, want %q", name, args, got, want)
		}
		if s.SelectPath(4096) != p {
			t.Fatalf("the only path was not selected")
		}
	})
}
