package fault

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/stack"
)

// Type is the fault target type. Its targets wait on the delay targets'
// scheduler (shared in the Manager).
var Type = &stack.TargetType{Name: "fault", Version: [3]int{1, 0, 0}, New: func(c *stack.Ctor, args []string) (stack.Target, error) {
	s, err := delay.Shared(c)
	if err != nil {
		return nil, &stack.ArgError{Reason: "Cannot start the scheduler: " + err.Error(), Errno: syscall.ENOMEM}
	}
	return New(s, c, args)
}}

// NewType returns a fault type whose targets wait on s (a scheduler on a
// manual clock, in tests).
func NewType(s *delay.Scheduler) *stack.TargetType {
	return &stack.TargetType{Name: "fault", Version: Type.Version, New: func(c *stack.Ctor, args []string) (stack.Target, error) {
		return New(s, c, args)
	}}
}

// Target is a constructed fault target.
type Target struct {
	*engine
	remap stack.Remap
}

var (
	_ stack.Target       = (*Target)(nil)
	_ stack.Flusher      = (*Target)(nil)
	_ stack.Discarder    = (*Target)(nil)
	_ stack.ZeroWriter   = (*Target)(nil)
	_ stack.Messager     = (*Target)(nil)
	_ stack.Presuspender = (*Target)(nil)
	_ stack.Resumer      = (*Target)(nil)
	_ stack.EventLogger  = (*Target)(nil)
)

// groupKey and atlasKey key the objects the devices of one throttle group
// or atlas share in the Manager.
type (
	groupKey string
	atlasKey string
)

type group struct {
	spec    string
	buckets []*bucket
}

// New constructs a fault target served by s. The table syntax is
//
//	<dev> <offset> [<option>...] [rule <selector>... <action>]...
//
// dev and offset as linear's; the options (config.go) set the seed, the
// performance model and the shared groups; each rule (rule.go) selects I/O
// and acts on it. With no option and no rule the target is linear.
func New(s *delay.Scheduler, c *stack.Ctor, args []string) (*Target, error) {
	if len(args) < 2 {
		return nil, stack.Errorf("Invalid argument count: <dev> <offset> [<option>...] [rule ...]...")
	}
	r, err := stack.OpenArea(c, args[0], args[1], "Invalid device sector", c.Len)
	if err != nil {
		return nil, err
	}
	cfg, err := parseConfig(args[2:], c.Begin+c.Len)
	if err != nil {
		return nil, stack.Errorf("%v", err)
	}
	if cfg.group != "" {
		v, err := c.Shared.Get(groupKey(cfg.group), func() (any, error) {
			return &group{spec: cfg.groupKey, buckets: cfg.model.buckets}, nil
		})
		if err != nil {
			return nil, err
		}
		g := v.(*group)
		if g.spec != cfg.groupKey {
			return nil, stack.Errorf("group=%s: the group's throttles are %q, not %q", cfg.group, g.spec, cfg.groupKey)
		}
		cfg.model.buckets = g.buckets
	}
	for _, rl := range cfg.replay {
		found := false
		for _, ru := range cfg.rules {
			found = found || ru.Name == rl.Rule
		}
		if !found {
			return nil, stack.Errorf("replay: the log names rule %s, which the table does not have", rl.Rule)
		}
	}
	t := &Target{remap: r}
	t.engine = newEngine(cfg, r.Dev, r.Off, c.Begin*stack.SectorSize, c.Len*stack.SectorSize, s.NewQueue())
	if c.Event != nil {
		t.event = c.Event
	}
	if cfg.atlas != "" {
		v, err := c.Shared.Get(atlasKey(cfg.atlas), func() (any, error) {
			return &atlas{f: cfg.atlasF, region: cfg.atlasReg, hit: map[int64][]any{}}, nil
		})
		if err != nil {
			t.q.Close()
			return nil, err
		}
		a := v.(*atlas)
		if a.f != cfg.atlasF || a.region != cfg.atlasReg {
			t.q.Close()
			return nil, stack.Errorf("atlas=%s: the atlas holds %d of every %d sectors, not %d of %d", cfg.atlas, a.f, a.region, cfg.atlasF, cfg.atlasReg)
		}
		t.atl = a
		if c.Device != nil {
			t.self = c.Device
		}
	}
	return t, nil
}

