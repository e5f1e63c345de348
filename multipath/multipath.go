package multipath

import (
	"errors"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/selectors"
	"github.com/dmfuse/dmfuse/stack"
)

// Type is the multipath target type (dm-mpath 1.15.0): priority groups of
// paths to one storage, a path selector per group, failover on path errors and
// queueing while no path is left (drivers/md/dm-mpath.c). It must be alone in
// its table and can only be replaced by another multipath table (or an error
// table).
var Type = &stack.TargetType{Name: "multipath", Version: [3]int{1, 15, 0}, Singleton: true, Immutable: true, New: newMultipath}

// maxArgs is the kernel's limit on every count in a multipath table.
const maxArgs = 1024

// multipath is one constructed multipath target (dm-mpath's struct multipath).
type multipath struct {
	clock  clock.Clock
	event  func()
	logger *log.Logger

	// Set by the constructor, constant afterwards.
	bio            bool // queue_mode bio
	retainHW       bool
	pgInitRetries  uint32
	pgInitDelay    uint32
	pgInitDelaySet bool
	hwName         string // printed while the table has no path (see parsePG)
	hwArgs         []string
	pgs            []*priorityGroup

	// Read without the lock on the I/O path, written under mu (the
	// kernel's READ_ONCE/atomic_t fields of struct multipath).
	nrValid   atomic.Int32
	currentPG atomic.Pointer[priorityGroup]
	nextPG    atomic.Pointer[priorityGroup]
	queueIO   atomic.Bool

	// mu is the kernel's m->lock: taken where dm-mpath takes its spinlock
	// (group switches, path state changes, queueing decisions, flags), never
	// across I/O.
	mu struct {
		sync.Mutex
		queueIfNoPath bool
		savedQueue    bool // MPATHF_SAVED_QUEUE_IF_NO_PATH
		noflush       bool // between a noflush presuspend and postsuspend
		suspended     bool // between postsuspend and resume: messages get EBUSY
		closed        bool
		held          int           // I/Os waiting for a path
		wake          chan struct{} // closed to re-drive held I/O
	}
}

// priorityGroup is one priority group (struct priority_group).
type priorityGroup struct {
	num      int // 1-based
	typ      *selectors.Type
	sel      selectors.Selector
	tracker  selectors.IOTracker // nil for round-robin
	paths    []*pgpath
	bypassed atomic.Bool // written under mu
}

// pgpath is one path (struct pgpath). active and failCount are guarded by
// the target's mu.
type pgpath struct {
	pg        *priorityGroup
	dev       stack.BlockDevice
	sp        selectors.Path // sp.Dev is the *pgpath
	active    bool
	failCount uint32
}

var (
	_ stack.Target        = (*multipath)(nil)
	_ stack.Flusher       = (*multipath)(nil)
	_ stack.Discarder     = (*multipath)(nil)
	_ stack.ZeroWriter    = (*multipath)(nil)
	_ stack.Messager      = (*multipath)(nil)
	_ stack.Presuspender  = (*multipath)(nil)
	_ stack.Postsuspender = (*multipath)(nil)
	_ stack.Resumer       = (*multipath)(nil)
	_ stack.MapAccounter  = (*multipath)(nil)
)

// kernelError is a constructor or message error: the kernel's text
// (ti->error, or its warning for messages), then which argument and why.
func kernelError(kernel, format string, a ...any) error {
	return &stack.ArgError{Reason: kernel + " (" + fmt.Sprintf(format, a...) + ")"}
}

