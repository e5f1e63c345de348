package selectors

import (
	"strconv"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/dmarg"
)

// service-time (dm-ps-service-time.c, version 0.3.0).
//
// Group args are ignored. Per-path args: [repeat_count [relative_throughput]];
// repeat_count is clamped to 1, relative_throughput is 0..100 (default 1).
// in_flight_size is the bytes in flight, an atomic int like the kernel's
// atomic_t (nbytes is truncated to int when added, as atomic_add does).
//
// The estimated service time of an I/O of n bytes on a path is
// (in_flight_size + n) / relative_throughput; stCompare orders two paths the
// way st_compare_load does, including its arithmetic: sizes are size_t (a
// negative atomic_t sign-extends), products wrap, and the result is truncated
// to a C int before its sign is tested.

const (
	stMaxRelativeThroughput      = 100
	stMaxRelativeThroughputShift = 7
	stMaxInflightSize            = ^uint64(0) >> stMaxRelativeThroughputShift // SIZE_MAX >> 7 (64-bit size_t)
)

func init() {
	register(&Type{
		Name: "service-time", Version: [3]int{0, 3, 0}, TableArgs: 2, InfoArgs: 2,
		New: func(args []string, c clock.Clock) (Selector, error) {
			s := &serviceTime{}
			s.init()
			return s, nil
		},
	})
}

type serviceTime struct{ pathList }

func (s *serviceTime) AddPath(p *Path, args []string) error {
	rc, err := parseRepeatCount("service-time", args, 2)
	if err != nil {
		return err
	}
	rt := uint32(1)
	if len(args) == 2 {
		v, ok := dmarg.Uint32(args[1])
		if !ok || v > stMaxRelativeThroughput {
			reason := "must be 0..100"
			if !ok {
				reason = "not an unsigned decimal integer"
			}
			return &ArgError{Selector: "service-time", Arg: "relative_throughput", Value: args[1],
				Reason: reason, Kernel: "service-time ps: invalid relative_throughput value"}
		}
		rt = v
	}
	return s.add(p, &pathInfo{repeat: clampRepeatCount(rc), rt: rt})
}

func (s *serviceTime) FailPath(p *Path) { s.fail(p) }

func (s *serviceTime) ReinstatePath(p *Path) error {
	_, err := s.reinstate(p, false)
	return err
}

// stCompare is st_compare_load: < 0 means p1 is better, > 0 means p2 is.
func stCompare(sz1, sz2 uint64, rt1, rt2 uint32, incoming uint64) int32 {
	// Case 1: same throughput: the less loaded path.
	if rt1 == rt2 {
		return int32(sz1 - sz2)
	}
	// Case 2a: same load: the higher throughput. 2b: a path with rt 0 loses.
	if sz1 == sz2 || rt1 == 0 || rt2 == 0 {
		return int32(rt2 - rt1)
	}
	// Case 3: compare (sz1+n)/rt1 with (sz2+n)/rt2 without dividing.
	sz1 += incoming
	sz2 += incoming
	if sz1 >= stMaxInflightSize || sz2 >= stMaxInflightSize {
		sz1 >>= stMaxRelativeThroughputShift
		sz2 >>= stMaxRelativeThroughputShift
	}
	st1 := sz1 * uint64(rt2)
	st2 := sz2 * uint64(rt1)
	if st1 != st2 {
		return int32(st1 - st2)
	}
	// Case 4: same estimate: the higher throughput.
	return int32(rt2 - rt1)
}

// size reads in_flight_size as the kernel's size_t sz = atomic_read(...).
func (pi *pathInfo) size() uint64 { return uint64(int64(pi.inflight.Load())) }

func (s *serviceTime) SelectPath(nbytes int) *Path {
	incoming := uint64(nbytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *pathInfo
	for n := s.valid.next; n != &s.valid; n = n.next {
		if best == nil || stCompare(n.pi.size(), best.size(), n.pi.rt, best.rt, incoming) < 0 {
			best = n.pi
		}
	}
	if best == nil {
		return nil
	}
	moveTail(&s.valid, &best.link)
	return best.path
}

func (s *serviceTime) StartIO(p *Path, nbytes int) {
	if pi := s.info(p); pi != nil {
		pi.inflight.Add(int32(nbytes))
	}
}

func (s *serviceTime) EndIO(p *Path, nbytes int, startNs int64) {
	if pi := s.info(p); pi != nil {
		pi.inflight.Add(-int32(nbytes))
	}
}

func (s *serviceTime) Status(p *Path, t StatusType) string {
	if p == nil {
		return "0 "
	}
	pi := s.info(p)
	if pi == nil {
		return ""
	}
	rt := strconv.FormatUint(uint64(pi.rt), 10) + " "
	if t == StatusInfo {
		return strconv.FormatInt(int64(pi.inflight.Load()), 10) + " " + rt
	}
	return strconv.FormatUint(uint64(pi.repeat), 10) + " " + rt
}
