package stack

import (
	"context"
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/selectors"
	"github.com/dmfuse/dmfuse/stack/dmarg"
	"golang.org/x/sys/unix"
)

// Multipath is the multipath target type (dm-mpath 1.15.0): priority groups of
// paths to one storage, a path selector per group, failover on path errors and
// queueing while no path is left (spec §2.8). It must be alone in its table and
// can only be replaced by another multipath table (or an error table).
var Multipath = &TargetType{Name: "multipath", Version: [3]int{1, 15, 0}, Singleton: true, Immutable: true, New: newMultipath}

// ErrPushBack is the error of an I/O that multipath pushes back to the device
// (dm's DM_MAPIO_REQUEUE and DM_ENDIO_REQUEUE): it found no usable path while
// the device is being suspended with noflush and queue_if_no_path is off (as
// presuspend turns it off). During a noflush suspend the device holds such
// an I/O at its gate and issues it again after resume; otherwise it fails
// with EIO, which ErrPushBack wraps (as the kernel turns a push-back into EIO
// outside a noflush suspend).
var ErrPushBack error = pushBackError{}

type pushBackError struct{}

func (pushBackError) Error() string { return "multipath: no usable path: I/O pushed back" }
func (pushBackError) Unwrap() error { return syscall.EIO }

// mpMaxArgs is the kernel's limit on every count in a multipath table.
const mpMaxArgs = 1024

// multipath is one constructed multipath target (dm-mpath's struct multipath).
type multipath struct {
	clock  selectors.Clock
	event  func()
	logger *log.Logger

	// Set by the constructor, constant afterwards.
	bio            bool // queue_mode bio
	retainHW       bool
	pgInitRetries  uint32
	pgInitDelay    uint32
	pgInitDelaySet bool
	hwName         string // stored and printed; there are no handlers to run
	hwArgs         []string
	pgs            []*priorityGroup
	devs           []BlockDevice

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
		pgInitCount   uint32
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
	dev       BlockDevice
	sp        selectors.Path // sp.Dev is the *pgpath
	active    bool
	failCount uint32
}

var (
	_ Target        = (*multipath)(nil)
	_ Flusher       = (*multipath)(nil)
	_ Discarder     = (*multipath)(nil)
	_ ZeroWriter    = (*multipath)(nil)
	_ Messager      = (*multipath)(nil)
	_ Presuspender  = (*multipath)(nil)
	_ Postsuspender = (*multipath)(nil)
	_ Resumer       = (*multipath)(nil)
	_ MapAccounter  = (*multipath)(nil)
	_ DeviceLister  = (*multipath)(nil)
)

