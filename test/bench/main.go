// Command bench measures dmfuse devices against the FUSE floor, or dmfuse's
// transports against each other and the kernel's loop device, with fio, side
// by side in one run.
//
//	go run ./test/bench [-devices LIST] [-jobs LIST] [-pairs N] [-runtime D] [-out FILE]
//
// dmfuse runs with --transport=dev by default, the transport of the baseline
// (go-fuse reading /dev/fuse); -transport=uring measures FUSE over io_uring
// against the same baseline.
//
// It needs root, /dev/fuse, fio and losetup; it installs nothing. It builds
// dmfuse and the baseline server (test/bench/baseline), mounts a private
// tmpfs with the backing files, mounts dmfuse on it with these devices:
//
//	zero     0 S zero
//	linear   0 S linear TMPFS/lin.img 0
//	striped  0 S striped 2 128 TMPFS/s0.img 0 TMPFS/s1.img 0
//	stack3   linear over linear over linear over TMPFS/lin.img
//	delay0   0 S delay TMPFS/lin.img 0 0
//
// and mounts the baseline on TMPFS/lin.img, the file the linear device uses.
// For scale it also measures that tmpfs file itself ("tmpfs") and a loop
// device with direct I/O over it ("loop").
//
// Every job runs on the baseline and on each device in interleaved pairs
// (baseline, device, baseline, device, ...). The table shows the medians over
// the pairs of IOPS, bandwidth, mean and 99th percentile latency, and the
// median of the per-pair ratios device/baseline (IOPS, or bandwidth for the
// 1 MiB jobs). It is printed and written to -out.
//
// With -ref REV it also builds dmfuse as of git revision REV (from `git
// archive`, with the module cache), mounts it beside with the same devices
// (and -ref-args), and runs each dmfuse device's job on it next to the
// current build's, the two taking turns at going first: NAME@ref rows, and a
// column with the median of the per-pair ratios current/ref, to compare a
// change against the code before it in one run.
//
// # The io_uring suites
//
//	go run ./test/bench -suite uring|transports,poll,multipath,delay,idle,floor,thin,peers,backing [-configs LIST] [-rounds N] [-runtime D] [-delay-runtime D] [-idle D] [-thin-blocks N]
//
// compare dmfuse's transports instead. Each config of -configs
// (NAME[@REV]=FLAGS, separated by ';'; by default dev, uring and uring-poll:
// --transport=dev, --transport=uring, --transport=uring --poll=50us) is a
// dmfuse daemon of its own, built from the working tree or from git revision
// REV, mounted with FLAGS beside the others over the same tmpfs file (the
// fuse module's enable_uring is on while they mount, then put back); leading
// KEY=VALUE words of FLAGS, such as GOMAXPROCS=4, are its environment. Every
// run is repeated in -rounds interleaved rounds, each round starting with the
// next daemon; the tables give medians and the median (min-max) of the
// per-round ratios, the first config being the reference. The suites:
//
//   - transports: each -jobs job on each daemon's linear device and on a loop
//     device with direct I/O over the same file; ratios to the first config
//     and to the loop device; latency, daemon CPU (utime+stime of
//     /proc/PID/stat over the middle of the run) and CPU per 1k IOPS.
//   - poll: 4k randread psync QD1 limited to 1k, 5k and 20k requests a
//     second (daemon CPU, p50 and p99 latency), and QD1 and 2x32 randread
//     while a CPU-bound process runs on every CPU (IOPS against the config
//     named uring-0, meant to be --transport=uring --poll=0; the config
//     named uring is held to the goals).
//   - multipath: 4k randread libaio 2x16 on historical-service-time over one
//     fast path (linear) and three delayed ones (-mp-delay ms), on multipath
//     over the fast path alone, and on the fast path itself.
//   - delay: 4k QD1 reads and writes on 1 ms and 10 ms delay devices, each
//     after the same job on a zero-delay device with fio --thinktime equal to
//     the delay, whose mean completion latency gives the ceiling
//     1 / (delay + that latency); and 2x32 writes on 10 ms against 64 / delay.
//   - idle: per daemon, a QD1 load, then its CPU while no I/O runs for -idle.
//   - floor: what this machine charges for the parts of a QD1 round trip
//     that no FUSE daemon can leave out (system calls, switches between
//     processes, the backing read; see floor.go), the QD1 ceiling they
//     allow, and QD1 on the loop device and each daemon's zero device.
//   - peers (not part of uring): each -jobs job of 4k at QD1 and 2x32 on
//     each daemon's linear device against qemu-storage-daemon's FUSE export,
//     nbdkit's file plugin through nbdfuse and the loop device, all over the
//     same file, and 4k QD1 reads and writes on each daemon's 1 ms delay
//     device against nbdkit's delay filter; it installs the peers from
//     Debian's packages when they are missing (see peers.go).
//   - backing (not part of uring): the 4k -jobs jobs on each daemon's
//     linear device over four kinds of backing (the tmpfs file, a cached
//     ext4 file in the scratch folder, the same file with its page cache
//     dropped, a loop block device), against the loop device over the same
//     backing and the daemon's zero device; see backing.go.
//   - thin (not part of uring; on the first config only): a provisioned
//     thin volume against a linear device over the same data file, first
//     writes with and without block zeroing and writes that break sharing
//     after a snapshot, randwrite with --fsync=1, and the daemon's RSS with
//     a pool of -thin-blocks mapped blocks; see thin.go.
//
// Everything it set up (fio, loop device, mounts, daemons, tmpfs, scratch
// folder) is torn down on exit, on error and on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// job is one fio workload.
type job struct {
	name  string
	title string
	args  []string
	write bool
	bw    bool    // compare bandwidth, not IOPS
	notes float64 // the baseline's reference figure, measured on an earlier host (IOPS or MB/s); 0 if none
}

