package main

import (
	"fmt"
	"io"
	"os"

	"github.com/dmfuse/dmfuse/internal/dmarg"
	"github.com/dmfuse/dmfuse/internal/getopt"
	"github.com/dmfuse/dmfuse/logwrites"
)

// ReplayLogCmd is `dmfuse replay-log`: xfstests' src/log-writes/replay-log
// for logs of the log-writes target, with its command line, output and exit
// statuses, plus --each. This file reads the command line; the engine is
// logwrites.Replay. The binary run under the name replay-log (a
// symlink) is the same program.
type ReplayLogCmd struct {
	Args []string `arg:"" optional:"" help:"replay-log's options: --log LOG [--replay DEV] [--limit N] [--next-flush] [--next-fua] [--start-entry N|--start-mark M] [--end-mark M] [--find] [--num-entries] [--no-discard] [--check fua|flush|discard|N --fsck CMD] [--start-sector S] [--end-sector S] [-v|-vv], and --each fua|flush|discard|N --fsck CMD [--each-from MARK] [--json]."`
}

// Run runs replay-log and exits with its status. As a dmfuse verb it also
// answers --help (and -h) with its usage on standard output; replay-log has
// no such option.
func (c *ReplayLogCmd) Run(*Globals) error {
	for _, a := range c.Args {
		if a == "--" {
			break
		}
		if a == "--help" || a == "-h" {
			fmt.Print(replayLogUsage)
			os.Exit(0)
		}
	}
	os.Exit(replayLog(append([]string{"dmfuse replay-log"}, c.Args...), os.Stdout, os.Stderr))
	return nil
}

// replay-log's option table, in its order (the order decides which option
// an abbreviation stands for), then dmfuse's additions.
const (
	optNextFlush = iota
	optNextFUA
	optStartEntry
	optEndMark
	optLog
	optReplay
	optLimit
	optVerbose
	optFind
	optNumEntries
	optNoDiscard
	optFsck
	optCheck
	optStartMark
	optStartSector
	optEndSector
	optEach
	optEachFrom
	optJSON
)

var replayLogOptions = []getopt.Option{
	{Name: "next-flush"},
	{Name: "next-fua"},
	{Name: "start-entry", HasArg: true},
	{Name: "end-mark", HasArg: true},
	{Name: "log", HasArg: true},
	{Name: "replay", HasArg: true},
	{Name: "limit", HasArg: true},
	{Name: "verbose", Val: 'v'},
	{Name: "find"},
	{Name: "num-entries"},
	{Name: "no-discard"},
	{Name: "fsck", HasArg: true},
	{Name: "check", HasArg: true},
	{Name: "start-mark", HasArg: true},
	{Name: "start-sector", HasArg: true},
	{Name: "end-sector", HasArg: true},
	{Name: "each", HasArg: true},
	{Name: "each-from", HasArg: true},
	{Name: "json"},
}

// replayLogUsage is replay-log's usage text (its typos and its
// --number-entries, which the option table spells --num-entries,
// included), then dmfuse's additions.
const replayLogUsage = `Usage: replay-log --log <logfile> [options]
	--replay <device> - replay onto a specific device
	--limit <number> - number of entries to replay
	--next-flush - replay to/find the next flush
	--next-fua - replay to/find the next fua
	--start-entry <entry> - start at the given entry #
	--start-mark <mark> - mark to start from
	--end-mark <mark> - replay to/find the given mark
	--find - put replay-log in find mode, will search based on the other options
	--number-entries - print the number of entries in the log
	--no-discard - don't process discard entries
	--fsck - the fsck command to run, must specify --check
	--check [<number>|flush|fua|discard] when to check the file system, mush specify --fsck
	--start-sector <sector> - replay ops on region from <sector> onto <device>
	--end-sector <sector> - replay ops on region to <sector> onto <device>
	-v or --verbose - print replayed ops
	-vv - print also skipped ops
` + replayLogUsageMore