// mpErr is a constructor or message error: the kernel's text (ti->error, or
// its warning for messages), then which argument and why.
func mpErr(kernel, format string, a ...any) error {
	return &ArgError{Reason: kernel + " (" + fmt.Sprintf(format, a...) + ")"}
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
// sets retain_attached_hw_handler and ignores a hardware handler). A
// hardware handler is stored and printed only (there are none to run: a
// group switch counts as one instantly successful pg_init). Counts are
// 0..1024; each group has 1..1024 paths. Selectors are those of package
// selectors (round-robin, queue-length, service-time,
// historical-service-time). A path is any device argument (interface.md §4)
// and must cover the whole target.
//
// TABLE: "<#feat> <features> <0|1 hwname> <#groups> <pgnum> {<selector>
// <group status> <#paths> <table_args> {<dev> <path status>}...}..."; INFO:
// "2 <queue_io> <pg_init_count> 0 <#groups> <pgnum> {<A|D|E> <group status>
// <#paths> <info_args> {<dev> <A|F> <fail_count> <path status>}...}...";
// every field is followed by one space, as in the kernel.
//
// Messages (case-insensitive, EBUSY while suspended): queue_if_no_path,
// fail_if_no_path, disable_group <n>, enable_group <n>, switch_group <n>,
// fail_path <dev>, reinstate_path <dev>. <dev> is any form of a device
// argument that resolves to the path's device.
func newMultipath(c *Ctor, args []string) (Target, error) {
	m := &multipath{clock: selectors.SystemClock, event: c.Event, logger: log.Default()}
	if c.Clock != nil {
		m.clock = c.Clock
	}
	if m.event == nil {
		m.event = func() {}
	}
	m.mu.wake = make(chan struct{})
	as := NewArgs(args)
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
	nPG, err := as.Uint(0, mpMaxArgs, "invalid number of priority groups")
	if err != nil {
		return nil, mpErr("invalid number of priority groups", "#priority_groups %s: 0..1024", w)
	}
	w = peek(as)
	initial, err := as.Uint(0, mpMaxArgs, "invalid initial priority group number")
	if err != nil {
		return nil, mpErr("invalid initial priority group number", "initial_pg %s: 0..1024", w)
	}
	if (nPG == 0) != (initial == 0) {
		return nil, mpErr("invalid initial priority group", "initial_pg %d with %d groups: 0 exactly when there are no groups", initial, nPG)
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
		return nil, mpErr("priority group count mismatch", "#priority_groups is %d, the table has %d", nPG, len(m.pgs))
	}
	m.queueIO.Store(true)
	return m, nil
}

// peek quotes the next argument of as, or says it is missing.
func peek(as *Args) string {
	if as.Len() == 0 {
		return "missing"
	}
	return strconv.Quote(as.Rest()[0])
}

// parseFeatures reads "<#features> [<feature>...]" (parse_features).
func (m *multipath) parseFeatures(as *Args) error {
	w := peek(as)
	n, err := as.Group(0, 8, "invalid number of feature args")
	if err != nil {
		return mpErr("invalid number of feature args", "#features %s: 0..8 and no more than the args after it", w)
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
				return mpErr("pg_init_retries must be between 1 and 50", "pg_init_retries %s", w)
			}
			m.pgInitRetries = v
			n--
		case strings.EqualFold(name, "pg_init_delay_msecs") && n >= 1:
			w := peek(as)
			v, err := as.Uint(0, 60000, "pg_init_delay_msecs must be between 0 and 60000")
			if err != nil {
				return mpErr("pg_init_delay_msecs must be between 0 and 60000", "pg_init_delay_msecs %s", w)
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
				return mpErr("Unknown 'queue_mode' requested", "queue_mode %q: bio, rq or mq", mode)
			}
		default:
			return mpErr("Unrecognised multipath feature request", "feature %q", name)
		}
	}
	return nil
}