var allJobs = []job{
	{name: "randread", title: "4k randread psync QD1", write: false, notes: 18.5e3,
		args: []string{"--rw=randread", "--bs=4k", "--ioengine=psync", "--iodepth=1", "--numjobs=1"}},
	{name: "randwrite", title: "4k randwrite psync QD1", write: true, notes: 20.6e3,
		args: []string{"--rw=randwrite", "--bs=4k", "--ioengine=psync", "--iodepth=1", "--numjobs=1"}},
	{name: "uring-randread", title: "4k randread io_uring 2x32", write: false, notes: 58e3,
		args: []string{"--rw=randread", "--bs=4k", "--ioengine=io_uring", "--iodepth=32", "--numjobs=2"}},
	{name: "uring-randwrite", title: "4k randwrite io_uring 2x32", write: true, notes: 88e3,
		args: []string{"--rw=randwrite", "--bs=4k", "--ioengine=io_uring", "--iodepth=32", "--numjobs=2"}},
	{name: "seqread", title: "1 MiB read io_uring QD4", write: false, bw: true, notes: 5900,
		args: []string{"--rw=read", "--bs=1M", "--ioengine=io_uring", "--iodepth=4", "--numjobs=1"}},
	{name: "seqwrite", title: "1 MiB write io_uring QD4", write: true, bw: true,
		args: []string{"--rw=write", "--bs=1M", "--ioengine=io_uring", "--iodepth=4", "--numjobs=1"}},
}

// Reference figures for the raw tmpfs file, measured on the same earlier host
// as the baseline's, to tell a slow machine from a slow baseline.
var notesTmpfs = map[string]float64{"randread": 487e3, "randwrite": 453e3, "uring-randread": 605e3, "uring-randwrite": 414e3, "seqread": 8400}

var allDevices = []string{"zero", "linear", "striped", "stack3", "delay0", "tmpfs", "loop"}

// sample is one fio run's result.
type sample struct {
	iops, mbps, meanUs, p99Us float64
}

