package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/crash"
	"github.com/dmfuse/dmfuse/logwrites"
)

// CrashCmd is `dmfuse crash`: check every state a power cut may leave at
// the chosen cuts of a log-writes log (package crash).
type CrashCmd struct {
	Log      string        `required:"" help:"The log (a log-writes log device or file)."`
	Check    string        `help:"The check (required unless --export), run with /bin/sh -c for each state: the state's device file is in DMFUSE_CRASH_DEV, its id in DMFUSE_CRASH_STATE, the cut entry in DMFUSE_CRASH_CUT. Exit 0: the state is fine."`
	Image    string        `help:"The device's content when the log started (default: zeros)."`
	Size     int64         `help:"The device's size in bytes (default: the image's, else the end of the highest write)."`
	At       []string      `default:"flush" help:"Cut points: flush, fua, every:N (every N-th write), mark:NAME; repeat or separate with commas."`
	From     string        `help:"Only cuts after the first mark of this name (for example the mark after mkfs)."`
	Mode     string        `default:"subset" enum:"prefix,subset,sector" help:"prefix: every write up to the cut kept (replay-log); subset: any subset of the writes since the last flush lost (CrashMonkey); sector: every tear unit of them kept or lost on its own (FoundationDB)."`
	Unit     int64         `default:"0" help:"Tear unit in bytes for --mode sector (512, 4096, ...; default: the log's unit). A unit larger than the writes damages the neighbouring sectors it holds, as a 512e disk's torn read-modify-write does."`
	Fill     string        `default:"old" enum:"old,zero,junk" help:"What lost units read as: the old data, zeros, or junk drawn from the seed."`
	States   int           `default:"256" help:"States per cut: a cut with at most this many has them all enumerated, one with more has this many sampled."`
	Seed     uint64        `default:"1" help:"Seed of the sampling and the junk."`
	Clean    float64       `default:"0" help:"Probability that a sampled state loses nothing."`
	Jobs     int           `default:"0" help:"Checks run at once (default: the CPUs)."`
	Timeout  time.Duration `default:"5m" help:"A check running longer is killed and counts as a failure."`
	NoShrink bool          `help:"Do not shrink the first failing state."`
	State    string        `help:"Check only this state id (as a failure prints it)."`
	Export   string        `help:"With --state: write the state's device to this file instead of checking it."`
	JSON     bool          `name:"json" help:"Print one JSON object per failing state and a summary."`
	Workdir  string        `help:"Folder for the run's files (default: the temporary folder)."`
}

// crashSummary is the --json summary.
type crashSummary struct {
	Summary    bool          `json:"summary"`
	Cuts       int           `json:"cuts"`
	States     int           `json:"states"`
	Enumerated int           `json:"enumerated_cuts"`
	Sampled    int           `json:"sampled_cuts"`
	Failed     int           `json:"failed"`
	Minimal    *crash.Result `json:"minimal,omitempty"`
	Lost       []string      `json:"minimal_lost,omitempty"`
	Seconds    float64       `json:"seconds"`
}

// Run checks the states and exits 0 when all pass, 1 when one fails, 2 on
// bad input.
func (c *CrashCmd) Run(*Globals) error {
	code, err := c.run(os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dmfuse crash: %v\n", err)
		os.Exit(2)
	}
	os.Exit(code)
	return nil
}