// parseHWHandler reads "<#hw_handler_args> [<name> [<arg>...]]"
// (parse_hw_handler). Bio mode consumes and ignores the handler.
func (m *multipath) parseHWHandler(as *Args) error {
	w := peek(as)
	n, err := as.Group(0, mpMaxArgs, "invalid number of hardware handler args")
	if err != nil {
		return mpErr("invalid number of hardware handler args", "#hw_handler_args %s: 0..1024 and no more than the args after it", w)
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
func (m *multipath) parsePG(c *Ctor, as *Args, num int) (*priorityGroup, error) {
	if as.Len() < 2 {
		return nil, mpErr("not enough priority group arguments", "group %d: %d args left, a group needs at least a selector and its arg count", num, as.Len())
	}
	pg := &priorityGroup{num: num}
	name, _ := as.Next()
	typ, ok := selectors.Lookup(name)
	if !ok {
		return nil, mpErr("unknown path selector type", "group %d: selector %q", num, name)
	}
	w := peek(as)
	nsel, err := as.Group(0, mpMaxArgs, "invalid number of path selector args")
	if err != nil {
		return nil, mpErr("invalid number of path selector args", "group %d: #selector_args %s: 0..1024 and no more than the args after it", num, w)
	}
	selArgs := append([]string(nil), as.Rest()[:nsel]...)
	sel, err := typ.New(selArgs, m.clock)
	if err != nil {
		return nil, mpErr(selectors.KernelCtrFailed, "group %d: %v", num, err)
	}
	as.Skip(int(nsel))
	pg.typ, pg.sel = typ, sel
	pg.tracker, _ = sel.(selectors.IOTracker)
	w = peek(as)
	npaths, err := as.Uint(1, mpMaxArgs, "invalid number of paths")
	if err != nil {
		return nil, mpErr("invalid number of paths", "group %d: #paths %s: 1..1024", num, w)
	}
	w = peek(as)
	nargs, err := as.Uint(0, mpMaxArgs, "invalid number of selector args")
	if err != nil {
		return nil, mpErr("invalid number of selector args", "group %d: #per_path_args %s: 0..1024", num, w)
	}
	for i := 0; i < int(npaths); i++ {
		if as.Len() < 1+int(nargs) {
			return nil, mpErr("not enough path parameters", "group %d, path %d: needs a device and %d args, %d left", num, i+1, nargs, as.Len())
		}
		devArg, _ := as.Next()
		dev, err := c.Open(devArg)
		if err != nil {
			return nil, mpErr("error getting device", "group %d, path %q: %v", num, devArg, err)
		}
		if err := CheckArea(dev, 0, c.Len); err != nil {
			return nil, err
		}
		pp := &pgpath{pg: pg, dev: dev, active: true}
		pp.sp.Dev = pp
		if err := sel.AddPath(&pp.sp, as.Rest()[:nargs]); err != nil {
			var se *selectors.ArgError
			if errors.As(err, &se) {
				return nil, mpErr(se.Kernel, "group %d, path %s: %v", num, dev.Name(), err)
			}
			return nil, mpErr("error adding path", "group %d, path %s: %v", num, dev.Name(), err)
		}
		as.Skip(int(nargs))
		pg.paths = append(pg.paths, pp)
		m.devs = append(m.devs, dev)
	}
	return pg, nil
}

// AccountsAtMap implements MapAccounter: I/O failed for lack of a path is
// killed at map time and not counted.
func (m *multipath) AccountsAtMap() {}

// Devices implements DeviceLister.
func (m *multipath) Devices() []BlockDevice { return m.devs }

// Close implements Target: any I/O still held fails with EIO.
func (m *multipath) Close() error {
	m.mu.Lock()
	m.mu.closed = true
	m.mu.queueIfNoPath, m.mu.savedQueue = false, false
	m.releaseLocked()
	m.mu.Unlock()
	return nil
}

// releaseLocked re-drives every held I/O; the caller holds mu.
func (m *multipath) releaseLocked() {
	if m.mu.held > 0 {
		close(m.mu.wake)
		m.mu.wake = make(chan struct{})
	}
}

// chooseIn asks pg's selector for a path (choose_path_in_pg) and makes pg
// the current group if it is not.
func (m *multipath) chooseIn(pg *priorityGroup, n int) *pgpath {
	sp := pg.sel.SelectPath(n)
	if sp == nil {
		return nil
	}
	pp := sp.Dev.(*pgpath)
	if m.currentPG.Load() != pg {
		m.mu.Lock()
		m.switchPGLocked(pg)
		m.mu.Unlock()
	}
	return pp
}

// switchPGLocked is __switch_pg. Without handlers to activate, the group is
// ready at once: queue_io is cleared, and with a hardware handler the
// activation counts as one pg_init.
func (m *multipath) switchPGLocked(pg *priorityGroup) {
	m.currentPG.Store(pg)
	m.mu.pgInitCount = 0
	if m.hwName != "" {
		m.mu.pgInitCount = 1
	}
	m.queueIO.Store(false)
}

// choose picks a path for an I/O of n bytes (choose_pgpath): the group asked
// for by switch_group or the table, else the current group while it has a
// usable path, else the first group that yields one, bypassed groups last.
func (m *multipath) choose(n int) *pgpath {
	if m.nrValid.Load() > 0 {
		if m.nextPG.Load() != nil {
			m.mu.Lock()
			pg := m.nextPG.Swap(nil)
			m.mu.Unlock()
			if pg != nil {
				if pp := m.chooseIn(pg, n); pp != nil {
					return pp
				}
			}
		}
		if pg := m.currentPG.Load(); pg != nil {
			if pp := m.chooseIn(pg, n); pp != nil {
				return pp
			}
		}
		for _, bypassed := range [2]bool{false, true} {
			for _, pg := range m.pgs {
				if pg.bypassed.Load() != bypassed {
					continue
				}
				if pp := m.chooseIn(pg, n); pp != nil {
					return pp
				}
			}
		}
	}
	m.mu.Lock()
	if m.nrValid.Load() == 0 {
		m.queueIO.Store(false)
	}
	m.currentPG.Store(nil)
	m.mu.Unlock()
	return nil
}

// mapIO maps an I/O of n bytes to a path (__map_bio). With no path it holds
// the I/O, without any lock, while queue_if_no_path is set; otherwise it
// fails it: ErrPushBack while noflush-suspending, else EIO.
func (m *multipath) mapIO(ctx context.Context, n int) (*pgpath, error) {
	for {
		if pp := m.choose(n); pp != nil {
			return pp, nil
		}
		m.mu.Lock()
		if m.nrValid.Load() > 0 {
			// A path came back since choose looked.
			m.mu.Unlock()
			runtime.Gosched()
			continue
		}
		if !m.mu.queueIfNoPath {
			pushBack := m.mu.noflush
			m.mu.Unlock()
			if pushBack {
				return nil, ErrPushBack
			}
			return nil, syscall.EIO
		}
		wake := m.mu.wake
		m.mu.held++
		m.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
		}
		m.mu.Lock()
		m.mu.held--
		m.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// isPathError is blk_path_error: every error is a path error except
// not-supported, no-space, target, reservation-conflict, medium and
// protection errors. A cancelled request is not a path error either.
func isPathError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		switch e {
		case syscall.EOPNOTSUPP, syscall.ENOSPC, syscall.EREMOTEIO, syscall.EBADE, syscall.ENODATA, syscall.EILSEQ:
			return false
		}
	}
	return true
}

// mpOp is the kind of one I/O.
type mpOp uint8

const (
	mpRead mpOp = iota
	mpWrite
	mpFlush
	mpDiscard
	mpZeroes
)

// io maps one I/O to a path and passes it on. A path error fails the path
// (a table event) and retries the I/O on another path; with no path left it
// waits while queue_if_no_path is set and otherwise fails (multipath_map_bio
// and multipath_end_io_bio). n is the I/O's size in bytes.
func (m *multipath) io(ctx context.Context, op mpOp, p []byte, off, n int64) (int, error) {
	for {
		pp, err := m.mapIO(ctx, int(n))
		if err != nil {
			return 0, err
		}
		StartAccounting(ctx)
		var start int64
		tr := pp.pg.tracker
		if tr != nil {
			if pp.pg.typ.HRTimer {
				start = m.clock.Nanotime()
			}
			tr.StartIO(&pp.sp, int(n))
		}
		var got int
		switch op {
		case mpRead:
			got, err = pp.dev.ReadAt(ctx, p, off)
		case mpWrite:
			got, err = pp.dev.WriteAt(ctx, p, off)
		case mpFlush:
			err = pp.dev.Flush(ctx)
		case mpDiscard:
			err = pp.dev.Discard(ctx, off, n)
		case mpZeroes:
			err = pp.dev.WriteZeroes(ctx, off, n)
		}
		if err == nil || !isPathError(err) {
			if tr != nil {
				tr.EndIO(&pp.sp, int(n), start)
			}
			return got, err
		}
		m.failPath(pp, err)
		if tr != nil {
			tr.EndIO(&pp.sp, int(n), start)
		}
		if m.nrValid.Load() == 0 {
			m.mu.Lock()
			queue, pushBack := m.mu.queueIfNoPath, m.mu.noflush
			m.mu.Unlock()
			if !queue {
				if pushBack {
					return 0, ErrPushBack
				}
				return 0, syscall.EIO
			}
		}
	}
}

// ReadAt implements Target.
func (m *multipath) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return m.io(ctx, mpRead, p, off, int64(len(p)))
}