func main() {
	floorPeer()
	var (
		suite   = flag.String("suite", "devices", "what to measure: devices (against the baseline), or the io_uring suites: uring (all of them) or a list of transports,poll,multipath,delay,idle,floor,thin,peers,backing")
		devices = flag.String("devices", strings.Join(allDevices, ","), "devices to measure against the baseline")
		jobs    = flag.String("jobs", jobNames(), "fio jobs to run (devices and transports suites)")
		pairs   = flag.Int("pairs", 5, "interleaved (baseline, device) pairs per job and device")
		rt      = flag.Duration("runtime", 2*time.Second, "fio runtime of one run, after a ramp of a quarter of it")
		size    = flag.Int64("size", 512, "size of each device and backing file, MiB")
		out     = flag.String("out", "bench.md", "file to write the markdown table to")
		transp  = flag.String("transport", "dev", "dmfuse --transport: dev is the baseline's transport (go-fuse reading /dev/fuse); \"\" passes none")
		env     = flag.String("daemon-env", "", "extra environment of the dmfuse daemon, e.g. GOMAXPROCS=4 (comma separated)")
		xarg    = flag.String("daemon-args", "", "extra dmfuse mount flags, space separated, e.g. --uring-depth=64")
		hold    = flag.Bool("hold", false, "after setting up, print the mounts and wait for SIGINT (for profiling by hand)")
		ref     = flag.String("ref", "", "git revision of dmfuse to compare against, run after each dmfuse device (NAME@ref)")
		refArgs = flag.String("ref-args", "", "extra mount flags of the -ref daemon, space separated")

		rounds  = flag.Int("rounds", 5, "io_uring suites: interleaved rounds")
		configs = flag.String("configs", defaultConfigs, "io_uring suites: the dmfuse daemons, NAME[@REV]=FLAGS separated by ';' (REV: a git revision to build; the first is the reference of the ratios)")
		delayRt = flag.Duration("delay-runtime", 3*time.Second, "io_uring suites: fio runtime of each delay row, after a ramp of a quarter of it")
		idle    = flag.Duration("idle", 10*time.Second, "io_uring suites: how long to measure each idle daemon's CPU")
		mpDelay = flag.Float64("mp-delay", 2, "io_uring suites: delay of multipath's slow paths, ms")
		kinds   = flag.String("kinds", "tmpfs,ext4,ext4-nocache,block", "backing suite: the kinds of backing to measure")
		thinBlk = flag.Int64("thin-blocks", 1<<20, "thin suite: 64 KiB blocks of the pool whose daemon RSS is measured, each written once")
	)
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run ./test/bench [flags]\n\nNeeds root, /dev/fuse, fio and losetup (util-linux).\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	js, err := pick(*jobs, allJobs)
	if err == nil && (*pairs < 1 || *rounds < 1) {
		err = errors.New("-pairs and -rounds must be at least 1")
	}
	if err == nil && *idle < 2*time.Second {
		err = errors.New("-idle must be at least 2s (its first second is reported apart)")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := benchkit.SignalContext("bench")
	defer stop()
	if *suite != "devices" {
		ub := &ubench{rounds: *rounds, runtime: *rt, delayRuntime: *delayRt, idle: *idle, size: *size << 20,
			mpDelay: strconv.FormatFloat(*mpDelay, 'f', -1, 64), jobs: js, thinBlocks: *thinBlk, kindList: *kinds}
		if ub.suites, err = parseSuites(*suite); err == nil {
			ub.configs, err = parseConfigs(*configs)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		report, err := ub.run(ctx)
		ub.undo.Run()
		if err == nil {
			fmt.Print(report)
			err = os.WriteFile(*out, []byte(report), 0o644)
		}
		exit(ctx, err)
		logf("wrote %s", *out)
		return
	}
	b := &bench{pairs: *pairs, runtime: *rt, size: *size << 20, out: *out, hold: *hold, transport: *transp, daemonArgs: strings.Fields(*xarg),
		ref: *ref, refArgs: strings.Fields(*refArgs), jobs: js}
	if *env != "" {
		b.daemonEnv = strings.Split(*env, ",")
	}
	if b.devices, err = pickDevices(*devices); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	err = b.run(ctx)
	b.undo.Run()
	exit(ctx, err)
}

// exit exits 1 after saying why if err is not nil (the signal, if ctx was
// cancelled by one).
func exit(ctx context.Context, err error) {
	if err == nil {
		return
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// jobNamed returns the job called name.
func jobNamed(name string) job {
	i := slices.IndexFunc(allJobs, func(j job) bool { return j.name == name })
	return allJobs[i]
}

func jobNames() string {
	var s []string
	for _, j := range allJobs {
		s = append(s, j.name)
	}
	return strings.Join(s, ",")
}

func pick(list string, from []job) ([]job, error) {
	var out []job
	for _, n := range strings.Split(list, ",") {
		i := slices.IndexFunc(from, func(j job) bool { return j.name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown job %q (have %s)", n, jobNames())
		}
		out = append(out, from[i])
	}
	return out, nil
}

func pickDevices(list string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(list, ",") {
		if n == "" {
			continue
		}
		if !slices.Contains(allDevices, n) {
			return nil, fmt.Errorf("unknown device %q (have %s)", n, strings.Join(allDevices, ","))
		}
		out = append(out, n)
	}
	return out, nil
}

// bench is one run: its settings and everything it has set up.
type bench struct {
	pairs     int
	runtime   time.Duration
	size      int64
	out       string
	hold      bool
	ref       string   // git revision to compare against ("": none)
	refArgs   []string // its extra mount flags
	transport string
	// daemonArgs are more dmfuse mount flags.
	daemonArgs []string
	daemonEnv  []string
	jobs       []job
	devices    []string

	scratch   string
	tmpfs     string
	undo      benchkit.Undo
	paths     map[string]string
	dmfusePID int
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...) }

func (b *bench) run(ctx context.Context) error {
	if err := check(slices.Contains(b.devices, "loop")); err != nil {
		return err
	}
	if err := b.setup(ctx); err != nil {
		return err
	}
	if b.hold {
		logf("holding; dmfuse pid %d; paths:", b.dmfusePID)
		for _, k := range append([]string{"baseline"}, b.devices...) {
			logf("  %-8s %s", k, b.paths[k])
		}
		<-ctx.Done()
		return nil
	}
	res := map[string]map[string][]sample{} // job -> device -> samples
	ratios := map[string]map[string][]float64{}
	refs := map[string]map[string][]float64{} // job -> device -> current/ref per pair
	runs := len(b.jobs) * len(b.devices) * b.pairs * 2
	if b.ref != "" {
		runs += len(b.jobs) * len(b.refDevices()) * b.pairs
	}
	logf("%d fio runs of %v (+%v ramp): about %v", runs, b.runtime, b.ramp(), time.Duration(runs)*(b.runtime+b.ramp()+300*time.Millisecond).Round(time.Second))
	start := time.Now()
	for _, j := range b.jobs {
		res[j.name], ratios[j.name], refs[j.name] = map[string][]sample{}, map[string][]float64{}, map[string][]float64{}
		for p := 0; p < b.pairs; p++ {
			for _, d := range b.devices {
				base, err := b.fio(ctx, j, "baseline")
				if err != nil {
					return err
				}
				// With -ref, the two builds take turns at running
				// first, so that neither gains from its place.
				order := []string{d}
				if b.ref != "" && isDmfuse(d) {
					order = []string{d, d + "@ref"}
					if p%2 == 1 {
						order = []string{d + "@ref", d}
					}
				}
				got := map[string]sample{}
				for _, name := range order {
					if got[name], err = b.fio(ctx, j, name); err != nil {
						return err
					}
					res[j.name][name] = append(res[j.name][name], got[name])
					ratios[j.name][name] = append(ratios[j.name][name], ratio(j, got[name], base))
				}
				res[j.name]["baseline"] = append(res[j.name]["baseline"], base)
				if len(order) == 2 {
					refs[j.name][d] = append(refs[j.name][d], ratio(j, got[d], got[d+"@ref"]))
				}
			}
			logf("%s: pair %d/%d done (%v)", j.name, p+1, b.pairs, time.Since(start).Round(time.Second))
		}
	}
	report := b.report(res, ratios, refs, time.Since(start))
	fmt.Print(report)
	if err := os.WriteFile(b.out, []byte(report), 0o644); err != nil {
		return err
	}
	logf("wrote %s", b.out)
	return nil
}

// check fails early, saying what is missing; loop asks for losetup.
func check(loop bool) error {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root (for mounts and loop devices)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		miss = append(miss, "/dev/fuse")
	}
	need := []string{"fio", "go"}
	if loop {
		need = append(need, "losetup")
	}
	for _, t := range need {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, t+" (e.g. apt-get install -y fio)")
		}
	}
	if len(miss) > 0 {
		return fmt.Errorf("missing: %s", strings.Join(miss, ", "))
	}
	return nil
}

func (b *bench) ramp() time.Duration { return b.runtime / 4 }

// setup builds the binaries, mounts the tmpfs and both file systems and
// attaches the loop device.
func (b *bench) setup(ctx context.Context) error {
	scratch, modDir, err := benchkit.Scratch(&b.undo, "dmfuse-bench")
	if err != nil {
		return err
	}
	b.scratch = scratch
	logf("building dmfuse and the baseline in %s", b.scratch)
	for _, p := range [][2]string{{"dmfuse", "./cmd/dmfuse"}, {"baseline", "./test/bench/baseline"}} {
		if err := benchkit.Build(ctx, modDir, filepath.Join(b.scratch, p[0]), p[1]); err != nil {
			return err
		}
	}

	// A private tmpfs: one unmount removes every backing file.
	b.tmpfs = filepath.Join(b.scratch, "tmpfs")
	if err := benchkit.MountTmpfs(&b.undo, b.tmpfs, 3*b.size+64<<20); err != nil {
		return err
	}
	lin, s0, s1 := filepath.Join(b.tmpfs, "lin.img"), filepath.Join(b.tmpfs, "s0.img"), filepath.Join(b.tmpfs, "s1.img")
	// Filled with data: tmpfs reads holes without touching a page, which
	// would flatter every read.
	for _, f := range []struct {
		path string
		size int64
	}{{lin, b.size}, {s0, b.size / 2}, {s1, b.size / 2}} {
		if err := benchkit.Fill(f.path, f.size); err != nil {
			return err
		}
	}

	sec := b.size / 512
	cfg := strings.Join([]string{
		fmt.Sprintf("zero,,,rw,0 %d zero", sec),
		fmt.Sprintf("linear,,,rw,0 %d linear %s 0", sec, lin),
		fmt.Sprintf("striped,,,rw,0 %d striped 2 128 %s 0 %s 0", sec, s0, s1),
		fmt.Sprintf("deep1,,,rw,0 %d linear %s 0", sec, lin),
		fmt.Sprintf("deep2,,,rw,0 %d linear deep1 0", sec),
		fmt.Sprintf("stack3,,,rw,0 %d linear deep2 0", sec),
		fmt.Sprintf("delay0,,,rw,0 %d delay %s 0 0", sec, lin),
	}, ";\n") + "\n"
	cfgPath := filepath.Join(b.scratch, "bench.conf")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}

	dm, base := filepath.Join(b.scratch, "dm"), filepath.Join(b.scratch, "base")
	argv := []string{filepath.Join(b.scratch, "dmfuse"), "mount", "--config", cfgPath}
	if b.transport != "" {
		argv = append(argv, "--transport="+b.transport)
	}
	argv = append(argv, b.daemonArgs...)
	pid, err := b.daemon(ctx, "dmfuse", dm, filepath.Join(dm, "linear"), b.daemonEnv, append(argv, dm)...)
	if err != nil {
		return err
	}
	b.dmfusePID = pid
	if err := os.Mkdir(base, 0o755); err != nil {
		return err
	}
	if _, err := b.daemon(ctx, "baseline", base, filepath.Join(base, "file"), nil,
		filepath.Join(b.scratch, "baseline"), lin, base); err != nil {
		return err
	}

	b.paths = map[string]string{"baseline": filepath.Join(base, "file"), "tmpfs": lin}
	for _, d := range dmfuseDevices {
		b.paths[d] = filepath.Join(dm, d)
	}
	if b.ref != "" {
		if err := b.setupRef(ctx, modDir, cfgPath); err != nil {
			return err
		}
	}
	if slices.Contains(b.devices, "loop") {
		if b.paths["loop"], err = benchkit.AttachLoop(ctx, &b.undo, lin); err != nil {
			return err
		}
	}
	return nil
}