// Status prints the table line (device, offset, options, rules) or the
// counters.
func (t *Target) Status(st stack.StatusType) string {
	if st == stack.StatusTable {
		w := []string{stack.EscapeArg(t.remap.Dev.Name()), strconv.FormatInt(t.remap.Off/stack.SectorSize, 10)}
		for _, x := range append(append([]string(nil), t.cfg.words...), ruleWords(t.rules.Load().rules)...) {
			w = append(w, stack.EscapeArg(x))
		}
		return strings.Join(w, " ")
	}
	return t.status()
}

// AppendEvents appends the event log.
func (t *Target) AppendEvents(b []byte) []byte { return t.log.appendText(b, 0) }

// Presuspend releases every stall and delay and stops delaying until
// resume, as dm-delay does, so that the suspend does not wait for them.
func (t *Target) Presuspend(bool) {
	t.releaseStalls()
	t.q.Release()
}

// Resume delays again.
func (t *Target) Resume() { t.q.Resume() }

// Close gives up the target's queue.
func (t *Target) Close() error {
	t.releaseStalls()
	t.q.Close()
	return nil
}

// Message changes the rules or reads what happened; a change is in force
// for every I/O that arrives after the answer:
//
//	rules [rule ...]...    replace every rule (none: remove them all)
//	add rule ...           add a rule after the others
//	remove NAME            remove a rule
//	state [S]              set the state (none: print it)
//	release                let every stall for ever go
//	log [N]                the last N events (default all kept)
//	counters               the INFO status
//	reset                  zero the rules' counters, forget the atlas's hits
//
// A message that would leave the rules invalid is refused and changes
// nothing.
func (t *Target) Message(_ context.Context, args []string) (string, error) {
	return t.message(args)
}

func (e *engine) message(args []string) (string, error) {
	if len(args) == 0 {
		return "", stack.Errorf("no message")
	}
	sectors := (e.begin + e.size) / sector
	switch args[0] {
	case "rules":
		rules, err := parseRules(args[1:], sectors)
		if err != nil {
			return "", stack.Errorf("%v", err)
		}
		e.rules.Store(newRuleSet(rules))
		return fmt.Sprintf("rules %d\n", len(rules)), nil
	case "add":
		if len(args) < 2 || args[1] != "rule" {
			return "", stack.Errorf("add rule <selector>... <action>")
		}
		old := e.rules.Load().rules
		r, err := parseRule(args[2:], sectors, len(old))
		if err != nil {
			return "", stack.Errorf("%v", err)
		}
		for _, x := range old {
			if x.Name == r.Name {
				return "", stack.Errorf("rule %s: two rules of that name", r.Name)
			}
		}
		rules := append(append([]*Rule(nil), old...), r)
		if err := checkStates(rules); err != nil {
			return "", stack.Errorf("%v", err)
		}
		e.rules.Store(newRuleSet(rules))
		return fmt.Sprintf("rules %d\n", len(rules)), nil
	case "remove":
		if len(args) != 2 {
			return "", stack.Errorf("remove NAME")
		}
		old := e.rules.Load().rules
		var rules []*Rule
		for _, x := range old {
			if x.Name != args[1] {
				rules = append(rules, x)
			}
		}
		if len(rules) == len(old) {
			return "", stack.Errorf("remove: no rule %s", args[1])
		}
		if err := checkStates(rules); err != nil {
			return "", stack.Errorf("%v", err)
		}
		e.rules.Store(newRuleSet(rules))
		return fmt.Sprintf("rules %d\n", len(rules)), nil
	case "state":
		switch len(args) {
		case 1:
			return *e.state.Load() + "\n", nil
		case 2:
			s := args[1]
			e.state.Store(&s)
			return "state " + s + "\n", nil
		}
		return "", stack.Errorf("state [S]")
	case "release":
		e.releaseStalls()
		return "", nil
	case "log":
		n := 0
		if len(args) == 2 {
			var err error
			if n, err = strconv.Atoi(args[1]); err != nil || n < 1 {
				return "", stack.Errorf("log [N]: N a count above 0")
			}
		} else if len(args) > 2 {
			return "", stack.Errorf("log [N]")
		}
		return string(e.log.appendText(nil, n)), nil
	case "counters":
		return e.status() + "\n", nil
	case "reset":
		for _, r := range e.rules.Load().rules {
			r.matched.Store(0)
			r.fired.Store(0)
			r.budgetMu.Store(r.budget)
		}
		if e.atl != nil {
			e.atl.reset()
		}
		return "", nil
	}
	return "", stack.Errorf("unknown message %q (rules, add, remove, state, release, log, counters, reset)", args[0])
}