// replayLogUsageMore describes dmfuse's additions.
const replayLogUsageMore = `	--each [<number>|flush|fua|discard] - replay onto --replay, run --fsck at every such point, stop at the first failure
	--each-from <mark> - with --each, check only from the first mark of that name on
	--json - with --each, one JSON object per point and a summary
`

// rlExit ends the parse with a status; parseReplayLog recovers it.
type rlExit int

// replayLog runs replay-log with argv (argv[0] is the name messages start
// with) and returns its exit status.
func replayLog(argv []string, stdout, stderr io.Writer) int {
	o, status, ok := parseReplayLog(argv, stderr)
	if !ok {
		return status
	}
	return logwrites.Replay(o, stdout, stderr)
}

// parseReplayLog reads the options in order, acting on each as
// replay-log's main does: a bad number ends the program at once (ok false,
// with the status to exit with).
func parseReplayLog(argv []string, errw io.Writer) (o logwrites.ReplayOptions, status int, ok bool) {
	o = logwrites.ReplayOptions{Prog: argv[0], Usage: replayLogUsage, EndSector: 1<<64 - 1}
	defer func() {
		if v := recover(); v != nil {
			e, isExit := v.(rlExit)
			if !isExit {
				panic(v)
			}
			status, ok = int(e), false
		}
	}()
	fail := func(format string, a ...any) {
		fmt.Fprintf(errw, format, a...)
		panic(rlExit(1))
	}
	usage := func() {
		io.WriteString(errw, replayLogUsage)
		panic(rlExit(1))
	}
	_, posix := os.LookupEnv("POSIXLY_CORRECT")
	g := &getopt.Parser{Prog: o.Prog, Args: argv[1:], Shorts: "v", Longs: replayLogOptions, Posix: posix}
	number := func(s, what string) uint64 {
		v, ok := dmarg.Strtoull(s)
		if !ok {
			fail("Invalid %s number\n", what)
		}
		return v
	}
	mark := func(s string) *string {
		if len(s) > logwrites.MaxReplayMark {
			s = s[:logwrites.MaxReplayMark]
		}
		return &s
	}
	check := func(s string) (logwrites.CheckMode, uint64) {
		mode, n, ok := logwrites.ParseCheckMode(s, dmarg.Strtoull)
		if !ok {
			fail("Invalid entry number\n")
		}
		return mode, n
	}
	hasLog := false
	each := func() *logwrites.EachOptions {
		if o.Each == nil {
			o.Each = &logwrites.EachOptions{}
		}
		return o.Each
	}
	for {
		opt, more, err := g.Next()
		if err != nil {
			fmt.Fprintln(errw, err)
			usage()
		}
		if !more {
			break
		}
		if opt.Val == 'v' {
			o.Verbose++
			continue
		}
		switch opt.Long {
		case optNextFlush:
			o.StopFlags |= logwrites.FlagFlush
		case optNextFUA:
			o.StopFlags |= logwrites.FlagFUA
		case optStartEntry:
			o.StartEntry = number(opt.Arg, "entry")
		case optStartMark:
			o.StartMark = mark(opt.Arg)
		case optEndMark:
			o.EndMark = mark(opt.Arg)
			o.StopFlags |= logwrites.FlagMark
		case optLog:
			o.Log, hasLog = opt.Arg, true
		case optReplay:
			o.Replay, o.HasReplay = opt.Arg, true
		case optLimit:
			o.Limit = number(opt.Arg, "entry")
		case optFind:
			o.Find = true
		case optNumEntries:
			o.NumEntries = true
		case optNoDiscard:
			o.NoDiscard = true
		case optFsck:
			o.Fsck, o.HasFsck = opt.Arg, true
		case optCheck:
			o.Check, o.CheckN = check(opt.Arg)
		case optStartSector:
			o.StartSector = number(opt.Arg, "sector")
		case optEndSector:
			o.EndSector = number(opt.Arg, "sector")
		case optEach:
			each().Mode, each().N = check(opt.Arg)
		case optEachFrom:
			each().From = mark(opt.Arg)
		case optJSON:
			each().JSON = true
		default:
			usage()
		}
	}
	if !hasLog {
		usage()
	}
	return o, 0, true
}