// daemon starts a FUSE server (benchkit.StartMounted), stops it at
// cleanup, and waits until ready exists and is not empty; it returns the
// server's pid.
func (b *bench) daemon(ctx context.Context, name, mnt, ready string, env []string, argv ...string) (int, error) {
	srv, err := benchkit.StartMounted(ctx, &b.undo, name, mnt, benchkit.FileReady(ready), env, argv...)
	if err != nil {
		return 0, err
	}
	return srv.Pid, nil
}

// fio runs job j on device d once.
func (b *bench) fio(ctx context.Context, j job, d string) (sample, error) {
	args := append(benchkit.FioArgs(j.name, b.paths[d], b.runtime, b.ramp(), b.size), "--lat_percentiles=1")
	r, err := benchkit.RunFio(ctx, "", append(args, j.args...)...)
	if err != nil {
		return sample{}, fmt.Errorf("%s on %s: %w", j.name, d, err)
	}
	dir := r.Read
	if j.write {
		dir = r.Write
	}
	return sample{iops: dir.IOPS, mbps: dir.BWBytes / 1e6, meanUs: dir.Lat.Mean / 1e3, p99Us: dir.Lat.Percentile["99.000000"] / 1e3}, nil
}

// report renders the results as markdown.
func (b *bench) report(res map[string]map[string][]sample, ratios, refs map[string]map[string][]float64, took time.Duration) string {
	var w strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&w, "fio %s, %d CPUs, kernel %s, %s; dmfuse transport %q %q; %d pairs x %v per job (+%v ramp), took %v; load average at the end: %s\n\n",
		benchkit.FioVersion(), runtime.NumCPU(), benchkit.Kernel(), host, b.transport, b.daemonArgs, b.pairs, b.runtime, b.ramp(), took.Round(time.Second), benchkit.Loadavg())
	if b.ref != "" {
		fmt.Fprintf(&w, "NAME@ref is dmfuse as of %s (mount flags %q); \"vs @ref\" is the median (min-max) of the per-pair ratios NAME / NAME@ref.\n\n", b.ref, b.refArgs)
		fmt.Fprintf(&w, "| job | device | IOPS | MB/s | mean lat | p99 lat | ratio (min-max) | vs @ref |\n|---|---|---:|---:|---:|---:|---|---|\n")
	} else {
		fmt.Fprintf(&w, "| job | device | IOPS | MB/s | mean lat | p99 lat | ratio (min-max) |\n|---|---|---:|---:|---:|---:|---|\n")
	}
	var notes []string
	for _, j := range b.jobs {
		rows := []string{"baseline"}
		for _, d := range b.devices {
			rows = append(rows, d)
			if b.ref != "" && isDmfuse(d) {
				rows = append(rows, d+"@ref")
			}
		}
		for _, d := range rows {
			ss := res[j.name][d]
			if len(ss) == 0 {
				continue
			}
			ratio := "1"
			if d != "baseline" {
				r := ratios[j.name][d]
				ratio = fmt.Sprintf("**%.2f** (%.2f-%.2f)", benchkit.Median(r), slices.Min(r), slices.Max(r))
			}
			vsRef := ""
			if b.ref != "" {
				vsRef = " |"
				if r := refs[j.name][d]; len(r) > 0 {
					vsRef = fmt.Sprintf(" **%.3f** (%.2f-%.2f) |", benchkit.Median(r), slices.Min(r), slices.Max(r))
				}
			}
			fmt.Fprintf(&w, "| %s | %s | %s | %.0f | %s | %s | %s |%s\n", j.title, d,
				kilo(med(ss, func(s sample) float64 { return s.iops })),
				med(ss, func(s sample) float64 { return s.mbps }),
				us(med(ss, func(s sample) float64 { return s.meanUs })),
				us(med(ss, func(s sample) float64 { return s.p99Us })), ratio, vsRef)
		}
		if n := b.checkBaseline(j, res[j.name]); n != "" {
			notes = append(notes, n)
		}
	}
	fmt.Fprintf(&w, "\nBaseline against the platform notes (\"minimal go-fuse file over tmpfs\"):\n\n")
	for _, n := range notes {
		fmt.Fprintf(&w, "* %s\n", n)
	}
	return w.String()
}

