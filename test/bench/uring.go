package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// The io_uring suites compare dmfuse's transports, each a dmfuse daemon of
// its own (a "config": a name, mount flags, optionally a git revision to
// build), mounted side by side over the same tmpfs file, in interleaved
// rounds.
var uringSuites = []string{"transports", "poll", "multipath", "delay", "idle", "floor"}

const defaultConfigs = "dev=--transport=dev;uring=--transport=uring;uring-poll=--transport=uring --poll=50us"

// config is one dmfuse daemon of the io_uring suites.
type config struct {
	name   string
	rev    string   // git revision it is built from ("": the working tree)
	commit string   // rev's commit
	args   []string // dmfuse mount flags
	env    []string // extra environment of the daemon (KEY=VALUE)

	bin   string
	mnt   string
	pid   int
	trans string // the daemon's own line about its transport
}

// parseConfigs reads "NAME[@REV]=FLAGS;..." (FLAGS space separated). Words
// of FLAGS before the first flag that look like KEY=VALUE with an upper-case
// KEY (GOMAXPROCS=4, GODEBUG=...) are the daemon's environment instead.
func parseConfigs(s string) ([]*config, error) {
	var out []*config
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, flags, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("config %q: want NAME[@REV]=FLAGS", part)
		}
		c := &config{args: strings.Fields(flags)}
		for len(c.args) > 0 && envWord.MatchString(c.args[0]) {
			c.env, c.args = append(c.env, c.args[0]), c.args[1:]
		}
		c.name, c.rev, _ = strings.Cut(strings.TrimSpace(name), "@")
		if c.name == "" || c.name == "loop" || strings.ContainsAny(c.name, "/ ") {
			return nil, fmt.Errorf("config %q: a name, not loop, without / or spaces", part)
		}
		if slices.ContainsFunc(out, func(o *config) bool { return o.name == c.name }) {
			return nil, fmt.Errorf("config %q: name used twice", c.name)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no configs")
	}
	return out, nil
}

// envWord is an environment word of a config's FLAGS.
var envWord = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// ubench is one run of the io_uring suites: settings, what it set up, and
// the report so far.
type ubench struct {
	suites       []string
	rounds       int
	runtime      time.Duration // of every run but the delay rows
	delayRuntime time.Duration // of the delay rows
	idle         time.Duration
	size         int64
	mpDelay      string // ms
	thinBlocks   int64  // data blocks of the thin suite's RSS pool
	configs      []*config
	jobs         []job // of the transports suite

	undo     benchkit.Undo
	scratch  string
	lin      string  // the tmpfs file every device is over
	loop     string  // the loop device over it
	peers    []*peer // the peers suite's other servers
	kinds    []backingKind
	kindList string // -kinds
	w        strings.Builder
}

func (b *ubench) has(suite string) bool { return slices.Contains(b.suites, suite) }

func (b *ubench) ramp(rt time.Duration) time.Duration { return rt / 4 }

