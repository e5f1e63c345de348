package dmarg

import (
	"errors"
	"math/big"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// result is what one rule makes of a word: the value (as uint64 bits) and
// whether it was accepted; for kstrto*, the errno of a refusal.
type result struct {
	v     uint64
	ok    bool
	errno syscall.Errno
}

func scan32(s string) result {
	v, ok := Uint32(s)
	return result{v: uint64(v), ok: ok}
}

func scan64(s string) result {
	v, ok := Uint64(s)
	return result{v: v, ok: ok}
}

func scanInt(s string) result {
	v, ok := Int32(s)
	return result{v: uint64(int64(v)), ok: ok}
}

func kerr(err error) syscall.Errno {
	var e syscall.Errno
	errors.As(err, &e)
	return e
}

func kst32(s string) result {
	v, err := Kstrtouint(s)
	return result{v: uint64(v), ok: err == nil, errno: kerr(err)}
}

func kst64(s string) result {
	v, err := Kstrtoull(s)
	return result{v: v, ok: err == nil, errno: kerr(err)}
}

var (
	yes  = func(v uint64) result { return result{v: v, ok: true} }
	no   = result{}
	inv  = result{errno: syscall.EINVAL}
	rng  = result{errno: syscall.ERANGE}
	neg1 = uint64(1<<64 - 1) // -1 as uint64 bits
)

// TestRules states each kernel rule on the words where the rules disagree.
// Columns: sscanf %u%c, %llu%c, %d%c; kstrtouint; kstrtoull.
func TestRules(t *testing.T) {
	for _, c := range []struct {
		in                    string
		u, llu, d, kst, kstll result
	}{
		{"5", yes(5), yes(5), yes(5), yes(5), yes(5)},
		{"0", yes(0), yes(0), yes(0), yes(0), yes(0)},
		// A '+' is kstrto*'s alone; a '-' is %d's alone.
		{"+5", no, no, no, yes(5), yes(5)},
		{"-0", no, no, yes(0), inv, inv},
		{"-5", no, no, yes(uint64(1<<64 - 5)), inv, inv},
		{"-", no, no, no, inv, inv},
		{"+", no, no, no, inv, inv},
		{"++5", no, no, no, inv, inv},
		{"+-5", no, no, no, inv, inv},
		// Base 10 always: no 0x, no octal.
		{"0x10", no, no, no, inv, inv},
		{"010", yes(10), yes(10), yes(10), yes(10), yes(10)},
		{"1e3", no, no, no, inv, inv},
		// White space: sscanf skips it before the number; nothing may
		// follow the number except kstrto*'s one newline.
		{" 5", yes(5), yes(5), yes(5), inv, inv},
		{"\t\n5", yes(5), yes(5), yes(5), inv, inv},
		{"\xa05", yes(5), yes(5), yes(5), inv, inv},
		{" -5", no, no, yes(uint64(1<<64 - 5)), inv, inv},
		{"- 5", no, no, no, inv, inv},
		{"5 ", no, no, no, inv, inv},
		{"5\n", no, no, no, yes(5), yes(5)},
		{"5\n\n", no, no, no, inv, inv},
		{"5x", no, no, no, inv, inv},
		{"", no, no, no, inv, inv},
		{" ", no, no, no, inv, inv},
		{"\n", no, no, no, inv, inv},
		// A C string ends at NUL.
		{"5\x00junk", yes(5), yes(5), yes(5), yes(5), yes(5)},
		{"\x005", no, no, no, inv, inv},
		// Overflow: sscanf wraps modulo 2^64 and cuts to the type; kstrto*
		// refuses with ERANGE.
		{"4294967295", yes(1<<32 - 1), yes(1<<32 - 1), yes(neg1), yes(1<<32 - 1), yes(1<<32 - 1)},
		{"4294967296", yes(0), yes(1 << 32), yes(0), rng, yes(1 << 32)},
		{"4294967297", yes(1), yes(1<<32 + 1), yes(1), rng, yes(1<<32 + 1)},
		{"2147483648", yes(1 << 31), yes(1 << 31), yes(uint64(1<<64 - 1<<31)), yes(1 << 31), yes(1 << 31)},
		{"18446744073709551615", yes(1<<32 - 1), yes(neg1), yes(neg1), rng, yes(neg1)},
		{"18446744073709551616", yes(0), yes(0), yes(0), rng, rng},
		{"18446744073709551617", yes(1), yes(1), yes(1), rng, rng},
		{"-18446744073709551617", no, no, yes(neg1), inv, inv},
		{"99999999999999999999x", no, no, no, rng, rng},
	} {
		for _, r := range []struct {
			name string
			f    func(string) result
			want result
		}{
			{"%u%c", scan32, c.u}, {"%llu%c", scan64, c.llu}, {"%d%c", scanInt, c.d},
			{"kstrtouint", kst32, c.kst}, {"kstrtoull", kst64, c.kstll},
		} {
			if got := r.f(c.in); got != r.want {
				t.Errorf("%s(%q) = %+v, want %+v", r.name, c.in, got, r.want)
			}
		}
	}
}

// TestScanner reads dm-stats' composite formats.
func TestScanner(t *testing.T) {
	// sscanf(a, "%llu+%llu%c", &start, &len, &dummy) == 2
	rangeOf := func(a string) (uint64, uint64, bool) {
		sc := NewScanner(a)
		start, ok1 := sc.Uint64()
		if !ok1 || !sc.Literal('+') {
			return 0, 0, false
		}
		n, ok2 := sc.Uint64()
		if !ok2 || !sc.Done() {
			return 0, 0, false
		}
		return start, n, true
	}
	for _, c := range []struct {
		in       string
		start, n uint64
		ok       bool
	}{
		{"0+8", 0, 8, true}, {"5+ 3", 5, 3, true}, {" 5+3", 5, 3, true},
		{"5 +3", 0, 0, false}, {"+5+3", 0, 0, false}, {"5+", 0, 0, false}, {"5", 0, 0, false},
		{"5+3 ", 0, 0, false}, {"5+-3", 0, 0, false}, {"18446744073709551621+1", 5, 1, true},
	} {
		s, n, ok := rangeOf(c.in)
		if s != c.start || n != c.n || ok != c.ok {
			t.Errorf("%%llu+%%llu%%c on %q = %d, %d, %v; want %d, %d, %v", c.in, s, n, ok, c.start, c.n, c.ok)
		}
	}
	var zero Scanner
	if _, ok := zero.Uint32(); ok || !zero.Done() || zero.Literal('/') {
		t.Error("the zero Scanner does not read as an empty string")
	}
	sc := NewScanner("/ 7")
	if !sc.Literal('/') {
		t.Fatal("literal '/' not matched")
	}
	if v, ok := sc.Uint32(); !ok || v != 7 || !sc.Done() {
		t.Errorf("/%%u%%c on \"/ 7\" = %d, %v", v, ok)
	}
	if _, ok := sc.Uint64(); ok {
		t.Error("a conversion at the end of the string matched")
	}
}

// refScan is an independent statement of one sscanf integer conversion with
// "%c" after it: the C string, leading kernel white space, a '-' if signed,
// then only decimal digits; the value is taken modulo 2^64 (and negated mod
// 2^64 after a '-').
func refScan(s string, signed bool) (uint64, bool) {
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	for s != "" && strings.IndexByte(" \t\n\v\f\r\xa0", s[0]) >= 0 {
		s = s[1:]
	}
	neg := false
	if signed && strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	}
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	v, _ := new(big.Int).SetString(s, 10)
	if neg {
		v.Neg(v)
	}
	mod := new(big.Int).Lsh(big.NewInt(1), 64)
	v.Mod(v, mod)
	return v.Uint64(), true
}

