package fault

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

// Event is one injected fault, as the event log keeps it:
//
//	<index> <ns since load> <op> <sector> <sectors> <rule> <action> [<draw>]
//
// index is the I/O's number on the device (from 0, in arrival order), draw
// what the action drew (a torn write's units kept, a corruption's seed),
// which a replay uses as it is.
type Event struct {
	Index   uint64
	Time    int64
	Op      Op
	Sector  int64
	Sectors int64
	Rule    string
	Action  string
	Draw    uint64
}

func (e Event) String() string {
	return fmt.Sprintf("%d %d %s %d %d %s %s %d", e.Index, e.Time, e.Op, e.Sector, e.Sectors, e.Rule, e.Action, e.Draw)
}

// ParseEvents reads an event log.
func ParseEvents(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 8 {
			return nil, fmt.Errorf("event log line %d: %d fields, want 8", line, len(f))
		}
		var e Event
		var err error
		nums := []*uint64{&e.Index, nil, nil, nil, nil, nil, nil, &e.Draw}
		for i, p := range nums {
			if p != nil {
				if *p, err = strconv.ParseUint(f[i], 10, 64); err != nil {
					return nil, fmt.Errorf("event log line %d: %q: %w", line, f[i], err)
				}
			}
		}
		if e.Time, err = strconv.ParseInt(f[1], 10, 64); err == nil {
			if e.Sector, err = strconv.ParseInt(f[3], 10, 64); err == nil {
				e.Sectors, err = strconv.ParseInt(f[4], 10, 64)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("event log line %d: %w", line, err)
		}
		found := false
		for i, n := range opNames {
			if f[2] == n {
				e.Op, found = Op(i), true
			}
		}
		if !found {
			return nil, fmt.Errorf("event log line %d: unknown op %q", line, f[2])
		}
		e.Rule, e.Action = f[5], f[6]
		out = append(out, e)
	}
	return out, sc.Err()
}

// eventLog is a ring of the last events.
type eventLog struct {
	mu    sync.Mutex
	ring  []Event
	next  int
	total uint64
}

func newEventLog(n int) *eventLog { return &eventLog{ring: make([]Event, 0, n)} }

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	if cap(l.ring) == 0 {
		return
	}
	if len(l.ring) < cap(l.ring) {
		l.ring = append(l.ring, e)
		return
	}
	l.ring[l.next] = e
	l.next = (l.next + 1) % len(l.ring)
}

// last returns up to n of the latest events, oldest first (n <= 0: all
// kept).
func (l *eventLog) last(n int) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Event, 0, len(l.ring))
	out = append(out, l.ring[l.next:]...)
	out = append(out, l.ring[:l.next]...)
	if n > 0 && n < len(out) {
		out = out[len(out)-n:]
	}
	return out
}

func (l *eventLog) count() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// appendText appends the kept events, one per line.
func (l *eventLog) appendText(b []byte, n int) []byte {
	for _, e := range l.last(n) {
		b = append(b, e.String()...)
		b = append(b, '\n')
	}
	return b
}

// atlas is shared by a group of devices (atlas=NAME/F/REGION): in each
// region of REGION sectors, faults of rules marked atlas may hit at most F
// of the devices, the first F to be hit there.
type atlas struct {
	mu     sync.Mutex
	f      int
	region int64
	hit    map[int64][]any
}

// allow reports whether device dev may take a fault on sectors [s, s+n),
// and books it.
func (a *atlas) allow(dev any, s, n int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	first, last := s/a.region, (s+max(n, 1)-1)/a.region
	for r := first; r <= last; r++ {
		if !a.has(r, dev) && len(a.hit[r]) >= a.f {
			return false
		}
	}
	for r := first; r <= last; r++ {
		if !a.has(r, dev) {
			a.hit[r] = append(a.hit[r], dev)
		}
	}
	return true
}

func (a *atlas) has(r int64, dev any) bool {
	for _, d := range a.hit[r] {
		if d == dev {
			return true
		}
	}
	return false
}

func (a *atlas) reset() {
	a.mu.Lock()
	a.hit = map[int64][]any{}
	a.mu.Unlock()
}
