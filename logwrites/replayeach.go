package logwrites

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EachOptions are the options of --each: replay the log once onto the
// target, and at every check point (every FUA, flush or discard entry, or
// every N-th entry) sync the target and run the --fsck command, stopping at
// the first one that fails. The command gets the entry number and the
// target in DMFUSE_REPLAY_ENTRY and DMFUSE_REPLAY_TARGET.
type EachOptions struct {
	// Mode and N say which entries are check points, as for --check.
	Mode CheckMode
	N    uint64
	// From, when set, checks only from the first mark of this name on
	// (--each-from).
	From *string
	// JSON prints one JSON object per point and a summary (--json).
	JSON bool
}

// checkEach refuses --each combined with what it cannot go with.
func (rl *rlog) checkEach() {
	o := rl.each
	switch {
	case o == nil:
	case o.Mode == 0:
		rl.fail("%s: --each-from and --json go with --each\n", rl.prog)
	case !rl.hasReplay || !rl.hasFsck:
		rl.fail("%s: --each needs --replay DEVICE and --fsck COMMAND\n", rl.prog)
	case rl.checkMode != 0 || rl.find || rl.numEntries:
		rl.fail("%s: --each excludes --check, --find and --num-entries\n", rl.prog)
	}
}

// EachPoint is one check point, as --json prints it.
type EachPoint struct {
	Point   int     `json:"point"`
	Entry   uint64  `json:"entry"`
	Unit    int64   `json:"unit"` // log unit after the entry's header, as replay-log -v prints it
	Flags   string  `json:"flags"`
	OK      bool    `json:"ok"`
	Status  int     `json:"status"` // the command's exit status; -1 if a signal ended it
	Seconds float64 `json:"seconds"`
	Output  string  `json:"output,omitempty"` // the end of what the command printed, when it failed
}