// newMultipath constructs a multipath target. Table syntax:
//
//	<#features> [<feature>...]
//	<#hw_handler_args> [<hw_handler_name> [<hw_arg>...]]
//	<#priority_groups> <initial_pg>
//	{ <selector_name> <#selector_args> [<selector_arg>...]
//	  <#paths> <#per_path_args> { <path_dev> <per_path_arg>... }... }...
//
// Features (case-insensitive; at most 8 words): queue_if_no_path,
// retain_attached_hw_handler, pg_init_retries <1..50>, pg_init_delay_msecs
// <0..60000>, queue_mode <bio|rq|mq>. dmfuse is bio-based whatever queue_mode
// says; the table prints what the kernel prints for the mode given (bio mode
// sets retain_attached_hw_handler and ignores a hardware handler). A hardware
// handler needs a SCSI path, and dmfuse paths are files and mapped devices: as
// the kernel does for a path that is not SCSI, the first path drops the handler
// with a logged "hardware handlers are only allowed for scsi devices", so table
// prints "0" for it (a table without paths keeps it) and no pg_init ever runs
// (pg_init_count stays 0). Counts are 0..1024; each group has 1..1024 paths.
// Selectors are those of package selectors (round-robin, queue-length,
// service-time, historical-service-time). A path is any device argument (a
// mapped device's name, 253:N, MAJOR:MINOR or a path) and must cover the whole
// target.
//
// TABLE: "<#feat> <features> <0|1 hwname> <#groups> <pgnum> {<selector>
// <group status> <#paths> <table_args> {<dev> <path status>}...}..."; INFO:
// "2 <queue_io> <pg_init_count> 0 <#groups> <pgnum> {<A|D|E> <group status>
// <#paths> <info_args> {<dev> <A|F> <fail_count> <path status>}...}...";
// every field is followed by one space, as in the kernel. Paths and the
// handler name print escaped (EscapeArg), so that a table over files with
// white space or backslashes in their names loads again.
//
// Messages (case-insensitive, EBUSY while suspended): queue_if_no_path,
// fail_if_no_path, disable_group <n>, enable_group <n>, switch_group <n>,
// fail_path <dev>, reinstate_path <dev>. <dev> is any form of a device
// argument that resolves to the path's device, or the escaped form that table
// and status print.
func newMultipath(c *stack.Ctor, args []string) (stack.Target, error) {
	m := &multipath{clock: clock.System, event: c.Event, logger: log.Default()}
	if c.Clock != nil {
		m.clock = c.Clock
	}
	if m.event == nil {
		m.event = func() {}
	}
	m.mu.wake = make(chan struct{})
	as := stack.NewArgs(args)
	if err := m.parseFeatures(as); err != nil {
		return nil, err
	}
	if m.bio {
		m.retainHW = true
	}
	if err := m.parseHWHandler(as); err != nil {
		return nil, err
	}
	w := peek(as)
	nPG, err := as.Uint(0, maxArgs, "invalid number of priority groups")
	if err != nil {
		return nil, kernelError("invalid number of priority groups", "#priority_groups %s: 0..1024", w)
	}
	w = peek(as)
	initial, err := as.Uint(0, maxArgs, "invalid initial priority group number")
	if err != nil {
		return nil, kernelError("invalid initial priority group number", "initial_pg %s: 0..1024", w)
	}
	if (nPG == 0) != (initial == 0) {
		return nil, kernelError("invalid initial priority group", "initial_pg %d with %d groups: 0 exactly when there are no groups", initial, nPG)
	}
	next := initial
	for as.Len() > 0 {
		pg, err := m.parsePG(c, as, len(m.pgs)+1)
		if err != nil {
			return nil, err
		}
		m.pgs = append(m.pgs, pg)
		m.nrValid.Add(int32(len(pg.paths)))
		if next--; next == 0 {
			m.nextPG.Store(pg)
		}
	}
	if len(m.pgs) != int(nPG) {
		return nil, kernelError("priority group count mismatch", "#priority_groups is %d, the table has %d", nPG, len(m.pgs))
	}
	m.queueIO.Store(true)
	return m, nil
}

// peek quotes the next argument of as, or says it is missing.
func peek(as *stack.Args) string {
	if as.Len() == 0 {
		return "missing"
	}
	return strconv.Quote(as.Rest()[0])
}

// parseFeatures reads "<#features> [<feature>...]" (parse_features).
func (m *multipath) parseFeatures(as *stack.Args) error {
	w := peek(as)
	n, err := as.Group(0, 8, "invalid number of feature args")
	if err != nil {
		return kernelError("invalid number of feature args", "#features %s: 0..8 and no more than the args after it", w)
	}
	for n > 0 {
		name, _ := as.Next()
		n--
		switch {
		case strings.EqualFold(name, "queue_if_no_path"):
			m.mu.queueIfNoPath = true
		case strings.EqualFold(name, "retain_attached_hw_handler"):
			m.retainHW = true
		case strings.EqualFold(name, "pg_init_retries") && n >= 1:
			w := peek(as)
			v, err := as.Uint(1, 50, "pg_init_retries must be between 1 and 50")
			if err != nil {
				return kernelError("pg_init_retries must be between 1 and 50", "pg_init_retries %s", w)
			}
			m.pgInitRetries = v
			n--
		case strings.EqualFold(name, "pg_init_delay_msecs") && n >= 1:
			w := peek(as)
			v, err := as.Uint(0, 60000, "pg_init_delay_msecs must be between 0 and 60000")
			if err != nil {
				return kernelError("pg_init_delay_msecs must be between 0 and 60000", "pg_init_delay_msecs %s", w)
			}
			m.pgInitDelay, m.pgInitDelaySet = v, true
			n--
		case strings.EqualFold(name, "queue_mode") && n >= 1:
			mode, _ := as.Next()
			n--
			switch {
			case strings.EqualFold(mode, "bio"):
				m.bio = true
			case strings.EqualFold(mode, "rq"), strings.EqualFold(mode, "mq"):
				m.bio = false
			default:
				return kernelError("Unknown 'queue_mode' requested", "queue_mode %q: bio, rq or mq", mode)
			}
		default:
			return kernelError("Unrecognised multipath feature request", "feature %q", name)
		}
	}
	return nil
}