// WriteAt implements Target.
func (m *multipath) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return m.io(ctx, mpWrite, p, off, int64(len(p)))
}

// Flush implements Flusher. As in dm (num_flush_bios = 1), one empty flush
// is mapped like any I/O: to the path the selector picks, failing over like
// a write. All paths lead to the same storage, so a flush through one of
// them reaches it; sending one down every path would cost a flush per path
// and fail when any single path fails, which multipath exists to hide.
func (m *multipath) Flush(ctx context.Context) error {
	_, err := m.io(ctx, mpFlush, nil, 0, 0)
	return err
}

// Discard implements Discarder: mapped to one path, like a write.
func (m *multipath) Discard(ctx context.Context, off, n int64) error {
	_, err := m.io(ctx, mpDiscard, nil, off, n)
	return err
}

// WriteZeroes implements ZeroWriter: mapped to one path, like a write.
func (m *multipath) WriteZeroes(ctx context.Context, off, n int64) error {
	_, err := m.io(ctx, mpZeroes, nil, off, n)
	return err
}

// failPath is fail_path: the path becomes F, its fail count goes up, its
// selector stops choosing it, and a table event is raised. Failing a failed
// path does nothing.
func (m *multipath) failPath(pp *pgpath, cause error) {
	m.mu.Lock()
	if !pp.active {
		m.mu.Unlock()
		return
	}
	pp.pg.sel.FailPath(&pp.sp)
	pp.active = false
	pp.failCount++
	left := m.nrValid.Add(-1)
	m.mu.Unlock()
	if cause != nil {
		m.logger.Printf("multipath: Failing path %s (%v); %d valid paths left.", pp.dev.Name(), cause, left)
	} else {
		m.logger.Printf("multipath: Failing path %s; %d valid paths left.", pp.dev.Name(), left)
	}
	m.event()
}