// checkBaseline compares the baseline's median with its reference figure and,
// when it is off by more than 20%, says why: the raw tmpfs file shows whether
// the machine as a whole runs slower or faster than it did there.
func (b *bench) checkBaseline(j job, res map[string][]sample) string {
	if j.notes == 0 {
		return fmt.Sprintf("%s: no figure in the notes", j.title)
	}
	val := func(d string) float64 {
		ss := res[d]
		if len(ss) == 0 {
			return 0
		}
		if j.bw {
			return med(ss, func(s sample) float64 { return s.mbps })
		}
		return med(ss, func(s sample) float64 { return s.iops })
	}
	got := val("baseline")
	f := got / j.notes
	unit := " IOPS"
	if j.bw {
		unit = " MB/s"
	}
	msg := fmt.Sprintf("%s: %s%s vs %s in the notes (x%.2f)", j.title, kilo(got), unit, kilo(j.notes), f)
	if f >= 0.8 && f <= 1.2 {
		return msg + ": within 20%"
	}
	msg += ": OUTSIDE 20%"
	if raw := val("tmpfs"); raw > 0 {
		rf := raw / notesTmpfs[j.name]
		msg += fmt.Sprintf("; the raw tmpfs file runs at x%.2f of its notes figure", rf)
		switch {
		case rf < 0.8 && f < 0.8:
			msg += ", so the whole machine runs slower than where the notes were measured"
		case rf > 1.2 && f > 1.2:
			msg += ", so the whole machine runs faster than where the notes were measured"
		case f > 1.2:
			msg += ": the FUSE round trip is shorter here than where the notes were measured"
		}
	}
	return msg + fmt.Sprintf("; load average %s (other processes share the %d CPUs)", benchkit.Loadavg(), runtime.NumCPU())
}