// parseSuites reads -suite for the io_uring suites ("uring": all of them).
func parseSuites(s string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(s, ",") {
		add := []string{n}
		if n == "uring" {
			add = uringSuites
		} else if !slices.Contains(uringSuites, n) && n != "thin" && n != "peers" && n != "backing" {
			return nil, fmt.Errorf("unknown suite %q (have devices, uring or a list of %s,thin,peers,backing)", n, strings.Join(uringSuites, ","))
		}
		for _, a := range add {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

func (b *ubench) run(ctx context.Context) (string, error) {
	if err := check(b.needsLoop()); err != nil {
		return "", err
	}
	if err := b.setup(ctx); err != nil {
		return "", err
	}
	host, _ := os.Hostname()
	fmt.Fprintf(&b.w, "fio %s, %d CPUs, kernel %s, %s; %d rounds, %v per run (+%v ramp), delay rows %v (+%v ramp); load average at the start: %s\n\n",
		benchkit.FioVersion(), runtime.NumCPU(), benchkit.Kernel(), host, b.rounds, b.runtime, b.ramp(b.runtime),
		b.delayRuntime, b.ramp(b.delayRuntime), benchkit.Loadavg())
	args := make([]string, len(os.Args)-1)
	for i, a := range os.Args[1:] {
		args[i] = a
		if strings.ContainsAny(a, " ;|&$'\"") {
			args[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	fmt.Fprintf(&b.w, "`go run ./test/bench %s`\n\n", strings.Join(args, " "))
	for _, c := range b.configs {
		src := "the working tree"
		if c.rev != "" {
			src = fmt.Sprintf("git revision %s (%s)", c.rev, c.commit)
		}
		fmt.Fprintf(&b.w, "* %s: dmfuse of %s, `%smount %s`: %s\n", c.name, src, strings.Join(append(c.env, ""), " "), strings.Join(c.args, " "), c.trans)
	}
	if b.loop != "" {
		fmt.Fprintf(&b.w, "* loop: the kernel's loop device with direct I/O (`losetup --direct-io=on`) over the same tmpfs file\n")
	}
	if b.has("peers") {
		fmt.Fprintf(&b.w, "* peers: %s; %s; %s\n", peerVersion("qemu-storage-daemon", "--version"), peerVersion("nbdkit", "--version"), peerVersion("nbdfuse", "--version"))
	}
	fmt.Fprintln(&b.w)
	start := time.Now()
	for _, s := range b.suites {
		var err error
		switch s {
		case "transports":
			err = b.transports(ctx)
		case "poll":
			err = b.poll(ctx)
		case "multipath":
			err = b.multipath(ctx)
		case "delay":
			err = b.delay(ctx)
		case "idle":
			err = b.idleCPU(ctx)
		case "floor":
			err = b.floor(ctx)
		case "thin":
			err = b.thin(ctx)
		case "peers":
			err = b.peersSuite(ctx)
		case "backing":
			err = b.backing(ctx)
		}
		if err != nil {
			return "", err
		}
	}
	fmt.Fprintf(&b.w, "Took %v; load average at the end: %s.\n", time.Since(start).Round(time.Second), benchkit.Loadavg())
	return b.w.String(), nil
}

// setup builds the daemons, mounts the tmpfs and the daemons, and attaches
// the loop device.
func (b *ubench) setup(ctx context.Context) error {
	scratch, modDir, err := benchkit.Scratch(&b.undo, "dmfuse-bench")
	if err != nil {
		return err
	}
	b.scratch = scratch
	built := map[string]*config{} // revision -> the first config built from it
	for _, c := range b.configs {
		if o, ok := built[c.rev]; ok {
			c.bin, c.commit = o.bin, o.commit
			continue
		}
		c.bin = filepath.Join(b.scratch, "dmfuse-"+c.name)
		if c.rev == "" {
			logf("building dmfuse")
			err = benchkit.Build(ctx, modDir, c.bin, "./cmd/dmfuse")
		} else {
			out, gerr := exec.CommandContext(ctx, "git", "-C", modDir, "rev-parse", "--short", c.rev+"^{commit}").Output()
			if gerr != nil {
				return fmt.Errorf("config %s: git rev-parse %s: %w", c.name, c.rev, gerr)
			}
			c.commit = strings.TrimSpace(string(out))
			logf("building dmfuse as of %s (%s)", c.rev, c.commit)
			err = benchkit.BuildRev(ctx, modDir, c.rev, filepath.Join(b.scratch, "src-"+c.name), c.bin, "./cmd/dmfuse")
		}
		if err != nil {
			return err
		}
		built[c.rev] = c
	}

	tmpfs := filepath.Join(b.scratch, "tmpfs")
	files := int64(1)
	if b.has("backing") {
		files += int64(len(b.configs)) + 1 // the block devices' files
	}
	if err := benchkit.MountTmpfs(&b.undo, tmpfs, files*b.size+64<<20); err != nil {
		return err
	}
	b.lin = filepath.Join(tmpfs, "lin.img")
	// Random data: tmpfs reads holes without touching a page.
	if err := benchkit.Fill(b.lin, b.size); err != nil {
		return err
	}
	if b.has("backing") {
		if err := b.backingSetup(ctx, tmpfs); err != nil {
			return err
		}
	}

	// Connections keep the transport they negotiated: the module
	// parameter is on only while the daemons mount.
	restore, err := benchkit.EnableURing()
	if err != nil {
		return err
	}
	b.undo.Push(restore)
	for _, c := range b.configs {
		c.mnt = filepath.Join(b.scratch, "mnt-"+c.name)
		cfgPath := filepath.Join(b.scratch, c.name+".conf")
		if err := os.WriteFile(cfgPath, []byte(b.table(c)), 0o644); err != nil {
			return err
		}
		argv := append([]string{c.bin, "mount", "--config", cfgPath, "--control", filepath.Join(b.scratch, c.name+".sock")}, c.args...)
		env := append([]string{"XDG_STATE_HOME=" + filepath.Join(b.scratch, "state-"+c.name)}, c.env...)
		srv, err := benchkit.StartMounted(ctx, &b.undo, "dmfuse "+c.name, c.mnt, benchkit.FileReady(filepath.Join(c.mnt, "linear")), env, append(argv, c.mnt)...)
		if err != nil {
			return fmt.Errorf("config %s: %w", c.name, err)
		}
		if err := srv.WaitServing(ctx); err != nil {
			return fmt.Errorf("config %s: %w", c.name, err)
		}
		c.pid, c.trans = srv.Pid, benchkit.ServerLine(srv, "transport")
		logf("%s: pid %d, %s", c.name, c.pid, c.trans)
	}
	restore()

	if b.needsLoop() {
		if b.loop, err = benchkit.AttachLoop(ctx, &b.undo, b.lin); err != nil {
			return err
		}
	}
	if b.has("peers") {
		return b.startPeers(ctx)
	}
	return nil
}

// needsLoop says whether a chosen suite measures the loop device.
func (b *ubench) needsLoop() bool {
	return b.has("transports") || b.has("floor") || b.has("peers") || b.has("backing")
}

// table returns the devices config c mounts, all over the one tmpfs file
// but the backing suite's: what the chosen suites need.
func (b *ubench) table(c *config) string {
	sec := b.size / 512
	lines := []string{fmt.Sprintf("linear,,,rw,0 %d linear %s 0", sec, b.lin)}
	if b.has("multipath") {
		lines = append(lines, fmt.Sprintf("f1,,,rw,0 %d linear %s 0", sec, b.lin))
		for _, s := range []string{"s1", "s2", "s3"} {
			lines = append(lines, fmt.Sprintf("%s,,,rw,0 %d delay %s 0 %s", s, sec, b.lin, b.mpDelay))
		}
		lines = append(lines,
			fmt.Sprintf("hst,,,rw,0 %d multipath 0 0 1 1 historical-service-time 0 4 1 f1 1 s1 1 s2 1 s3 1", sec),
			fmt.Sprintf("fast,,,rw,0 %d multipath 0 0 1 1 round-robin 0 1 1 f1 1", sec))
	}
	if b.has("floor") || b.has("backing") {
		lines = append(lines, fmt.Sprintf("zero,,,rw,0 %d zero", sec))
	}
	lines = append(lines, b.backingTable(c)...)
	if b.has("delay") {
		for _, d := range []string{"0", "1", "10"} {
			lines = append(lines, fmt.Sprintf("d%s,,,rw,0 %d delay %s 0 %s", d, sec, b.lin, d))
		}
	} else if b.has("peers") {
		lines = append(lines, fmt.Sprintf("d1,,,rw,0 %d delay %s 0 1", sec, b.lin))
	}
	return strings.Join(lines, ";\n") + "\n"
}

// urun is one fio run's result.
type urun struct {
	iops, mbps    float64
	meanUs, p99Us float64 // submission to completion
	p50Us         float64
	clatUs        float64 // mean completion latency
	cpu, machine  float64 // cores: the daemon's, and the whole machine's busy
	switches      float64 // the whole machine's context switches per second
}

// value is what job j compares: IOPS, or MB/s for the 1 MiB jobs.
func (j job) value(r urun) float64 {
	if j.bw {
		return r.mbps
	}
	return r.iops
}

// fio runs j on the device file dev of config c (nil: not a daemon, such
// as the loop device) for rt after a ramp, with the daemon's and the
// machine's CPU measured over the middle of the run.
func (b *ubench) fio(ctx context.Context, j job, c *config, dev string, rt time.Duration, extra ...string) (urun, error) {
	pid := 0
	if c != nil {
		pid = c.pid
	}
	return b.fioPid(ctx, j, pid, dev, rt, extra...)
}

// fioPid is fio with the serving process's CPU measured from pid (0: none).
func (b *ubench) fioPid(ctx context.Context, j job, pid int, dev string, rt time.Duration, extra ...string) (urun, error) {
	ramp := b.ramp(rt)
	args := append(benchkit.FioArgs(j.name, dev, rt, ramp, b.size), "--lat_percentiles=1")
	args = append(append(args, j.args...), extra...)
	// The window leaves out fio's start, the ramp and the end.
	from, to := ramp+rt/10, ramp+rt*9/10
	cpu := benchkit.CPUWindow(ctx, pid, from, to)
	r, err := benchkit.RunFio(ctx, b.scratch, args...)
	if err != nil {
		return urun{}, err
	}
	d := r.Read
	if j.write {
		d = r.Write
	}
	res := urun{iops: d.IOPS, mbps: d.BWBytes / 1e6, meanUs: d.Lat.Mean / 1e3, p99Us: d.Lat.Percentile["99.000000"] / 1e3,
		p50Us:  d.Lat.Percentile["50.000000"] / 1e3,
		clatUs: d.Clat.Mean / 1e3}
	u := cpu()
	res.cpu, res.machine, res.switches = u.Proc, u.Machine, u.Switches
	return res, nil
}

// dev returns the path of device name of config c.
func (c *config) dev(name string) string { return filepath.Join(c.mnt, name) }

// rotate returns the n targets in the order of round r: each round starts
// one further, so that no target always runs first or after the same one.
func rotate[T any](v []T, r int) []T {
	if len(v) == 0 {
		return nil
	}
	k := r % len(v)
	return append(slices.Clone(v[k:]), v[:k]...)
}

// ratioCell renders the median and range of per-round ratios.
func ratioCell(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("**%.2f** (%.2f-%.2f)", benchkit.Median(v), slices.Min(v), slices.Max(v))
}

func pctCell(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("**%.1f%%** (%.1f-%.1f)", 100*benchkit.Median(v), 100*slices.Min(v), 100*slices.Max(v))
}

// medOf returns the median of f over rs.
func medOf[T any](rs []T, f func(T) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return benchkit.Median(v)
}

// perRound returns the per-round ratios f(a[i]) / f(b[i]) of two targets'
// runs in the same rounds.
func perRound(a, b []urun, f func(urun) float64) []float64 {
	v := make([]float64, len(a))
	for i, x := range a {
		v[i] = f(x) / f(b[i])
	}
	return v
}
