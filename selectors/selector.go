package selectors

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/dmarg"
)

// StatusType selects which form of status a selector prints.
type StatusType int

const (
	// StatusInfo is dm's STATUSTYPE_INFO (`dmsetup status`).
	StatusInfo StatusType = iota
	// StatusTable is dm's STATUSTYPE_TABLE (`dmsetup table`).
	StatusTable
)

// Path is one path as a selector sees it. Dev is opaque to selectors: it is
// whatever the multipath target hangs there. A Path belongs to at most one
// selector (AddPath binds it); the selector's per-path state hangs off it, so
// the hot path needs no map lookup and allocates nothing.
type Path struct {
	Dev any

	pi *pathInfo // set once by AddPath, before the path is shared
}

// Selector is one priority group's path selector (dm's struct path_selector).
// Every method may be called concurrently.
type Selector interface {
	// AddPath adds p at the tail of the valid list; args are the table's
	// per-path args (the multipath target has already checked their count
	// against #per_path_args).
	AddPath(p *Path, args []string) error
	// FailPath moves p to the failed list. Failing a failed or unknown path is
	// a no-op (the multipath target only fails active paths).
	FailPath(p *Path)
	// ReinstatePath moves p back to the valid list (round-robin: at its head;
	// the others: at its tail). Reinstating a valid path is a no-op.
	ReinstatePath(p *Path) error
	// SelectPath picks the path for an I/O of nbytes bytes; nil means no usable
	// path.
	SelectPath(nbytes int) *Path
	// Status returns, for p == nil, the group-level string and otherwise p's
	// per-path string, exactly as the kernel prints them (each field followed
	// by one space; "" when the kernel prints nothing).
	Status(p *Path, t StatusType) string
}

// IOTracker is implemented by the selectors that track I/O: queue-length,
// service-time and historical-service-time (not round-robin). The multipath
// target calls StartIO after mapping an I/O to p and EndIO at its completion.
type IOTracker interface {
	StartIO(p *Path, nbytes int)
	// EndIO is told the start stamp taken from the same Clock at map time.
	EndIO(p *Path, nbytes int, startNs int64)
}

// Type describes one registered selector (dm's struct path_selector_type).
type Type struct {
	Name    string
	Version [3]int
	// TableArgs and InfoArgs are the fixed per-path field counts that the
	// multipath target prints as the group's #per_path_args in table and
	// status output.
	TableArgs, InfoArgs int
	// HRTimer is the kernel's DM_PS_USE_HR_TIMER feature: the selector wants
	// a nanosecond start stamp in EndIO (historical-service-time). dmfuse
	// always stamps I/O with the Clock, so this is informational.
	HRTimer bool
	// New creates a selector from the group-level args. Errors are *ArgError
	// and name the arg and the reason. c == nil means clock.System.
	New func(args []string, c clock.Clock) (Selector, error)
}

var types = map[string]*Type{}

func register(t *Type) { types[t.Name] = t }

// Lookup returns the selector type registered under name (case-sensitive, as
// the kernel's dm_get_path_selector).
func Lookup(name string) (*Type, bool) {
	t, ok := types[name]
	return t, ok
}

