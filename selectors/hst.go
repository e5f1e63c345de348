package selectors

import (
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/dmarg"
)

// historical-service-time (dm-ps-historical-service-time.c, version 0.1.1).
//
// Group args: [base_weight [threshold_multiplier]]; base_weight is 0..1023 in
// 10-bit fixed point (default 972, about 0.95; 0 ignores history),
// threshold_multiplier is unsigned (default 0). Per-path args: [repeat_count],
// any unsigned value, ignored, printed as "0".
//
// Per path the selector keeps a time-weighted exponential moving average of
// the service time (hst, fixed point, initially 1024 = 1 ns), the number of
// outstanding I/Os, the time of the last completion and stale_after, the time
// after which the estimate counts as stale. All times come from the injected
// Clock in nanoseconds: with a coarse clock the service times of fast paths
// read as 0 or one tick and the selector starves the slow paths (see doc.go
// for the measurement).

const (
	hstFixedShift  = 10
	hstFixed1      = 1 << hstFixedShift
	hstFixedMax    = ^uint64(0) >> hstFixedShift
	hstFixed95     = 972
	hstMaxInflight = hstFixed1
	hstBucketShift = 24 // buckets are 2^24 ns, about 16.78 ms
	hstWeightCount = 64
)

func init() {
	register(&Type{
		Name: "historical-service-time", Version: [3]int{0, 1, 1}, TableArgs: 1, InfoArgs: 3,
		HRTimer: true,
		New:     newHST,
	})
}

type hstSelector struct {
	pathList
	clock      clock.Clock
	validCount atomic.Int32 // s->valid_count, read without the list lock in end_io
	weights    [hstWeightCount]uint32
	threshold  uint32
}

func newHST(args []string, c clock.Clock) (Selector, error) {
	const name = "historical-service-time"
	if len(args) > 2 {
		return nil, &ArgError{Selector: name, Reason: fmt.Sprintf("%d args, at most 2 allowed ([base_weight [threshold_multiplier]])", len(args)),
			Kernel: KernelCtrFailed}
	}
	base := uint32(hstFixed95)
	if len(args) > 0 {
		v, ok := dmarg.Uint32(args[0])
		if !ok || v >= hstFixed1 {
			reason := "must be 0..1023"
			if !ok {
				reason = "not an unsigned decimal integer"
			}
			return nil, &ArgError{Selector: name, Arg: "base_weight", Value: args[0], Reason: reason, Kernel: KernelCtrFailed}
		}
		base = v
	}
	var threshold uint32
	if len(args) > 1 {
		v, ok := dmarg.Uint32(args[1])
		if !ok {
			return nil, &ArgError{Selector: name, Arg: "threshold_multiplier", Value: args[1],
				Reason: "not an unsigned decimal integer", Kernel: KernelCtrFailed}
		}
		threshold = v
	}
	if c == nil {
		c = clock.System
	}
	s := &hstSelector{clock: c, threshold: threshold}
	s.init()
	s.weights = hstWeights(base)
	return s, nil
}

// fixedPower is x^n in fixed point with frac bits, by square-and-multiply,
// rounding at every step (kernel/sched/loadavg.c's fixed_power_int).
func fixedPower(x uint64, frac uint, n uint) uint64 {
	result := uint64(1) << frac
	if n != 0 {
		for {
			if n&1 != 0 {
				result *= x
				result += 1 << (frac - 1)
				result >>= frac
			}
			n >>= 1
			if n == 0 {
				break
			}
			x *= x
			x += 1 << (frac - 1)
			x >>= frac
		}
	}
	return result
}

// hstWeights is hst_set_weights: w[i] = base^(i+1) for i < 63, w[63] = 0.
func hstWeights(base uint32) (w [hstWeightCount]uint32) {
	for i := 0; i < hstWeightCount-1; i++ {
		w[i] = uint32(fixedPower(uint64(base), hstFixedShift, uint(i+1)))
	}
	w[hstWeightCount-1] = 0
	return w
}

// fixedEMA is (last*weight + next*(1024-weight) + 512) >> 10 in u64.
func fixedEMA(last, next, weight uint64) uint64 {
	last *= weight
	last += next * (hstFixed1 - weight)
	last += 1 << (hstFixedShift - 1)
	return last >> hstFixedShift
}

// weight is hst_weight: the weight for a sample of delta ns.
func (s *hstSelector) weight(delta uint64) uint64 {
	b := delta >> hstBucketShift
	if b > hstWeightCount-1 {
		b = hstWeightCount - 1
	}
	return uint64(s.weights[b])
}

func (s *hstSelector) AddPath(p *Path, args []string) error {
	rc, err := parseRepeatCount("historical-service-time", args, 1)
	if err != nil {
		return err
	}
	if err := s.add(p, &pathInfo{repeat: rc, hst: hstFixed1}); err != nil {
		return err
	}
	s.validCount.Add(1)
	return nil
}