// refKstrtoull states kstrtoull through strconv: one '+' and one trailing
// newline removed, then plain decimal digits that fit in 64 bits.
func refKstrtoull(s string) (uint64, syscall.Errno) {
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimPrefix(s, "+")
	digits := strings.TrimSuffix(s, "\n")
	v, err := strconv.ParseUint(digits, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, syscall.ERANGE
	case err != nil:
		// strconv stops at the first bad character; the kernel reads all
		// the digits first and reports an overflow before junk.
		i := 0
		for i < len(digits) && '0' <= digits[i] && digits[i] <= '9' {
			i++
		}
		if _, e := strconv.ParseUint(digits[:i], 10, 64); i > 0 && errors.Is(e, strconv.ErrRange) {
			return 0, syscall.ERANGE
		}
		return 0, syscall.EINVAL
	}
	return v, 0
}

func FuzzRules(f *testing.F) {
	for _, s := range []string{"0", "5", "+5", "-0", "-5", "0x10", "010", " 5", "5 ", "5\n", "",
		"4294967296", "4294967297", "18446744073709551616", "99999999999999999999x", "\xa07", "5\x00x", "\xb90"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want64, ok := refScan(s, false)
		if got := scan64(s); got != (result{v: want64 * b2u(ok), ok: ok}) {
			t.Fatalf("%%llu%%c(%q) = %+v; reference %d, %v", s, got, want64, ok)
		}
		if got := scan32(s); got != (result{v: uint64(uint32(want64)) * b2u(ok), ok: ok}) {
			t.Fatalf("%%u%%c(%q) = %+v; reference %d, %v", s, got, uint32(want64), ok)
		}
		wantD, ok := refScan(s, true)
		if got := scanInt(s); got != (result{v: uint64(int64(int32(wantD))) * b2u(ok), ok: ok}) {
			t.Fatalf("%%d%%c(%q) = %+v; reference %d, %v", s, got, int32(wantD), ok)
		}
		wantK, errno := refKstrtoull(s)
		if got := kst64(s); got != (result{v: wantK, ok: errno == 0, errno: errno}) {
			t.Fatalf("kstrtoull(%q) = %+v; reference %d, %v", s, got, wantK, errno)
		}
		got32 := kst32(s)
		switch {
		case errno != 0:
			if got32 != (result{errno: errno}) {
				t.Fatalf("kstrtouint(%q) = %+v; kstrtoull refused with %v", s, got32, errno)
			}
		case wantK > 1<<32-1:
			if got32 != rng {
				t.Fatalf("kstrtouint(%q) = %+v; want ERANGE for %d", s, got32, wantK)
			}
		case got32 != yes(wantK):
			t.Fatalf("kstrtouint(%q) = %+v; want %d", s, got32, wantK)
		}
	})
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func TestStrtoull(t *testing.T) {
	for _, tc := range []struct {
		s  string
		v  uint64
		ok bool
	}{
		{"", 0, true}, {"0", 0, true}, {"12", 12, true}, {"0x1f", 31, true}, {"0X1F", 31, true},
		{"017", 15, true}, {"08", 0, false}, {" \t7", 7, true}, {"7 ", 7, false}, {"+5", 5, true},
		{"-1", 1<<64 - 1, true}, {"-", 0, false}, {"0x", 0, false}, {"0xg", 0, false},
		{"99999999999999999999", 1<<64 - 1, true}, {"18446744073709551615", 1<<64 - 1, true},
		{"18446744073709551616", 1<<64 - 1, true}, {"1e3", 1, false}, {"abc", 0, false},
	} {
		v, ok := Strtoull(tc.s)
		if ok != tc.ok || ok && v != tc.v {
			t.Errorf("Strtoull(%q) = %d, %v; want %d, %v", tc.s, v, ok, tc.v, tc.ok)
		}
	}
}
