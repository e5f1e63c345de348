package fault

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Dist is a latency distribution: Sample draws a duration in nanoseconds.
// Distributions are written as
//
//	1ms                   a constant (also const(1ms))
//	uniform(100us,2ms)    uniform between the two
//	exp(1ms[,20ms])       exponential with that mean, capped (default 20x
//	                      the mean, as Pebble caps its latency)
//	lognormal(P50,P99)    lognormal with that median and 99th percentile
//	                      (also pct(P50,P99))
//	mix(W*D,W*D,...)      D with probability W (weights summing to 1)
//
// with durations in ns, us, ms or s (a bare number is milliseconds).
type Dist interface {
	Sample(src source) int64
	String() string
}

type constDist int64

func (c constDist) Sample(source) int64 { return int64(c) }
func (c constDist) String() string      { return formatDur(int64(c)) }

type uniformDist struct{ lo, hi int64 }

func (u uniformDist) Sample(src source) int64 {
	return u.lo + int64(unit(src(0))*float64(u.hi-u.lo))
}
func (u uniformDist) String() string {
	return "uniform(" + formatDur(u.lo) + "," + formatDur(u.hi) + ")"
}

type expDist struct{ mean, cap int64 }

func (e expDist) Sample(src source) int64 {
	v := -math.Log(1-unit(src(0))) * float64(e.mean)
	return int64(min(v, float64(e.cap)))
}
func (e expDist) String() string { return "exp(" + formatDur(e.mean) + "," + formatDur(e.cap) + ")" }

// lognormalDist has median m and 99th percentile p99: sigma = ln(p99/m) /
// z(0.99).
type lognormalDist struct {
	p50, p99 int64
	mu, sig  float64
}

const z99 = 2.3263478740408408

func newLognormal(p50, p99 int64) lognormalDist {
	return lognormalDist{p50: p50, p99: p99, mu: math.Log(float64(p50)), sig: math.Log(float64(p99)/float64(p50)) / z99}
}

func (l lognormalDist) Sample(src source) int64 {
	return int64(math.Exp(l.mu + l.sig*normal(src(0), src(1))))
}
func (l lognormalDist) String() string {
	return "lognormal(" + formatDur(l.p50) + "," + formatDur(l.p99) + ")"
}

// Quantile is the distribution's q-quantile, for tests and the KS check.
func (l lognormalDist) quantile(q float64) float64 {
	return math.Exp(l.mu + l.sig*math.Sqrt2*math.Erfinv(2*q-1))
}

type mixDist struct {
	w []float64 // cumulative
	d []Dist
}

func (m mixDist) Sample(src source) int64 {
	u := unit(src(7))
	for i, c := range m.w {
		if u < c || i == len(m.w)-1 {
			return m.d[i].Sample(func(sub uint64) uint64 { return src(sub + 16) })
		}
	}
	return 0
}

func (m mixDist) String() string {
	parts := make([]string, len(m.d))
	prev := 0.0
	for i, d := range m.d {
		parts[i] = strconv.FormatFloat(m.w[i]-prev, 'g', -1, 64) + "*" + d.String()
		prev = m.w[i]
	}
	return "mix(" + strings.Join(parts, ",") + ")"
}

// ParseDist parses a distribution.
func ParseDist(s string) (Dist, error) {
	d, rest, err := parseDist(s)
	if err != nil {
		return nil, err
	}
	if rest != "" {
		return nil, fmt.Errorf("%q: unexpected %q", s, rest)
	}
	return d, nil
}