// reinstatePath is reinstate_path: the path becomes A again and its selector
// may choose it; if it is the only valid path, held I/O is re-driven.
// Reinstating an active path does nothing.
func (m *multipath) reinstatePath(pp *pgpath) error {
	m.mu.Lock()
	if pp.active {
		m.mu.Unlock()
		return nil
	}
	if err := pp.pg.sel.ReinstatePath(&pp.sp); err != nil {
		m.mu.Unlock()
		return &ArgError{Reason: "reinstating path " + pp.dev.Name() + ": " + err.Error()}
	}
	pp.active = true
	if m.nrValid.Add(1) == 1 {
		m.releaseLocked()
	}
	m.mu.Unlock()
	m.logger.Printf("multipath: Reinstating path %s.", pp.dev.Name())
	m.event()
	return nil
}

// setQueueIfNoPathLocked is queue_if_no_path(): set or clear the flag,
// optionally saving the old value for resume; clearing it re-drives held
// I/O. The caller holds mu.
func (m *multipath) setQueueIfNoPathLocked(queue, save bool) {
	if save {
		if !m.mu.queueIfNoPath && m.mu.savedQueue {
			m.logger.Printf("multipath: queue_if_no_path disabled but saved as enabled, saving again loses state, not saving!")
		} else {
			m.mu.savedQueue = m.mu.queueIfNoPath
		}
	} else if !queue {
		m.mu.savedQueue = false
	}
	m.mu.queueIfNoPath = queue && !m.mu.closed
	if !queue {
		m.releaseLocked()
	}
}

// Presuspend implements Presuspender. dmfuse multipath is bio-based, so, as
// dm does in bio mode, queue_if_no_path is turned off (and saved) for every
// suspend: held I/O is re-driven and, with no path, fails, or with noflush
// is pushed back (ErrPushBack).
func (m *multipath) Presuspend(noflush bool) {
	m.mu.Lock()
	m.mu.noflush = noflush
	m.setQueueIfNoPathLocked(false, true)
	m.mu.Unlock()
}

// Postsuspend implements Postsuspender: the device is suspended, and
// messages fail with EBUSY until resume.
func (m *multipath) Postsuspend() {
	m.mu.Lock()
	m.mu.noflush = false
	m.mu.suspended = true
	m.mu.Unlock()
}

// Resume implements Resumer: the saved queue_if_no_path comes back.
func (m *multipath) Resume() {
	m.mu.Lock()
	if m.mu.savedQueue {
		m.mu.queueIfNoPath = !m.mu.closed
		m.mu.savedQueue = false
	}
	m.mu.noflush = false
	m.mu.suspended = false
	m.mu.Unlock()
}