func (c *CrashCmd) run(stdout, stderr io.Writer) (int, error) {
	start := time.Now()
	if c.Check == "" && c.Export == "" {
		return 0, fmt.Errorf("--check COMMAND is required (or --state ID --export FILE)")
	}
	if c.Export != "" && c.State == "" {
		return 0, fmt.Errorf("--export goes with --state")
	}
	o := crash.Options{Limit: c.States, Seed: c.Seed, Clean: c.Clean, Unit: c.Unit}
	var err error
	if o.Mode, err = crash.ParseMode(c.Mode); err != nil {
		return 0, err
	}
	if o.Fill, err = crash.ParseFill(c.Fill); err != nil {
		return 0, err
	}
	if c.Unit != 0 && (c.Unit < 512 || c.Unit&(c.Unit-1) != 0) {
		return 0, fmt.Errorf("--unit %d: want a power of two from 512", c.Unit)
	}
	var cuts crash.Cuts
	for _, a := range c.At {
		for _, v := range strings.Split(a, ",") {
			if err := cuts.ParseCut(v); err != nil {
				return 0, err
			}
		}
	}
	cuts.From = c.From
	logf, err := os.Open(c.Log)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	rec, err := crash.Scan(logf, logwrites.Size(logf))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.Log, err)
	}
	var image *os.File
	size := c.Size
	if c.Image != "" {
		if image, err = os.Open(c.Image); err != nil {
			return 0, err
		}
		defer image.Close()
		if size == 0 {
			size = logwrites.Size(image)
		}
	}
	if size <= 0 {
		size = int64(rec.Sectors) * rec.Unit
	}
	if size <= 0 {
		return 0, fmt.Errorf("%s: no write in the log, and no --size", c.Log)
	}
	work, err := crash.WorkDir(c.Workdir)
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(work)
	base, err := crash.NewBase(work+"/base", image, size, rec, logf)
	if err != nil {
		return 0, err
	}
	defer base.Close()

	if c.State != "" {
		return c.one(rec, logf, base, work, size, stdout)
	}
	entries, err := cuts.Entries(rec, o.Mode)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.Log, err)
	}
	if len(entries) == 0 {
		return 0, fmt.Errorf("%s: no cut point (--at %s) in the log", c.Log, strings.Join(c.At, ","))
	}
	srv, done, err := serveStates(work, base)
	if err != nil {
		return 0, err
	}
	defer done()
	jobs := c.Jobs
	if jobs <= 0 {
		jobs = runtime.NumCPU()
	}
	r := &crash.Run{Rec: rec, Log: logf, Base: base, Server: srv, Check: crash.Checker{Command: c.Check, Timeout: c.Timeout}, Options: o, Jobs: jobs}
	progress := isTerminal(stderr)
	sum := crashSummary{Summary: true}
	var (
		mu      sync.Mutex
		checked int
		failed  int
		cutNo   int
	)
	if progress {
		r.Done = func(res crash.Result) {
			mu.Lock()
			defer mu.Unlock()
			checked++
			if !res.OK {
				failed++
			}
			fmt.Fprintf(stderr, "\r\033[K%s cut %d/%d, %d states checked, %d failed", bar(cutNo, len(entries), 20), cutNo+1, len(entries), checked, failed)
		}
	}
	enc := json.NewEncoder(stdout)
	var (
		failedState  *crash.State
		failedResult crash.Result
	)
	for i, cut := range entries {
		mu.Lock()
		cutNo = i
		mu.Unlock()
		results, states, all, err := r.Cut(cut)
		if err != nil {
			return 0, err
		}
		sum.Cuts++
		sum.States += len(results)
		if all {
			sum.Enumerated++
		} else {
			sum.Sampled++
		}
		for k, res := range results {
			if res.OK {
				continue
			}
			sum.Failed++
			if c.JSON {
				enc.Encode(res)
			} else {
				if progress {
					fmt.Fprint(stderr, "\r\033[K")
				}
				fmt.Fprintf(stdout, "FAIL %s (cut at entry %d, exit %d, %.2fs)\n", res.ID, res.Cut, res.Status, res.Seconds)
				for _, l := range strings.Split(res.Output, "\n") {
					fmt.Fprintf(stdout, "    %s\n", l)
				}
			}
			if failedState == nil {
				st := states[k]
				failedState, failedResult = &st, res
			}
		}
		if failedState != nil && failedState.Cut == cut && !c.NoShrink && sum.Minimal == nil {
			st, res := r.Shrink(*failedState, failedResult)
			sum.Minimal, sum.Lost = &res, rec.Describe(st)
		}
	}
	if progress {
		fmt.Fprint(stderr, "\r\033[K")
	}
	sum.Seconds = time.Since(start).Seconds()
	if c.JSON {
		enc.Encode(sum)
	} else {
		how := fmt.Sprintf("%d cuts enumerated, %d sampled with seed %d", sum.Enumerated, sum.Sampled, c.Seed)
		if sum.Failed == 0 {
			fmt.Fprintf(stdout, "all %d states at %d cuts pass (%s mode; %s; %.1fs)\n", sum.States, sum.Cuts, c.Mode, how, sum.Seconds)
		} else {
			fmt.Fprintf(stdout, "%d of %d states at %d cuts failed (%s mode; %s; %.1fs)\n", sum.Failed, sum.States, sum.Cuts, c.Mode, how, sum.Seconds)
		}
		if sum.Minimal != nil {
			fmt.Fprintf(stdout, "minimal failing state: %s\n", sum.Minimal.ID)
			for _, l := range sum.Lost {
				fmt.Fprintf(stdout, "    %s\n", l)
			}
			if len(sum.Lost) == 0 {
				fmt.Fprintf(stdout, "    (it loses nothing: the check fails on the state with every write up to the cut)\n")
			}
			fmt.Fprintf(stdout, "rebuild it: dmfuse crash --log %s --state '%s' --check ... (or --export FILE)\n", c.Log, sum.Minimal.ID)
		}
	}
	if sum.Failed > 0 {
		return 1, nil
	}
	return 0, nil
}