// Types returns every registered selector type, sorted by name.
func Types() []*Type {
	out := make([]*Type, 0, len(types))
	for _, t := range types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ArgError is a bad selector argument. Kernel is the exact text the kernel
// leaves in ti->error: "<selector> ps: <reason>" for per-path args, and
// "path selector constructor failed" for group args (the kernel's create
// functions set no text of their own). Arg, Value and Reason say which arg was
// wrong and why. It wraps EINVAL.
type ArgError struct {
	Selector string // selector name
	Arg      string // "repeat_count", "relative_throughput", "base_weight", ...; "" for an arg count
	Value    string // the offending word, if any
	Reason   string // why it was refused
	Kernel   string // the kernel's ti->error text
}

func (e *ArgError) Error() string {
	if e.Arg == "" {
		return fmt.Sprintf("%s (%s: %s)", e.Kernel, e.Selector, e.Reason)
	}
	return fmt.Sprintf("%s (%s: %s %q: %s)", e.Kernel, e.Selector, e.Arg, e.Value, e.Reason)
}

// Unwrap makes errors.Is(err, syscall.EINVAL) true, as the kernel returns -EINVAL.
func (e *ArgError) Unwrap() error { return syscall.EINVAL }

// KernelCtrFailed is the ti->error text dm-mpath sets when a selector's create
// function fails.
const KernelCtrFailed = "path selector constructor failed"

// parseRepeatCount parses the per-path args "[repeat_count]" (maxArgs 1) or
// the first of "[repeat_count [relative_throughput]]" (maxArgs 2) with the
// kernel's texts. It returns the repeat count as given (callers clamp).
func parseRepeatCount(name string, args []string, maxArgs int) (uint32, error) {
	if len(args) > maxArgs {
		return 0, &ArgError{Selector: name, Reason: fmt.Sprintf("%d per-path args, at most %d allowed", len(args), maxArgs),
			Kernel: name + " ps: incorrect number of arguments"}
	}
	rc := uint32(1) // *_MIN_IO
	if len(args) > 0 {
		v, ok := dmarg.Uint32(args[0])
		if !ok {
			return 0, &ArgError{Selector: name, Arg: "repeat_count", Value: args[0],
				Reason: "not an unsigned decimal integer", Kernel: name + " ps: invalid repeat count"}
		}
		rc = v
	}
	return rc, nil
}

// clampRepeatCount applies "repeat_count > 1 is deprecated, using 1 instead".
func clampRepeatCount(rc uint32) uint32 {
	if rc > 1 {
		return 1
	}
	return rc
}

// pathInfo is the per-path state of every selector (dm's struct path_info);
// each selector uses the fields it needs. It is linked into its selector's
// valid or failed list.
type pathInfo struct {
	link
	path   *Path
	owner  *pathList // the selector's lists, to refuse foreign paths
	valid  bool      // on the valid list; guarded by the selector's mu
	repeat uint32    // repeat_count, as printed

	// queue-length
	qlen atomic.Int32
	// service-time
	rt       uint32
	inflight atomic.Int32 // atomic_t in_flight_size: bytes, wraps as int

	// historical-service-time: guarded by mu (the kernel's pi->lock)
	mu          sync.Mutex
	hst         uint64 // fixed point, 10 fractional bits, ns
	outstanding uint64
	staleAfter  uint64
	lastFinish  uint64
}

// link is an intrusive doubly linked list node (the kernel's list_head).
type link struct {
	prev, next *link
	pi         *pathInfo
}

// pathList is the locked valid/failed list pair every selector keeps.
type pathList struct {
	mu     sync.Mutex // the selector's spinlock
	valid  link       // sentinel
	failed link       // sentinel
}

func (l *pathList) init() {
	l.valid.prev, l.valid.next = &l.valid, &l.valid
	l.failed.prev, l.failed.next = &l.failed, &l.failed
}

func (n *link) unlink() {
	n.prev.next = n.next
	n.next.prev = n.prev
}

// addTail is list_add_tail(n, head).
func addTail(head, n *link) {
	n.prev, n.next = head.prev, head
	head.prev.next = n
	head.prev = n
}

// addHead is list_add(n, head).
func addHead(head, n *link) {
	n.prev, n.next = head, head.next
	head.next.prev = n
	head.next = n
}

func moveTail(head, n *link) { n.unlink(); addTail(head, n) }
func moveHead(head, n *link) { n.unlink(); addHead(head, n) }

// info returns p's state if p was added to this selector.
func (l *pathList) info(p *Path) *pathInfo {
	if p == nil || p.pi == nil || p.pi.owner != l {
		return nil
	}
	return p.pi
}

// add binds p to this selector with state pi and puts it at the valid tail.
func (l *pathList) add(p *Path, pi *pathInfo) error {
	if p == nil {
		return fmt.Errorf("selectors: nil path")
	}
	if p.pi != nil {
		return fmt.Errorf("selectors: path already added to a selector")
	}
	pi.link.pi = pi
	pi.path = p
	pi.owner = l
	pi.valid = true
	l.mu.Lock()
	p.pi = pi
	addTail(&l.valid, &pi.link)
	l.mu.Unlock()
	return nil
}

// fail moves p to the head of the failed list (list_move), if it is valid.
func (l *pathList) fail(p *Path) bool {
	pi := l.info(p)
	if pi == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !pi.valid {
		return false
	}
	pi.valid = false
	moveHead(&l.failed, &pi.link)
	return true
}

// reinstate moves a failed p back to the valid list, at its head
// (round-robin's list_move) or tail (the others' list_move_tail).
func (l *pathList) reinstate(p *Path, head bool) (bool, error) {
	pi := l.info(p)
	if pi == nil {
		return false, fmt.Errorf("selectors: path not in this selector")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if pi.valid {
		return false, nil
	}
	pi.valid = true
	if head {
		moveHead(&l.valid, &pi.link)
	} else {
		moveTail(&l.valid, &pi.link)
	}
	return true, nil
}