func (s *hstSelector) FailPath(p *Path) {
	if s.fail(p) {
		s.validCount.Add(-1)
	}
}

func (s *hstSelector) ReinstatePath(p *Path) error {
	ok, err := s.reinstate(p, false)
	if ok {
		s.validCount.Add(1)
	}
	return err
}

// hstSnap is what hst_fill_compare copies under the path's lock.
type hstSnap struct{ hst, out, stale uint64 }

func (pi *pathInfo) hstSnap() hstSnap {
	pi.mu.Lock()
	v := hstSnap{pi.hst, pi.outstanding, pi.staleAfter}
	pi.mu.Unlock()
	return v
}

// hstCompare is hst_compare: < 0 means p1 is better, > 0 means p2 is. The C
// types are kept: hst is u64, outstanding and stale_after are read into long
// long, and comparisons against now (u64) are unsigned.
func hstCompare(a, b hstSnap, now uint64, threshold uint32) int64 {
	hst1, hst2 := a.hst, b.hst
	out1, out2 := int64(a.out), int64(b.out)
	stale1, stale2 := int64(a.stale), int64(b.stale)

	// Estimates too similar: fewer outstanding wins.
	var over bool
	if hst1 > hst2 {
		over = hst1 > uint64(threshold)*hst2
	} else {
		over = hst2 > uint64(threshold)*hst1
	}
	if !over {
		return out1 - out2
	}

	// An idle stale path is chosen; of two idle paths, the more stale one.
	if (out1 == 0 && uint64(stale1) < now) || (out2 == 0 && uint64(stale2) < now) || (out1 == 0 && out2 == 0) {
		return b2i(out2 == 0)*stale1 - b2i(out1 == 0)*stale2
	}

	// Predicted completion time.
	var p2Better bool
	if out1 == out2 {
		p2Better = hst1 > hst2
	} else {
		if out1 >= hstMaxInflight || out2 >= hstMaxInflight {
			hst1 >>= hstFixedShift
			hst2 >>= hstFixedShift
		}
		p2Better = uint64(1+out1)*hst1 > uint64(1+out2)*hst2
	}

	// A stale winner is limited to equal use.
	if p2Better {
		if uint64(stale2) < now {
			return out1 - out2
		}
		return 1
	}
	if uint64(stale1) < now {
		return out1 - out2
	}
	return -1
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (s *hstSelector) SelectPath(nbytes int) *Path {
	now := uint64(s.clock.Nanotime())
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *pathInfo
	var bestSnap hstSnap
	for n := s.valid.next; n != &s.valid; n = n.next {
		snap := n.pi.hstSnap()
		if best == nil || hstCompare(snap, bestSnap, now, s.threshold) < 0 {
			best, bestSnap = n.pi, snap
		}
	}
	if best == nil {
		return nil
	}
	moveTail(&s.valid, &best.link)
	return best.path
}

func (s *hstSelector) StartIO(p *Path, nbytes int) {
	if pi := s.info(p); pi != nil {
		pi.mu.Lock()
		pi.outstanding++
		pi.mu.Unlock()
	}
}

func (s *hstSelector) EndIO(p *Path, nbytes int, startNs int64) {
	pi := s.info(p)
	if pi == nil {
		return
	}
	pi.mu.Lock()
	st := pi.serviceTime(uint64(startNs), uint64(s.clock.Nanotime()))
	pi.outstanding--
	sample := st * hstFixed1 // wraps like the kernel's u64 product
	if sample > hstFixedMax {
		sample = hstFixedMax
	}
	pi.hst = fixedEMA(pi.hst, sample, s.weight(st))
	pi.staleAfter = pi.lastFinish + uint64(int64(s.validCount.Load()))*(pi.hst>>hstFixedShift)
	pi.mu.Unlock()
}

// serviceTime is path_service_time: if an earlier I/O on the path finished
// after this one was issued, the two count as run back to back.
func (pi *pathInfo) serviceTime(start, now uint64) uint64 {
	if int64(start-pi.lastFinish) < 0 { // time_after64(last_finish, start)
		start = pi.lastFinish
	}
	pi.lastFinish = now
	if int64(now-start) < 0 { // time_before64(now, start)
		return 0
	}
	return now - start
}

func (s *hstSelector) Status(p *Path, t StatusType) string {
	if p == nil {
		return "2 " + strconv.FormatUint(uint64(s.weights[0]), 10) + " " + strconv.FormatUint(uint64(s.threshold), 10) + " "
	}
	pi := s.info(p)
	if pi == nil {
		return ""
	}
	if t == StatusTable {
		return "0 "
	}
	v := pi.hstSnap()
	return strconv.FormatUint(v.hst, 10) + " " + strconv.FormatUint(v.out, 10) + " " + strconv.FormatUint(v.stale, 10) + " "
}
