package fault

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Op is the kind of an I/O as rules select it.
type Op uint8

const (
	OpRead Op = iota
	OpWrite
	OpFlush
	OpFUA // a write carrying FUA (it is also a write)
	OpDiscard
	OpZeroes
	numOps
)

var opNames = [numOps]string{"read", "write", "flush", "fua", "discard", "zeroes"}

func (o Op) String() string { return opNames[o] }

// opSet is a set of ops; 0 matches every op.
type opSet uint8

func (s opSet) has(o Op, fua bool) bool {
	if s == 0 || s&(1<<o) != 0 {
		return true
	}
	return o == OpWrite && fua && s&(1<<OpFUA) != 0
}

// actKind is what a rule does when it fires.
type actKind uint8

const (
	actCount actKind = iota // nothing but counting and state changes
	actError
	actDrop
	actPhantom
	actMisdirect
	actTear
	actCorrupt
	actStale
	actLatent
	actLie
	actStall
	actDelay
)

// corruption modes.
const (
	corruptByte   = iota // byte at offset set to a value
	corruptRandom        // n random bytes
	corruptBits          // n bit flips
	corruptStuck         // bits stuck per sector, read side
)

// Action is what a rule does, with its parameters.
type Action struct {
	kind   actKind
	errno  syscall.Errno
	delta  int64 // misdirect, sectors
	unit   int64 // tear, bytes
	suffix bool  // tear keeps a suffix
	mode   int   // corruption
	off    int64 // corrupt byte offset in the I/O
	val    byte  // corrupt byte value
	n      int64 // random bytes, bit flips, stale depth, latent count
	prob   float64
	dur    int64 // stall; 0 for ever
	dist   Dist  // delay
	text   string
}

// Rule is one selector and one action, with its counters.
type Rule struct {
	Name     string
	ops      opSet
	lo, hi   int64 // sectors; hi 0: no range
	minSize  int64
	maxSize  int64 // 0: no limit
	nth      uint64
	every    uint64
	first    uint64
	after    uint64
	p        float64 // 0: always
	winFrom  int64   // ns since load
	winTo    int64   // 0: open
	cycOn    int64
	cycOff   int64
	jitter   int64
	budget   int64 // bytes; 0: none
	state    string
	next     string
	atlas    bool // this rule's faults are subject to the device's atlas
	Action   Action
	key      uint64
	text     string
	matched  atomic.Uint64
	fired    atomic.Uint64
	budgetMu atomic.Int64 // bytes left of the budget
}

// errnos a rule may give, by name.
var errnos = map[string]syscall.Errno{
	"EIO": syscall.EIO, "ENOSPC": syscall.ENOSPC, "EPERM": syscall.EPERM, "EINVAL": syscall.EINVAL,
	"ESHUTDOWN": syscall.ESHUTDOWN, "ENOMEM": syscall.ENOMEM, "EROFS": syscall.EROFS, "ENODEV": syscall.ENODEV,
	"ENXIO": syscall.ENXIO, "EAGAIN": syscall.EAGAIN, "ETIMEDOUT": syscall.ETIMEDOUT, "EILSEQ": syscall.EILSEQ,
	"ENODATA": syscall.ENODATA, "EBADMSG": syscall.EBADMSG, "EDQUOT": syscall.EDQUOT, "EFBIG": syscall.EFBIG,
}

// ruleError is a refusal naming the rule and the word at fault.
func ruleError(rule, word, format string, a ...any) error {
	return fmt.Errorf("rule %s: %q: %s", rule, word, fmt.Sprintf(format, a...))
}

// parseRule reads the words of one rule (after the word rule). sectors is
// the device's size, against which ranges are checked; index names a rule
// without a name.
func parseRule(words []string, sectors int64, index int) (*Rule, error) {
	r := &Rule{Name: "r" + strconv.Itoa(index)}
	for _, w := range words {
		if k, v, ok := strings.Cut(w, "="); ok && k == "name" {
			if v == "" || strings.ContainsAny(v, " :=") {
				return nil, ruleError(r.Name, w, "a name is a word without ':' or '='")
			}
			r.Name = v
		}
	}
	actions := 0
	for _, w := range words {
		k, v, hasV := strings.Cut(w, "=")
		bad := func(format string, a ...any) error { return ruleError(r.Name, w, format, a...) }
		need := func() error {
			if !hasV || v == "" {
				return bad("needs a value")
			}
			return nil
		}
		var err error
		switch k {
		case "name":
		case "op":
			if err = need(); err != nil {
				return nil, err
			}
			for _, o := range strings.Split(v, ",") {
				found := false
				for i, n := range opNames {
					if o == n {
						r.ops |= 1 << i
						found = true
					}
				}
				if !found {
					return nil, bad("unknown op %q (read, write, flush, fua, discard, zeroes)", o)
				}
			}
		case "sectors":
			if err = need(); err != nil {
				return nil, err
			}
			lo, hi, e := parseRange(v)
			if e != nil {
				return nil, bad("%v", e)
			}
			if hi > sectors {
				return nil, bad("the range ends at sector %d, past the device's %d", hi, sectors)
			}
			r.lo, r.hi = lo, hi
		case "size":
			if err = need(); err != nil {
				return nil, err
			}
			a, b, _ := strings.Cut(v, "-")
			if r.minSize, err = parseSize(a); err != nil {
				return nil, bad("%v", err)
			}
			if b != "" {
				if r.maxSize, err = parseSize(b); err != nil {
					return nil, bad("%v", err)
				}
				if r.maxSize < r.minSize {
					return nil, bad("the largest size is below the smallest")
				}
			}
		case "nth", "every", "first", "after":
			if err = need(); err != nil {
				return nil, err
			}
			n, e := strconv.ParseUint(v, 10, 63)
			if e != nil || (n == 0 && k != "after") {
				return nil, bad("not a count above 0")
			}
			switch k {
			case "nth":
				r.nth = n
			case "every":
				r.every = n
			case "first":
				r.first = n
			case "after":
				r.after = n
			}
		case "p":
			if err = need(); err != nil {
				return nil, err
			}
			if r.p, err = ParseProbability(v); err != nil {
				return nil, bad("%v", err)
			}
			if r.p == 0 {
				return nil, bad("a probability of 0 never fires")
			}
		case "window":
			if err = need(); err != nil {
				return nil, err
			}
			a, b, ok := strings.Cut(v, "-")
			if !ok {
				return nil, bad("a window is FROM-TO (TO may be empty)")
			}
			if r.winFrom, err = ParseDuration(a); err != nil {
				return nil, bad("%v", err)
			}
			if b != "" {
				if r.winTo, err = ParseDuration(b); err != nil {
					return nil, bad("%v", err)
				}
				if r.winTo <= r.winFrom {
					return nil, bad("the window ends before it starts")
				}
			}
		case "cycle":
			if err = need(); err != nil {
				return nil, err
			}
			parts := strings.Split(v, "/")
			if len(parts) < 2 || len(parts) > 3 {
				return nil, bad("a cycle is ON/OFF[/JITTER]")
			}
			if r.cycOn, err = ParseDuration(parts[0]); err == nil {
				r.cycOff, err = ParseDuration(parts[1])
			}
			if err == nil && len(parts) == 3 {
				r.jitter, err = ParseDuration(parts[2])
			}
			if err != nil {
				return nil, bad("%v", err)
			}
			if r.cycOn == 0 || r.cycOn+r.cycOff == 0 {
				return nil, bad("a cycle needs an ON time")
			}
			if r.jitter > min(r.cycOn, max(r.cycOff, 1)) {
				return nil, bad("the jitter is larger than the cycle's parts")
			}
		case "budget":
			if err = need(); err != nil {
				return nil, err
			}
			if r.budget, err = parseSize(v); err != nil || r.budget == 0 {
				return nil, bad("not a byte count above 0")
			}
		case "state":
			if err = need(); err != nil {
				return nil, err
			}
			r.state = v
		case "goto":
			if err = need(); err != nil {
				return nil, err
			}
			r.next = v
		case "atlas":
			if hasV {
				return nil, bad("atlas takes no value")
			}
			r.atlas = true
		default:
			a, isAction, e := parseAction(k, v, hasV)
			if e != nil {
				return nil, bad("%v", e)
			}
			if !isAction {
				return nil, bad("unknown selector or action")
			}
			actions++
			if actions > 1 {
				return nil, bad("a rule has one action")
			}
			a.text = w
			r.Action = a
		}
	}
	if actions == 0 {
		return nil, fmt.Errorf("rule %s: no action (error, drop, phantom, misdirect, tear, corrupt, stale, latent, lie, stall, delay or count)", r.Name)
	}
	if r.Action.kind == actLie && r.ops != 0 && r.ops != 1<<OpFlush {
		return nil, fmt.Errorf("rule %s: lie acts on flushes (op=flush)", r.Name)
	}
	r.ops = defaultOps(r)
	r.text = strings.Join(words, " ")
	r.key = keyOf(r.Name)
	r.budgetMu.Store(r.budget)
	return r, nil
}

// defaultOps gives actions that act on one kind of I/O that kind when the
// rule names none.
func defaultOps(r *Rule) opSet {
	if r.ops != 0 {
		return r.ops
	}
	switch r.Action.kind {
	case actLie:
		return 1 << OpFlush
	case actStale:
		return 1 << OpRead
	case actPhantom, actMisdirect, actTear:
		return 1 << OpWrite
	}
	return 0
}