// Status implements Target (multipath_status).
func (m *multipath) Status(t StatusType) string {
	st := selectors.StatusInfo
	if t == StatusTable {
		st = selectors.StatusTable
	}
	var b strings.Builder
	m.mu.Lock()
	defer m.mu.Unlock()
	if t == StatusInfo {
		fmt.Fprintf(&b, "2 %d %d ", b2u(m.queueIO.Load()), m.mu.pgInitCount)
	} else {
		q := m.mu.queueIfNoPath
		nfeat := b2u(q) + 2*b2u(m.pgInitRetries > 0) + 2*b2u(m.pgInitDelaySet) + b2u(m.retainHW) + 2*b2u(m.bio)
		fmt.Fprintf(&b, "%d ", nfeat)
		if q {
			b.WriteString("queue_if_no_path ")
		}
		if m.pgInitRetries > 0 {
			fmt.Fprintf(&b, "pg_init_retries %d ", m.pgInitRetries)
		}
		if m.pgInitDelaySet {
			fmt.Fprintf(&b, "pg_init_delay_msecs %d ", m.pgInitDelay)
		}
		if m.retainHW {
			b.WriteString("retain_attached_hw_handler ")
		}
		if m.bio {
			b.WriteString("queue_mode bio ")
		}
	}
	if m.hwName == "" || t == StatusInfo {
		b.WriteString("0 ")
	} else {
		fmt.Fprintf(&b, "1 %s ", m.hwName)
	}
	cur, next := m.currentPG.Load(), m.nextPG.Load()
	pgnum := 0
	switch {
	case cur != nil:
		pgnum = cur.num
	case next != nil:
		pgnum = next.num
	case len(m.pgs) > 0:
		pgnum = 1
	}
	fmt.Fprintf(&b, "%d %d ", len(m.pgs), pgnum)
	for _, pg := range m.pgs {
		if t == StatusInfo {
			state := "E "
			switch {
			case pg.bypassed.Load():
				state = "D "
			case pg == cur:
				state = "A "
			}
			b.WriteString(state)
			b.WriteString(pg.sel.Status(nil, st))
			fmt.Fprintf(&b, "%d %d ", len(pg.paths), pg.typ.InfoArgs)
			for _, pp := range pg.paths {
				state := "F"
				if pp.active {
					state = "A"
				}
				fmt.Fprintf(&b, "%s %s %d ", pp.dev.Name(), state, pp.failCount)
				b.WriteString(pg.sel.Status(&pp.sp, st))
			}
			continue
		}
		b.WriteString(pg.typ.Name)
		b.WriteByte(' ')
		b.WriteString(pg.sel.Status(nil, st))
		fmt.Fprintf(&b, "%d %d ", len(pg.paths), pg.typ.TableArgs)
		for _, pp := range pg.paths {
			b.WriteString(pp.dev.Name())
			b.WriteByte(' ')
			b.WriteString(pg.sel.Status(&pp.sp, st))
		}
	}
	return b.String()
}

func b2u(v bool) int {
	if v {
		return 1
	}
	return 0
}

// Message implements Messager (multipath_message).
func (m *multipath) Message(_ context.Context, args []string) (string, error) {
	m.mu.Lock()
	suspended := m.mu.suspended
	m.mu.Unlock()
	if suspended {
		return "", &ArgError{Reason: "multipath messages are refused while the device is suspended", Errno: syscall.EBUSY}
	}
	if len(args) == 1 {
		switch {
		case strings.EqualFold(args[0], "queue_if_no_path"):
			m.mu.Lock()
			m.setQueueIfNoPathLocked(true, false)
			m.mu.Unlock()
			return "", nil
		case strings.EqualFold(args[0], "fail_if_no_path"):
			m.mu.Lock()
			m.setQueueIfNoPathLocked(false, false)
			m.mu.Unlock()
			return "", nil
		}
	}
	if len(args) != 2 {
		return "", Errorf("Invalid multipath message arguments. Expected 2 arguments, got %d.", len(args))
	}
	verb, arg := args[0], args[1]
	switch {
	case strings.EqualFold(verb, "disable_group"), strings.EqualFold(verb, "enable_group"):
		pg, err := m.groupArg(verb, arg)
		if err != nil {
			return "", err
		}
		m.mu.Lock()
		pg.bypassed.Store(strings.EqualFold(verb, "disable_group"))
		m.currentPG.Store(nil)
		m.releaseLocked()
		m.mu.Unlock()
		m.event()
		return "", nil
	case strings.EqualFold(verb, "switch_group"):
		pg, err := m.groupArg(verb, arg)
		if err != nil {
			return "", err
		}
		m.mu.Lock()
		for _, g := range m.pgs {
			g.bypassed.Store(false)
		}
		m.currentPG.Store(nil)
		m.nextPG.Store(pg)
		m.releaseLocked()
		m.mu.Unlock()
		m.event()
		return "", nil
	case strings.EqualFold(verb, "fail_path"), strings.EqualFold(verb, "reinstate_path"):
		key, err := resolveMessageDev(arg)
		if err != nil {
			return "", err
		}
		found := false
		for _, pg := range m.pgs {
			for _, pp := range pg.paths {
				if !key.matches(pp.dev) {
					continue
				}
				found = true
				if strings.EqualFold(verb, "fail_path") {
					m.failPath(pp, nil)
				} else if err := m.reinstatePath(pp); err != nil {
					return "", err
				}
			}
		}
		if !found {
			return "", Errorf("%s %s: no path of this multipath is on that device", strings.ToLower(verb), arg)
		}
		return "", nil
	}
	return "", Errorf("Unrecognised multipath message received: %s", verb)
}

