package selectors

import (
	"strconv"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// queue-length (dm-ps-queue-length.c, version 0.2.0).
//
// Group args are ignored. Per-path args: [repeat_count], clamped to 1.
// qlen is the number of in-flight I/Os (an atomic int, as the kernel's
// atomic_t). Select walks the valid list keeping the first path with the
// strictly smallest qlen, stops as soon as the best has qlen 0, and moves the
// chosen path to the tail, so ties rotate. Reinstate adds at the tail.

func init() {
	register(&Type{
		Name: "queue-length", Version: [3]int{0, 2, 0}, TableArgs: 1, InfoArgs: 1,
		New: func(args []string, c clock.Clock) (Selector, error) {
			s := &queueLength{}
			s.init()
			return s, nil
		},
	})
}

type queueLength struct{ pathList }

func (s *queueLength) AddPath(p *Path, args []string) error {
	rc, err := parseRepeatCount("queue-length", args, 1)
	if err != nil {
		return err
	}
	return s.add(p, &pathInfo{repeat: clampRepeatCount(rc)})
}

func (s *queueLength) FailPath(p *Path) { s.fail(p) }

func (s *queueLength) ReinstatePath(p *Path) error {
	_, err := s.reinstate(p, false)
	return err
}

func (s *queueLength) SelectPath(nbytes int) *Path {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *pathInfo
	for n := s.valid.next; n != &s.valid; n = n.next {
		if best == nil || n.pi.qlen.Load() < best.qlen.Load() {
			best = n.pi
		}
		if best.qlen.Load() == 0 {
			break
		}
	}
	if best == nil {
		return nil
	}
	moveTail(&s.valid, &best.link)
	return best.path
}

func (s *queueLength) StartIO(p *Path, nbytes int) {
	if pi := s.info(p); pi != nil {
		pi.qlen.Add(1)
	}
}

func (s *queueLength) EndIO(p *Path, nbytes int, startNs int64) {
	if pi := s.info(p); pi != nil {
		pi.qlen.Add(-1)
	}
}

func (s *queueLength) Status(p *Path, t StatusType) string {
	if p == nil {
		return "0 "
	}
	pi := s.info(p)
	if pi == nil {
		return ""
	}
	if t == StatusInfo {
		return strconv.FormatInt(int64(pi.qlen.Load()), 10) + " "
	}
	return strconv.FormatUint(uint64(pi.repeat), 10) + " "
}