// parseAction reads one action word.
func parseAction(k, v string, hasV bool) (Action, bool, error) {
	a := Action{}
	noValue := func() error {
		if hasV {
			return fmt.Errorf("%s takes no value", k)
		}
		return nil
	}
	switch k {
	case "count":
		return Action{kind: actCount}, true, noValue()
	case "error":
		a.kind, a.errno = actError, syscall.EIO
		if hasV {
			e, ok := errnos[strings.ToUpper(v)]
			if !ok {
				n, err := strconv.Atoi(v)
				if err != nil || n <= 0 || n > 4095 {
					return a, true, fmt.Errorf("unknown errno %q", v)
				}
				e = syscall.Errno(n)
			}
			a.errno = e
		}
		return a, true, nil
	case "drop":
		return Action{kind: actDrop}, true, noValue()
	case "phantom":
		return Action{kind: actPhantom}, true, noValue()
	case "lie":
		return Action{kind: actLie}, true, noValue()
	case "misdirect":
		n, err := strconv.ParseInt(v, 10, 64)
		if !hasV || err != nil || n == 0 {
			return a, true, fmt.Errorf("misdirect=SECTORS: a sector offset other than 0")
		}
		return Action{kind: actMisdirect, delta: n}, true, nil
	case "tear":
		u, side, _ := strings.Cut(v, ":")
		n, err := parseSize(u)
		if !hasV || err != nil || n < 512 || n%512 != 0 {
			return a, true, fmt.Errorf("tear=UNIT[:prefix|:suffix]: a unit of whole sectors")
		}
		a = Action{kind: actTear, unit: n}
		switch side {
		case "", "prefix":
		case "suffix":
			a.suffix = true
		default:
			return a, true, fmt.Errorf("tear keeps a prefix or a suffix, not %q", side)
		}
		return a, true, nil
	case "corrupt":
		parts := strings.Split(v, ":")
		a.kind = actCorrupt
		bad := fmt.Errorf("corrupt=byte:OFFSET:VALUE | random:N | bits:N | stuck:PROBABILITY")
		if !hasV {
			return a, true, bad
		}
		switch parts[0] {
		case "byte":
			if len(parts) != 3 {
				return a, true, bad
			}
			off, e1 := strconv.ParseInt(parts[1], 10, 64)
			val, e2 := strconv.ParseUint(parts[2], 0, 8)
			if e1 != nil || e2 != nil || off < 0 {
				return a, true, bad
			}
			a.mode, a.off, a.val = corruptByte, off, byte(val)
		case "random", "bits":
			if len(parts) != 2 {
				return a, true, bad
			}
			n, err := strconv.ParseInt(parts[1], 10, 64)
			if err != nil || n <= 0 {
				return a, true, bad
			}
			a.mode, a.n = corruptRandom, n
			if parts[0] == "bits" {
				a.mode = corruptBits
			}
		case "stuck":
			if len(parts) != 2 {
				return a, true, bad
			}
			p, err := ParseProbability(parts[1])
			if err != nil || p == 0 {
				return a, true, bad
			}
			a.mode, a.prob = corruptStuck, p
		default:
			return a, true, bad
		}
		return a, true, nil
	case "stale", "latent":
		n, err := strconv.ParseInt(v, 10, 64)
		max := int64(maxStale)
		if k == "latent" {
			max = 255
		}
		if !hasV || err != nil || n < 1 || n > max {
			return a, true, fmt.Errorf("%s=N: a count from 1 to %d", k, max)
		}
		a.kind, a.n = actStale, n
		if k == "latent" {
			a.kind = actLatent
		}
		return a, true, nil
	case "stall":
		a.kind = actStall
		if hasV {
			d, err := ParseDuration(v)
			if err != nil || d == 0 {
				return a, true, fmt.Errorf("stall[=DURATION]: a duration above 0, or none for until released")
			}
			a.dur = d
		}
		return a, true, nil
	case "delay":
		if !hasV {
			return a, true, fmt.Errorf("delay=DISTRIBUTION")
		}
		d, err := ParseDist(v)
		if err != nil {
			return a, true, err
		}
		return Action{kind: actDelay, dist: d}, true, nil
	}
	return a, false, nil
}

// parseRange reads START+LEN or START-END (END exclusive), in sectors.
func parseRange(s string) (int64, int64, error) {
	if a, b, ok := strings.Cut(s, "+"); ok {
		lo, e1 := strconv.ParseInt(a, 10, 64)
		n, e2 := strconv.ParseInt(b, 10, 64)
		if e1 != nil || e2 != nil || lo < 0 || n <= 0 || lo+n < lo {
			return 0, 0, fmt.Errorf("sectors=START+LEN or START-END")
		}
		return lo, lo + n, nil
	}
	a, b, ok := strings.Cut(s, "-")
	lo, e1 := strconv.ParseInt(a, 10, 64)
	hi, e2 := strconv.ParseInt(b, 10, 64)
	if !ok || e1 != nil || e2 != nil || lo < 0 || hi <= lo {
		return 0, 0, fmt.Errorf("sectors=START+LEN or START-END")
	}
	return lo, hi, nil
}

// maxStale is how many versions back a stale read may go.
const maxStale = 8