// parseHWHandler reads "<#hw_handler_args> [<name> [<arg>...]]"
// (parse_hw_handler). Bio mode consumes and ignores the handler.
func (m *multipath) parseHWHandler(as *stack.Args) error {
	w := peek(as)
	n, err := as.Group(0, maxArgs, "invalid number of hardware handler args")
	if err != nil {
		return kernelError("invalid number of hardware handler args", "#hw_handler_args %s: 0..1024 and no more than the args after it", w)
	}
	if n == 0 {
		return nil
	}
	if m.bio {
		m.logger.Printf("multipath: bio-based multipath doesn't allow hardware handler args")
		as.Skip(int(n))
		return nil
	}
	rest := as.Rest()
	m.hwName = rest[0]
	m.hwArgs = append([]string(nil), rest[1:n]...)
	as.Skip(int(n))
	return nil
}

// parsePG reads one priority group (parse_priority_group).
func (m *multipath) parsePG(c *stack.Ctor, as *stack.Args, num int) (*priorityGroup, error) {
	if as.Len() < 2 {
		return nil, kernelError("not enough priority group arguments", "group %d: %d args left, a group needs at least a selector and its arg count", num, as.Len())
	}
	pg := &priorityGroup{num: num}
	name, _ := as.Next()
	typ, ok := selectors.Lookup(name)
	if !ok {
		return nil, kernelError("unknown path selector type", "group %d: selector %q", num, name)
	}
	w := peek(as)
	nsel, err := as.Group(0, maxArgs, "invalid number of path selector args")
	if err != nil {
		return nil, kernelError("invalid number of path selector args", "group %d: #selector_args %s: 0..1024 and no more than the args after it", num, w)
	}
	selArgs := append([]string(nil), as.Rest()[:nsel]...)
	sel, err := typ.New(selArgs, m.clock)
	if err != nil {
		return nil, kernelError(selectors.KernelCtrFailed, "group %d: %v", num, err)
	}
	as.Skip(int(nsel))
	pg.typ, pg.sel = typ, sel
	pg.tracker, _ = sel.(selectors.IOTracker)
	w = peek(as)
	npaths, err := as.Uint(1, maxArgs, "invalid number of paths")
	if err != nil {
		return nil, kernelError("invalid number of paths", "group %d: #paths %s: 1..1024", num, w)
	}
	w = peek(as)
	nargs, err := as.Uint(0, maxArgs, "invalid number of selector args")
	if err != nil {
		return nil, kernelError("invalid number of selector args", "group %d: #per_path_args %s: 0..1024", num, w)
	}
	for i := 0; i < int(npaths); i++ {
		if as.Len() < 1+int(nargs) {
			return nil, kernelError("not enough path parameters", "group %d, path %d: needs a device and %d args, %d left", num, i+1, nargs, as.Len())
		}
		devArg, _ := as.Next()
		dev, err := c.Open(devArg)
		if err != nil {
			return nil, kernelError("error getting device", "group %d, path %q: %v", num, devArg, err)
		}
		// parse_path: scsi_dh_attached_handler_name says -ENODEV for a
		// path that is not a SCSI device, and a hardware handler given for
		// it is logged and dropped. No dmfuse path is a SCSI device.
		if m.hwName != "" {
			m.logger.Printf("multipath: hardware handlers are only allowed for scsi devices")
			m.hwName, m.hwArgs = "", nil
		}
		if err := stack.CheckArea(dev, 0, c.Len); err != nil {
			return nil, err
		}
		pp := &pgpath{pg: pg, dev: dev, active: true}
		pp.sp.Dev = pp
		if err := sel.AddPath(&pp.sp, as.Rest()[:nargs]); err != nil {
			var se *selectors.ArgError
			if errors.As(err, &se) {
				return nil, kernelError(se.Kernel, "group %d, path %s: %v", num, dev.Name(), err)
			}
			return nil, kernelError("error adding path", "group %d, path %s: %v", num, dev.Name(), err)
		}
		as.Skip(int(nargs))
		pg.paths = append(pg.paths, pp)
	}
	return pg, nil
}

// AccountsAtMap implements MapAccounter: I/O failed for lack of a path is
// killed at map time and not counted.
func (m *multipath) AccountsAtMap() {}

// Close implements Target: any I/O still held fails with EIO.
func (m *multipath) Close() error {
	m.mu.Lock()
	m.mu.closed = true
	m.mu.queueIfNoPath, m.mu.savedQueue = false, false
	m.releaseLocked()
	m.mu.Unlock()
	return nil
}