// ratio compares a with b: IOPS, or bandwidth for the 1 MiB jobs.
func ratio(j job, a, b sample) float64 {
	if j.bw {
		return a.mbps / b.mbps
	}
	return a.iops / b.iops
}

// dmfuseDevices are the devices of the dmfuse mount (the others are the
// tmpfs file and a loop device over it).
var dmfuseDevices = []string{"zero", "linear", "striped", "stack3", "delay0"}

func isDmfuse(d string) bool { return slices.Contains(dmfuseDevices, d) }

// refDevices are the measured devices that have a NAME@ref twin.
func (b *bench) refDevices() []string {
	var out []string
	for _, d := range b.devices {
		if isDmfuse(d) {
			out = append(out, d)
		}
	}
	return out
}

func med(ss []sample, f func(sample) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	return benchkit.Median(v)
}

func kilo(v float64) string {
	if v >= 1e3 {
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func us(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2f ms", v/1000)
	}
	return fmt.Sprintf("%.1f us", v)
}

// setupRef builds dmfuse as of git revision b.ref (the tree from `git
// archive`, built with the module cache) and mounts it with the same config
// on a folder of its own; its devices are NAME@ref.
func (b *bench) setupRef(ctx context.Context, modDir, cfgPath string) error {
	bin := filepath.Join(b.scratch, "dmfuse-ref")
	logf("building dmfuse as of %s", b.ref)
	if err := benchkit.BuildRev(ctx, modDir, b.ref, filepath.Join(b.scratch, "ref-src"), bin, "./cmd/dmfuse"); err != nil {
		return err
	}
	mnt := filepath.Join(b.scratch, "dmref")
	argv := []string{bin, "mount", "--config", cfgPath, "--control", filepath.Join(b.scratch, "ref.sock")}
	if b.transport != "" {
		argv = append(argv, "--transport="+b.transport)
	}
	argv = append(append(argv, b.refArgs...), mnt)
	env := append([]string{"XDG_STATE_HOME=" + filepath.Join(b.scratch, "ref-state")}, b.daemonEnv...)
	if _, err := b.daemon(ctx, "dmfuse@ref", mnt, filepath.Join(mnt, "linear"), env, argv...); err != nil {
		return err
	}
	for _, d := range dmfuseDevices {
		b.paths[d+"@ref"] = filepath.Join(mnt, d)
	}
	return nil
}
