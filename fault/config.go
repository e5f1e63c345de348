package fault

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// config is a parsed table: the device's options and its rules.
type config struct {
	seed     uint64
	words    []string // the options as the table prints them
	model    *model
	group    string // throttle group
	groupKey string // the throttle words, which every member must share
	atlas    string
	atlasF   int
	atlasReg int64
	logN     int
	histLim  int64
	replay   []Event
	rules    []*Rule
}

// Option words, before the first rule:
//
//	seed=N                the seed of every draw (default 0)
//	preset=NAME[:K=V,...] a performance preset (presets.go); later options
//	                      override what it sets
//	read=, write=, flush=DIST   service times (dist.go)
//	units=N               parallel units (0: no queueing)
//	hdd=GiB               the spinning-disk model over a disk of that size
//	iops= riops= wiops= bps= rbps= wbps=RATE[/BURST[/SECONDS]]  throttles
//	iops-size=SIZE        an operation larger than SIZE costs SIZE-sized ops
//	group=NAME            the throttles are shared by the devices of NAME
//	stall=EVERY/FOR[/JITTER]   the device serves nothing FOR every EVERY
//	slow=EVERY/FOR/FACTOR service times FACTOR times longer FOR every EVERY
//	gc=BYTES/FOR          a FOR stall after every BYTES written
//	atlas=NAME/F/REGION   rules marked atlas hit at most F of the devices
//	                      of NAME in any REGION sectors
//	log=N                 events kept (default 4096)
//	history=SIZE          bound of stale, lie and phantom data (default 64M)
//	replay=PATH           fire the faults of an event log, at its I/O
//	                      indices, instead of the rules' selectors
func parseConfig(args []string, sectors int64) (*config, error) {
	c := &config{model: &model{}, logN: 4096, histLim: 64 << 20}
	first := len(args)
	for i, a := range args {
		if a == "rule" {
			first = i
			break
		}
	}
	opts := args[:first]
	// A preset's words go first, so that the user's override them.
	var expanded []string
	for _, w := range opts {
		if v, ok := strings.CutPrefix(w, "preset="); ok {
			p, err := preset(v)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", w, err)
			}
			expanded = append(p, expanded...)
		}
	}
	expanded = append(expanded, opts...)
	vals := map[string]string{}
	var order []string
	for _, w := range expanded {
		k, v, ok := strings.Cut(w, "=")
		if !ok || v == "" {
			return nil, fmt.Errorf("%q: an option is KEY=VALUE (or the word rule starts the rules)", w)
		}
		if _, seen := vals[k]; !seen {
			order = append(order, k)
		}
		vals[k] = v
	}
	ioSize := int64(0)
	if v, ok := vals["iops-size"]; ok {
		n, err := parseSize(v)
		if err != nil || n < sector {
			return nil, fmt.Errorf("%q: a size of at least 512", "iops-size="+v)
		}
		ioSize = n
	}
	var throttle []string
	for _, k := range order {
		v := vals[k]
		w := k + "=" + v
		var err error
		switch k {
		case "preset":
		case "seed":
			c.seed, err = strconv.ParseUint(v, 10, 64)
		case "read", "write", "flush":
			var d Dist
			if d, err = ParseDist(v); err == nil {
				c.model.lat[map[string]int{"read": 0, "write": 1, "flush": 2}[k]] = d
			}
		case "units":
			var n int
			if n, err = strconv.Atoi(v); err == nil && (n < 0 || n > 4096) {
				err = fmt.Errorf("0 to 4096 units")
			}
			c.model.units = n
		case "hdd":
			var g float64
			if g, err = strconv.ParseFloat(v, 64); err == nil && g <= 0 {
				err = fmt.Errorf("a size in GiB above 0")
			}
			c.model.hdd = &hddModel{size: int64(g * (1 << 30)), rpm: 7200, minSk: 1e6, maxSk: 16e6, outer: 200e6, inner: 100e6, seekTr: 256 << 10}
			c.model.units = 1
		case "iops", "riops", "wiops", "bps", "rbps", "wbps":
			var b []*bucket
			if b, err = parseThrottle(k, v, ioSize); err == nil {
				c.model.buckets = append(c.model.buckets, b...)
				throttle = append(throttle, w)
			}
		case "iops-size":
			throttle = append(throttle, w)
		case "group":
			c.group = v
		case "stall":
			c.model.stall, err = parseEpisodes(k, v, keyStall)
		case "slow":
			c.model.slow, err = parseEpisodes(k, v, keySlow)
		case "gc":
			a, b, ok := strings.Cut(v, "/")
			var d int64
			if c.model.gcEvery, err = parseSize(a); err == nil && ok {
				d, err = ParseDuration(b)
				c.model.gcFor = d
			}
			if err == nil && (!ok || c.model.gcEvery == 0 || d == 0) {
				err = fmt.Errorf("gc=BYTES/DURATION, both above 0")
			}
		case "atlas":
			p := strings.Split(v, "/")
			if len(p) != 3 || p[0] == "" {
				err = fmt.Errorf("atlas=NAME/F/REGION")
				break
			}
			c.atlas = p[0]
			if c.atlasF, err = strconv.Atoi(p[1]); err == nil && c.atlasF < 1 {
				err = fmt.Errorf("the factor F is at least 1")
			}
			if err == nil {
				if c.atlasReg, err = strconv.ParseInt(p[2], 10, 64); err == nil && c.atlasReg < 1 {
					err = fmt.Errorf("REGION at least 1 sector")
				}
			}
		case "log":
			if c.logN, err = strconv.Atoi(v); err == nil && (c.logN < 0 || c.logN > 1<<20) {
				err = fmt.Errorf("0 to 1048576 events")
			}
		case "history":
			c.histLim, err = parseSize(v)
		case "replay":
			var f *os.File
			if f, err = os.Open(v); err == nil {
				c.replay, err = ParseEvents(f)
				f.Close()
			}
		default:
			err = fmt.Errorf("unknown option")
		}
		if err != nil {
			return nil, fmt.Errorf("%q: %v", w, err)
		}
	}
	if c.model.units > 0 {
		c.model.free = make([]int64, c.model.units)
	}
	c.words = append(c.words, opts...)
	c.groupKey = strings.Join(throttle, " ")
	if c.group != "" && len(c.model.buckets) == 0 {
		return nil, fmt.Errorf("%q: a throttle group needs throttles", "group="+c.group)
	}
	rules, err := parseRules(args[first:], sectors)
	if err != nil {
		return nil, err
	}
	c.rules = rules
	return c, nil
}