// one checks or exports the single state --state names.
func (c *CrashCmd) one(rec *crash.Record, logf *os.File, base *crash.Base, work string, size int64, stdout io.Writer) (int, error) {
	st, err := rec.Parse(c.State)
	if err != nil {
		return 0, err
	}
	from, _ := rec.Span(st.Cut)
	if err := base.Advance(from); err != nil {
		return 0, err
	}
	if c.Export != "" {
		return 0, exportState(crash.NewOverlay(rec, st, base.File(), logf, size), c.Export)
	}
	srv, done, err := serveStates(work, base)
	if err != nil {
		return 0, err
	}
	defer done()
	r := &crash.Run{Rec: rec, Log: logf, Base: base, Server: srv, Check: crash.Checker{Command: c.Check, Timeout: c.Timeout}, Jobs: 1}
	res := r.CheckState(st)
	for _, l := range rec.Describe(st) {
		fmt.Fprintf(stdout, "lost: %s\n", l)
	}
	if res.OK {
		fmt.Fprintf(stdout, "state %s passes (%.2fs)\n", res.ID, res.Seconds)
		return 0, nil
	}
	fmt.Fprintf(stdout, "FAIL %s (cut at entry %d, exit %d, %.2fs)\n", res.ID, res.Cut, res.Status, res.Seconds)
	for _, l := range strings.Split(res.Output, "\n") {
		fmt.Fprintf(stdout, "    %s\n", l)
	}
	return 1, nil
}

// exportState writes the state's whole device to path.
func exportState(o *crash.Overlay, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, io.NewSectionReader(o, 0, o.Size())); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// serveStates mounts the folder of state files in work and returns it with
// the function that unmounts it. Until then SIGINT or SIGTERM kills the
// running checks, unmounts the folder, removes work and exits 130.
func serveStates(work string, base *crash.Base) (*crash.Server, func(), error) {
	srv, err := crash.Serve(crash.StatesDir(work))
	if err != nil {
		return nil, nil, err
	}
	stop := onInterrupt(func() {
		crash.KillChecks()
		srv.Close()
		base.Close()
		os.RemoveAll(work)
	})
	return srv, func() { stop(); srv.Close() }, nil
}

// onInterrupt runs cleanup and exits with 130 on SIGINT or SIGTERM, until
// the function it returns is called: an interrupted run leaves no mount,
// file or check behind.
func onInterrupt(cleanup func()) func() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			fmt.Fprintln(os.Stderr, "\ndmfuse crash: interrupted")
			cleanup()
			os.Exit(130)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

// bar draws a progress bar of width cells, done of total.
func bar(done, total, width int) string {
	n := 0
	if total > 0 {
		n = done * width / total
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