func parseDist(s string) (Dist, string, error) {
	name, args, rest, call := splitCall(s)
	if !call {
		// A bare duration, up to a ',' or ')' of an enclosing call.
		i := strings.IndexAny(s, ",)")
		if i < 0 {
			i = len(s)
		}
		d, err := ParseDuration(s[:i])
		if err != nil {
			return nil, "", err
		}
		return constDist(d), s[i:], nil
	}
	durs := func(n, m int) ([]int64, error) {
		if len(args) < n || len(args) > m {
			return nil, fmt.Errorf("%s: takes %d to %d arguments, not %d", name, n, m, len(args))
		}
		out := make([]int64, len(args))
		for i, a := range args {
			d, err := ParseDuration(a)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			out[i] = d
		}
		return out, nil
	}
	switch name {
	case "const":
		v, err := durs(1, 1)
		if err != nil {
			return nil, "", err
		}
		return constDist(v[0]), rest, nil
	case "uniform":
		v, err := durs(2, 2)
		if err != nil {
			return nil, "", err
		}
		if v[1] < v[0] {
			return nil, "", fmt.Errorf("uniform: %s is below %s", args[1], args[0])
		}
		return uniformDist{v[0], v[1]}, rest, nil
	case "exp":
		v, err := durs(1, 2)
		if err != nil {
			return nil, "", err
		}
		if v[0] <= 0 {
			return nil, "", fmt.Errorf("exp: the mean must be above 0")
		}
		c := 20 * v[0]
		if len(v) == 2 {
			if v[1] < v[0] {
				return nil, "", fmt.Errorf("exp: the cap %s is below the mean %s", args[1], args[0])
			}
			c = v[1]
		}
		return expDist{v[0], c}, rest, nil
	case "lognormal", "pct":
		v, err := durs(2, 2)
		if err != nil {
			return nil, "", err
		}
		if v[0] <= 0 || v[1] < v[0] {
			return nil, "", fmt.Errorf("%s: p99 %s must be at least p50 %s, and p50 above 0", name, args[1], args[0])
		}
		return newLognormal(v[0], v[1]), rest, nil
	case "mix":
		m := mixDist{}
		sum := 0.0
		for _, a := range args {
			ws, ds, ok := strings.Cut(a, "*")
			if !ok {
				return nil, "", fmt.Errorf("mix: %q is not WEIGHT*DIST", a)
			}
			w, err := ParseProbability(ws)
			if err != nil {
				return nil, "", fmt.Errorf("mix: %w", err)
			}
			d, err := ParseDist(ds)
			if err != nil {
				return nil, "", fmt.Errorf("mix: %w", err)
			}
			sum += w
			m.w, m.d = append(m.w, sum), append(m.d, d)
		}
		if len(m.d) == 0 || math.Abs(sum-1) > 1e-9 {
			return nil, "", fmt.Errorf("mix: the weights sum to %g, not 1", sum)
		}
		return m, rest, nil
	}
	return nil, "", fmt.Errorf("unknown distribution %q", name)
}

// splitCall splits NAME(ARG,ARG,...)REST at the top level of parentheses.
func splitCall(s string) (name string, args []string, rest string, ok bool) {
	open := strings.IndexByte(s, '(')
	if open <= 0 || strings.ContainsAny(s[:open], ",)") {
		return "", nil, s, false
	}
	depth, start := 0, open+1
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				if i > start || len(args) > 0 {
					args = append(args, s[start:i])
				}
				return s[:open], args, s[i+1:], true
			}
		case ',':
			if depth == 1 {
				args = append(args, s[start:i])
				start = i + 1
			}
		}
	}
	return "", nil, s, false
}

// ParseDuration parses a duration in ns, us (or µs), ms or s; a bare number
// is milliseconds. It must not be negative.
func ParseDuration(s string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if v < 0 || math.IsNaN(v) || v > 1e12 {
			return 0, fmt.Errorf("duration %q out of range", s)
		}
		return int64(v * 1e6), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", s)
	}
	return int64(d), nil
}

// formatDur prints a duration that ParseDuration reads back.
func formatDur(ns int64) string {
	switch {
	case ns == 0:
		return "0s"
	case ns%1e9 == 0:
		return strconv.FormatInt(ns/1e9, 10) + "s"
	case ns%1e6 == 0:
		return strconv.FormatInt(ns/1e6, 10) + "ms"
	case ns%1e3 == 0:
		return strconv.FormatInt(ns/1e3, 10) + "us"
	}
	return strconv.FormatInt(ns, 10) + "ns"
}

// ParseProbability parses 0.25, 25% or 1:4; it must lie in [0, 1].
func ParseProbability(s string) (float64, error) {
	var v float64
	var err error
	switch {
	case strings.HasSuffix(s, "%"):
		v, err = strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		v /= 100
	case strings.Contains(s, ":"):
		a, b, _ := strings.Cut(s, ":")
		var n, d float64
		if n, err = strconv.ParseFloat(a, 64); err == nil {
			if d, err = strconv.ParseFloat(b, 64); err == nil {
				if d == 0 {
					return 0, fmt.Errorf("probability %q divides by 0", s)
				}
				v = n / d
			}
		}
	default:
		v, err = strconv.ParseFloat(s, 64)
	}
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("bad probability %q", s)
	}
	if v < 0 || v > 1 {
		return 0, fmt.Errorf("probability %q is not between 0 and 1", s)
	}
	return v, nil
}

// parseSize parses a byte count with an optional K, M, G or T suffix
// (powers of 1024) and an optional B.
func parseSize(s string) (int64, error) {
	t := strings.TrimSuffix(strings.ToUpper(s), "B")
	mul := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mul, t = 1<<10, t[:n-1]
		case 'M':
			mul, t = 1<<20, t[:n-1]
		case 'G':
			mul, t = 1<<30, t[:n-1]
		case 'T':
			mul, t = 1<<40, t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsNaN(v) || v*float64(mul) > math.MaxInt64/2 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return int64(v * float64(mul)), nil
}