// EachSummary ends the --json output.
type EachSummary struct {
	Summary   bool    `json:"summary"`
	Kind      string  `json:"kind"`
	Points    int     `json:"points"`
	Entries   uint64  `json:"entries"`
	DataBytes int64   `json:"data_bytes"`
	Seconds   float64 `json:"seconds"`
	Failed    bool    `json:"failed"`
	Entry     *uint64 `json:"failed_entry,omitempty"`
	Reproduce string  `json:"reproduce,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// runEach replays from the start position and checks the target at every
// check point. The target is written incrementally, once: the command must
// leave it unchanged (check a copy to mount it or repair it).
func (rl *rlog) runEach() int {
	o := rl.each
	kind := map[CheckMode]string{CheckFUA: "fua", CheckFlush: "flush", CheckDiscard: "discard"}[o.Mode]
	if o.Mode == CheckNumber {
		kind = fmt.Sprintf("every-%d", o.N)
	}
	if o.JSON {
		rl.vout = bufio.NewWriter(rl.errw)
	}
	enc := json.NewEncoder(rl.out)
	sum := EachSummary{Summary: true, Kind: kind}
	start := time.Now()
	checking := o.From == nil
	var n uint64
	done := func(status int) int {
		sum.Entries, sum.DataBytes, sum.Seconds = n, rl.dataBytes, time.Since(start).Seconds()
		if o.JSON {
			enc.Encode(sum)
			return status
		}
		rate := ""
		if s := sum.Seconds; s > 0 {
			rate = fmt.Sprintf(" (%.0f entries/s, %.1f MiB/s)", float64(n)/s, float64(rl.dataBytes)/s/(1<<20))
		}
		fmt.Fprintf(rl.out, "replayed %d entries, %.1f MiB of data, in %.2fs%s; %d %s points checked\n",
			n, float64(rl.dataBytes)/(1<<20), sum.Seconds, rate, sum.Points, kind)
		return status
	}
	fail := func(msg string) int {
		sum.Failed, sum.Error = true, msg
		if !o.JSON {
			rl.flush()
			fmt.Fprintf(rl.errw, "%s: %s\n", rl.prog, msg)
		}
		return done(1)
	}
	for {
		e, ok := rl.replayNext()
		if !ok {
			return fail("replay failed (see above)")
		}
		if e == nil {
			break
		}
		n++
		if !checking && e.Flags&FlagMark != 0 && MarkMatches(*o.From, e.Unit, e.DataLen) {
			checking = true
		}
		if checking && checkPoint(o.Mode, o.N, n, e) {
			sum.Points++
			p := EachPoint{Point: sum.Points, Entry: e.Index, Unit: e.Pos/int64(rl.s) + 1, Flags: FlagNames(e.Flags)}
			t0 := time.Now()
			var out tailBuffer
			p.Status, p.OK = rl.eachCheck(e.Index, &out)
			p.Seconds = time.Since(t0).Seconds()
			if !p.OK {
				p.Output = out.String()
			}
			rl.printPoint(enc, p)
			if !p.OK {
				idx := e.Index
				sum.Failed, sum.Entry, sum.Reproduce = true, &idx, rl.reproduce(n, e.Index)
				if !o.JSON {
					fmt.Fprintf(rl.out, "first failure at entry %d (%s point %d); %s holds the device as of that entry\n", e.Index, kind, p.Point, rl.replayPath)
					fmt.Fprintf(rl.out, "reproduce onto a device that holds what %s held before this run:\n  %s\n", rl.replayPath, sum.Reproduce)
				}
				return done(1)
			}
		}
		if rl.limit != 0 && n == rl.limit || shouldStop(e, rl.stopFlags, rl.endMark) {
			break
		}
	}
	if err := rl.replayf.Sync(); err != nil {
		return fail(fmt.Sprintf("syncing %s: %v", rl.replayPath, err))
	}
	if !checking {
		return fail(fmt.Sprintf("no mark %q in the log: nothing was checked", *o.From))
	}
	if sum.Points == 0 {
		sum.Error = fmt.Sprintf("no %s point in the log: nothing was checked", kind)
		if !o.JSON {
			rl.flush()
			fmt.Fprintf(rl.errw, "%s: %s\n", rl.prog, sum.Error)
		}
		return done(2)
	}
	if !o.JSON {
		fmt.Fprintf(rl.out, "all %d %s points clean\n", sum.Points, kind)
	}
	return done(0)
}

// eachCheck syncs the target and runs the command with the entry number
// and the target in its environment, its output going to out.
func (rl *rlog) eachCheck(entry uint64, out *tailBuffer) (status int, ok bool) {
	if err := rl.replayf.Sync(); err != nil {
		fmt.Fprintf(out, "syncing %s: %v\n", rl.replayPath, err)
		return -1, false
	}
	rl.flush()
	cmd := exec.Command("/bin/sh", "-c", rl.fsck)
	cmd.Env = append(os.Environ(), "DMFUSE_REPLAY_ENTRY="+strconv.FormatUint(entry, 10), "DMFUSE_REPLAY_TARGET="+rl.replayPath)
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, true
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			fmt.Fprintf(out, "killed by signal %v\n", ws.Signal())
		}
		return ee.ExitCode(), false
	}
	fmt.Fprintf(out, "%v\n", err)
	return -1, false
}

func (rl *rlog) printPoint(enc *json.Encoder, p EachPoint) {
	if rl.each.JSON {
		enc.Encode(p)
		rl.flush()
		return
	}
	result := fmt.Sprintf("clean, %.2fs", p.Seconds)
	if !p.OK {
		result = fmt.Sprintf("FAILED (exit status %d), %.2fs", p.Status, p.Seconds)
	}
	fmt.Fprintf(rl.out, "point %d: entry %d@%d (%s): %s\n", p.Point, p.Entry, p.Unit, p.Flags, result)
	for _, line := range strings.SplitAfter(strings.TrimRight(p.Output, "\n"), "\n") {
		if line != "" {
			fmt.Fprintf(rl.out, "    %s", strings.TrimSuffix(line, "\n")+"\n")
		}
	}
	rl.flush()
}

// reproduce returns a shell command that replays the same entries (n of
// them from the start position) and runs the check as --each ran it.
func (rl *rlog) reproduce(n, entry uint64) string {
	args := []string{rl.prog, "--log", rl.logPath, "--replay", rl.replayPath}
	switch {
	case rl.startMark != nil:
		args = append(args, "--start-mark", *rl.startMark)
	case rl.startEntry != 0:
		args = append(args, "--start-entry", strconv.FormatUint(rl.startEntry, 10))
	}
	if rl.startSector != 0 {
		args = append(args, "--start-sector", strconv.FormatUint(rl.startSector, 10))
	}
	if rl.endSector != 1<<64-1 {
		args = append(args, "--end-sector", strconv.FormatUint(rl.endSector, 10))
	}
	if rl.noDiscard {
		args = append(args, "--no-discard")
	}
	args = append(args, "--limit", strconv.FormatUint(n, 10))
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	if rl.prog == "dmfuse replay-log" {
		q[0] = "dmfuse replay-log"
	}
	return strings.Join(q, " ") + " && DMFUSE_REPLAY_ENTRY=" + strconv.FormatUint(entry, 10) +
		" DMFUSE_REPLAY_TARGET=" + shellQuote(rl.replayPath) + " sh -c " + shellQuote(rl.fsck)
}

// shellQuote quotes s for sh when it holds anything but plain characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// tailBuffer keeps the last tailMax bytes written to it.
type tailBuffer struct{ b []byte }

const tailMax = 16 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > tailMax {
		t.b = append(t.b[:0], t.b[len(t.b)-tailMax:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }
