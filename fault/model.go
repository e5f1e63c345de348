package fault

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
)

// The performance model gives each I/O the time it completes at, from the
// time it arrives: throttles first (every bucket that applies admits it, at
// the latest of their times), then stall episodes and garbage collection
// hold it, then it is served: by one of N parallel units (the first free;
// 0 units serve everything at once), for a service time drawn from the
// read, write or flush distribution, or the disk model's seek, rotation and
// transfer, stretched during slow episodes. The target then waits until
// that time on the delay scheduler.

// bucket is a token bucket as a GCRA meter: tokens flow in at rate per
// second up to tau seconds' worth; an I/O costing c tokens is admitted
// when they are there.
type bucket struct {
	mu     sync.Mutex
	name   string
	ops    opSet // which I/O it meters (reads, writes, or both)
	bytes  bool  // costs bytes, else operations
	ioSize int64 // an operation larger than this costs size/ioSize (0: 1 each)
	rate   float64
	tau    int64 // ns of tokens it holds
	tat    int64 // theoretical arrival time, ns
}

// cost is what an I/O of n bytes costs in b.
func (b *bucket) cost(n int64) float64 {
	if b.bytes {
		return float64(n)
	}
	if b.ioSize > 0 && n > b.ioSize {
		return float64((n + b.ioSize - 1) / b.ioSize)
	}
	return 1
}

// admit books an I/O of cost c arriving at t and returns when it may go.
func (b *bucket) admit(t int64, c float64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	tat := max(b.tat, t)
	start := max(t, tat-b.tau)
	b.tat = tat + int64(c/b.rate*1e9)
	return start
}

// episodes are periodic windows (every, for), each shifted by up to jitter.
type episodes struct {
	every, dur, jitter int64
	factor             float64 // slow episodes: service times times factor
	key                uint64
}

// window returns the episode window around t (relative to load), if t is in
// one.
func (e *episodes) in(seed uint64, t int64) (end int64, ok bool) {
	if e.every == 0 || t < 0 {
		return 0, false
	}
	k := t / e.every
	for _, i := range []int64{k, k - 1} {
		if i < 0 {
			continue
		}
		start := i * e.every
		if e.jitter > 0 {
			start += int64(unit(draw(seed, e.key, uint64(i), 0)) * float64(e.jitter))
		}
		if t >= start && t < start+e.dur {
			return start + e.dur, true
		}
	}
	return 0, false
}

// hddModel is a spinning disk: seek by distance (square root for short
// seeks, linear for long ones, Ruemmler and Wilkes' shape), rotation
// uniform over a revolution, transfer at a rate falling from the outer zone
// to the inner one.
type hddModel struct {
	size   int64 // bytes
	rpm    float64
	minSk  float64 // ns: track-to-track
	maxSk  float64 // ns: full stroke
	outer  float64 // bytes per second at the outer edge
	inner  float64
	mu     sync.Mutex
	head   int64
	seekTr int64 // moves up to this many bytes are on the same track
}

func (h *hddModel) service(seed uint64, idx uint64, off, n int64) int64 {
	h.mu.Lock()
	d := off - h.head
	h.head = off + n
	h.mu.Unlock()
	if d < 0 {
		d = -d
	}
	var seek float64
	if d > h.seekTr {
		x := float64(d) / float64(h.size)
		seek = h.minSk + (h.maxSk-h.minSk)*(0.6*math.Sqrt(x)+0.4*x)
	}
	rev := 60e9 / h.rpm
	rot := unit(draw(seed, keyHDD, idx, 0)) * rev
	rate := h.outer - (h.outer-h.inner)*float64(off)/float64(h.size)
	xfer := float64(n) / rate * 1e9
	return int64(seek + rot + xfer)
}

var (
	keyHDD     = keyOf("hdd")
	keyModel   = keyOf("model")
	keyStall   = keyOf("stall")
	keySlow    = keyOf("slow")
	keyStuck   = keyOf("stuck")
	keyCorrupt = keyOf("corrupt")
)

// model is a device's performance model.
type model struct {
	lat     [3]Dist // read, write, flush service times
	units   int
	buckets []*bucket
	stall   episodes
	slow    episodes
	gcEvery int64 // bytes written between collections
	gcFor   int64
	hdd     *hddModel

	mu      sync.Mutex
	free    []int64 // when each unit is free, ns relative to load
	written int64
	held    int64 // nothing starts before this (a collection)
}

func (m *model) empty() bool {
	return m.lat == [3]Dist{} && len(m.buckets) == 0 && m.stall.every == 0 && m.slow.every == 0 && m.gcEvery == 0 && m.hdd == nil && m.units == 0
}

// class is the latency class of an op.
func class(o Op) int {
	switch o {
	case OpRead:
		return 0
	case OpFlush:
		return 2
	}
	return 1
}

// complete returns when an I/O arriving at now (ns since load) completes.
func (m *model) complete(seed uint64, idx uint64, o Op, fua bool, off, n, now int64) int64 {
	t := now
	for _, b := range m.buckets {
		if b.ops.has(o, fua) && o != OpFlush {
			t = max(t, b.admit(t, b.cost(n)))
		}
	}
	if end, ok := m.stall.in(seed, t); ok {
		t = end
	}
	var s int64
	switch {
	case m.hdd != nil && o != OpFlush:
		s = m.hdd.service(seed, idx, off, n)
	case m.lat[class(o)] != nil:
		s = m.lat[class(o)].Sample(func(sub uint64) uint64 { return draw(seed, keyModel, idx, sub) })
	}
	if _, ok := m.slow.in(seed, t); ok {
		s = int64(float64(s) * m.slow.factor)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t = max(t, m.held)
	done := t + s
	if m.units > 0 {
		i := 0
		for j, f := range m.free {
			if f < m.free[i] {
				i = j
			}
		}
		done = max(t, m.free[i]) + s
		m.free[i] = done
	}
	if m.gcEvery > 0 && (o == OpWrite || o == OpZeroes) {
		m.written += n
		if m.written >= m.gcEvery {
			m.written -= m.gcEvery
			m.held = done + m.gcFor
			for i := range m.free {
				m.free[i] = max(m.free[i], m.held)
			}
		}
	}
	return done
}

// throttle words: iops, riops, wiops, bps, rbps, wbps = RATE[/BURST[/SECONDS]].
var throttleOps = map[string]opSet{
	"iops": 0, "riops": 1 << OpRead, "wiops": 1<<OpWrite | 1<<OpDiscard | 1<<OpZeroes,
	"bps": 0, "rbps": 1 << OpRead, "wbps": 1<<OpWrite | 1<<OpDiscard | 1<<OpZeroes,
}

// parseThrottle makes the buckets of one throttle word: a bucket at RATE
// holding RATE x 1 s, or with BURST one holding BURST x SECONDS (default
// 1 s) and a second at BURST holding a tenth of a second of it, which caps
// the burst's rate (QEMU's -max and -max-length).
func parseThrottle(k, v string, ioSize int64) ([]*bucket, error) {
	parts := strings.Split(v, "/")
	if len(parts) > 3 {
		return nil, fmt.Errorf("%s=RATE[/BURST[/SECONDS]]", k)
	}
	num := func(s string) (float64, error) {
		if strings.HasSuffix(k, "bps") {
			b, err := parseSize(s)
			if err != nil || b <= 0 {
				return 0, fmt.Errorf("%q is not a rate above 0", s)
			}
			return float64(b), nil
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, fmt.Errorf("%q is not a rate above 0", s)
		}
		return f, nil
	}
	rate, err := num(parts[0])
	if err != nil || rate <= 0 {
		return nil, fmt.Errorf("%s: %q is not a rate above 0", k, parts[0])
	}
	mk := func(r float64, tau float64) *bucket {
		return &bucket{name: k, ops: throttleOps[k], bytes: strings.HasSuffix(k, "bps"), ioSize: ioSize, rate: r, tau: int64(tau * 1e9)}
	}
	if len(parts) == 1 {
		return []*bucket{mk(rate, 1)}, nil
	}
	burst, err := num(parts[1])
	if err != nil || burst < rate {
		return nil, fmt.Errorf("%s: the burst %q must be a rate at least the base %q", k, parts[1], parts[0])
	}
	secs := 1.0
	if len(parts) == 3 {
		d, err := ParseDuration(parts[2])
		if err != nil || d == 0 {
			return nil, fmt.Errorf("%s: %q is not a duration above 0", k, parts[2])
		}
		secs = float64(d) / 1e9
	}
	return []*bucket{mk(rate, burst*secs/rate), mk(burst, 0.1)}, nil
}

// parseEpisodes reads EVERY/FOR[/JITTER] (stall) or EVERY/FOR/FACTOR (slow).
func parseEpisodes(k, v string, key uint64) (episodes, error) {
	parts := strings.Split(v, "/")
	e := episodes{key: key}
	bad := fmt.Errorf("%s=EVERY/FOR%s", k, map[bool]string{true: "/FACTOR", false: "[/JITTER]"}[k == "slow"])
	if len(parts) < 2 || len(parts) > 3 || k == "slow" && len(parts) != 3 {
		return e, bad
	}
	var err error
	if e.every, err = ParseDuration(parts[0]); err != nil || e.every == 0 {
		return e, bad
	}
	if e.dur, err = ParseDuration(parts[1]); err != nil || e.dur == 0 || e.dur >= e.every {
		return e, fmt.Errorf("%s: an episode lasts more than 0 and less than its period", k)
	}
	if len(parts) == 3 {
		if k == "slow" {
			f, err := strconv.ParseFloat(parts[2], 64)
			if err != nil || f < 1 || math.IsInf(f, 0) {
				return e, fmt.Errorf("slow: the factor %q must be at least 1", parts[2])
			}
			e.factor = f
		} else if e.jitter, err = ParseDuration(parts[2]); err != nil || e.jitter > e.every-e.dur {
			return e, fmt.Errorf("stall: the jitter must fit between the episodes")
		}
	}
	return e, nil
}