// groupArg reads a 1-based group number (switch_pg_num, bypass_pg_num).
func (m *multipath) groupArg(verb, arg string) (*priorityGroup, error) {
	n, ok := dmarg.Uint32(arg) // sscanf "%u%c"
	if !ok || n == 0 || int(n) > len(m.pgs) {
		return nil, Errorf("invalid PG number supplied to %s: %q: 1..%d", strings.ToLower(verb), arg, len(m.pgs))
	}
	return m.pgs[n-1], nil
}

// devKey identifies the device a message names, resolved by the rules of
// device arguments (interface.md §4) without opening it.
type devKey struct {
	arg    string
	mapped string // a mapped device name
	minor  int64  // 253:N; -1 if not given so
	rdev   uint64 // a block device's number; 0 if none
	dev    uint64 // st_dev and st_ino of a file or block device node
	ino    uint64
	stated bool
	abs    string // the path made absolute
}

// resolveMessageDev resolves the device argument of fail_path or
// reinstate_path. A relative path is made absolute against the daemon's
// working directory.
func resolveMessageDev(arg string) (devKey, error) {
	k := devKey{arg: arg, minor: -1}
	if mm := majMin.FindStringSubmatch(arg); mm != nil {
		maj, err1 := strconv.ParseUint(mm[1], 10, 32)
		min, err2 := strconv.ParseUint(mm[2], 10, 32)
		if err1 != nil || err2 != nil {
			return k, Errorf("message: error getting device %s: bad MAJOR:MINOR", arg)
		}
		if maj == Major {
			k.minor = int64(min)
		} else {
			k.rdev = unix.Mkdev(uint32(maj), uint32(min))
		}
		return k, nil
	}
	if !strings.Contains(arg, "/") {
		k.mapped = arg
		return k, nil
	}
	p, err := filepath.Abs(arg)
	if err != nil {
		return k, Errorf("message: error getting device %s: %v", arg, err)
	}
	k.abs = p
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return k, Errorf("message: error getting device %s: %v", arg, err)
	}
	k.stated, k.dev, k.ino = true, st.Dev, st.Ino
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		k.rdev = st.Rdev
	}
	return k, nil
}

// matches reports whether the path device d is the device k names.
func (k devKey) matches(d BlockDevice) bool {
	switch d := d.(type) {
	case *mappedRef:
		return k.mapped != "" && d.Name() == k.mapped || k.minor >= 0 && int64(d.Minor()) == k.minor
	case *fileDev:
		var st unix.Stat_t
		if err := unix.Fstat(d.fd, &st); err != nil {
			return d.name == k.arg || d.name == k.abs
		}
		if k.rdev != 0 && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == k.rdev {
			return true
		}
		return k.stated && st.Dev == k.dev && st.Ino == k.ino
	}
	return d.Name() == k.arg || k.abs != "" && d.Name() == k.abs
}

// heldIOs returns the number of I/Os waiting for a path (for tests).
func (m *multipath) heldIOs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.held
}