// parseRules reads rule words: each rule starts with the word rule.
func parseRules(args []string, sectors int64) ([]*Rule, error) {
	var rules []*Rule
	names := map[string]bool{}
	for i := 0; i < len(args); {
		if args[i] != "rule" {
			return nil, fmt.Errorf("%q: rules start with the word rule", args[i])
		}
		j := i + 1
		for j < len(args) && args[j] != "rule" {
			j++
		}
		r, err := parseRule(args[i+1:j], sectors, len(rules))
		if err != nil {
			return nil, err
		}
		if names[r.Name] {
			return nil, fmt.Errorf("rule %s: two rules of that name", r.Name)
		}
		names[r.Name] = true
		rules = append(rules, r)
		i = j
	}
	return rules, checkStates(rules)
}

// checkStates refuses a rule that requires a state no rule moves to
// (other than the start state, "1", and what a message may set).
func checkStates(rules []*Rule) error {
	reach := map[string]bool{"1": true}
	for _, r := range rules {
		if r.next != "" {
			reach[r.next] = true
		}
	}
	for _, r := range rules {
		if r.state != "" && !reach[r.state] {
			return fmt.Errorf("rule %s: %q: no rule moves to state %s (states start at 1)", r.Name, "state="+r.state, r.state)
		}
	}
	return nil
}

// ruleWords prints rules as the table reads them.
func ruleWords(rules []*Rule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, "rule")
		out = append(out, strings.Fields(r.text)...)
	}
	return out
}
