package selectors

import (
	"strconv"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// round-robin (dm-ps-round-robin.c, version 1.2.0).
//
// Group args are ignored. Per-path args: [repeat_count], clamped to 1.
// Select takes the head of the valid list and moves it to the tail; fail moves
// a path to the head of the failed list; reinstate moves it to the head of the
// valid list, so a reinstated path is chosen next.

func init() {
	register(&Type{
		Name: "round-robin", Version: [3]int{1, 2, 0}, TableArgs: 1, InfoArgs: 0,
		New: func(args []string, c clock.Clock) (Selector, error) {
			s := &roundRobin{}
			s.init()
			return s, nil
		},
	})
}

type roundRobin struct{ pathList }

func (s *roundRobin) AddPath(p *Path, args []string) error {
	rc, err := parseRepeatCount("round-robin", args, 1)
	if err != nil {
		return err
	}
	return s.add(p, &pathInfo{repeat: clampRepeatCount(rc)})
}

func (s *roundRobin) FailPath(p *Path) { s.fail(p) }

func (s *roundRobin) ReinstatePath(p *Path) error {
	_, err := s.reinstate(p, true)
	return err
}

func (s *roundRobin) SelectPath(nbytes int) *Path {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.valid.next
	if n == &s.valid {
		return nil
	}
	moveTail(&s.valid, n)
	return n.pi.path
}

func (s *roundRobin) Status(p *Path, t StatusType) string {
	if p == nil {
		return "0 "
	}
	pi := s.info(p)
	if pi == nil || t != StatusTable {
		return ""
	}
	return strconv.FormatUint(uint64(pi.repeat), 10) + " "
}
