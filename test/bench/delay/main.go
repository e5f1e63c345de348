// Command delay measures how exact dmfuse's delay target is, with fio, side
// by side in one run on one mount.
//
//	go run ./test/bench/delay [-runtime 20s] [-zero-runtime 5s] [-idle 10s] [-out FILE]
//
// It needs root, /dev/fuse, fio and go; it installs nothing. It builds dmfuse,
// mounts a private tmpfs holding one backing file filled with random data,
// and mounts dmfuse on it with four devices over that file:
//
//	d0    0 S delay TMPFS/base.img 0 0      (passes straight through: the FUSE floor)
//	d0.1  0 S delay TMPFS/base.img 0 0.1
//	d1    0 S delay TMPFS/base.img 0 1
//	d10   0 S delay TMPFS/base.img 0 10
//
// Then it measures the daemon's CPU time while idle (utime+stime from
// /proc/PID/stat over -idle), and runs each row of the table (4 KiB,
// --direct=1, -runtime each after a ramp of 2 s). Each QD1 row is preceded by
// the same job on d0 (for -zero-runtime), whose mean completion latency is the
// FUSE round trip of that row: its ceiling is 1 / (delay + round trip). Then
// the same job on d0 again with fio's --thinktime equal to the delay gives the
// round trip after the CPUs idled that long, and the idle-gap bound
// 1 / (delay + that round trip). The io_uring row's ceiling is queue depth /
// delay. Completion latencies are
// exact, from fio's per-I/O latency log, not its histogram buckets. The daemon's
// CPU time is also taken around the 1 ms read row.
//
// The markdown table is printed and, with -out, written to a file.
// Everything it set up (fio, daemon, mounts, scratch folder) is torn down on
// exit, on error and on SIGINT or SIGTERM.
package main

import (
	"bufio"
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

// row is one measured line of the table.
type row struct {
	title   string
	dev     string  // device name in the mount
	delayMs float64 // the device's delay
	write   bool
	uring   bool // io_uring 2 jobs x QD32 instead of psync QD1
	cpu     bool // report the daemon's CPU time during this row
}

var rows = []row{
	{title: "randread psync QD1, 1 ms", dev: "d1", delayMs: 1, cpu: true},
	{title: "randwrite psync QD1, 1 ms", dev: "d1", delayMs: 1, write: true},
	{title: "randread psync QD1, 10 ms", dev: "d10", delayMs: 10},
	{title: "randwrite io_uring 2x32, 10 ms", dev: "d10", delayMs: 10, write: true, uring: true},
	{title: "randread psync QD1, 0.1 ms", dev: "d0.1", delayMs: 0.1},
}

// result is one fio run.
type result struct {
	iops     float64
	meanUs   float64 // mean completion latency
	p50, p99 float64 // completion latency percentiles, us, exact
	n        int     // I/Os in the latency log
}

func main() {
	var (
		rt   = flag.Duration("runtime", 20*time.Second, "fio runtime of each delay row (after a 2 s ramp)")
		zrt  = flag.Duration("zero-runtime", 5*time.Second, "fio runtime of each zero-delay run that gives a row its round trip")
		idle = flag.Duration("idle", 10*time.Second, "how long to measure the idle daemon's CPU time")
		size = flag.Int64("size", 256, "size of the backing file and of each device, MiB")
		out  = flag.String("out", "", "also write the markdown table to this file")
		tr   = flag.String("transport", "dev", "dmfuse --transport (auto, uring or dev)")
		xarg = flag.String("daemon-args", "", "extra dmfuse mount flags, space separated")
	)
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run ./test/bench/delay [flags]\n\nNeeds root, /dev/fuse, fio and go.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	b := &bench{runtime: *rt, zeroRuntime: *zrt, idle: *idle, size: *size << 20, transport: *tr, extra: strings.Fields(*xarg)}

	ctx, stop := benchkit.SignalContext("delay bench")
	defer stop()
	report, err := b.run(ctx)
	b.undo.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		fmt.Fprintln(os.Stderr, "delay bench:", err)
		os.Exit(1)
	}
	fmt.Print(report)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(report), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "delay bench:", err)
			os.Exit(1)
		}
	}
}

// bench is one run and everything it has set up.
type bench struct {
	runtime, zeroRuntime, idle time.Duration
	size                       int64
	transport                  string
	extra                      []string // more dmfuse mount flags

	scratch string
	mnt     string
	pid     int
	undo    benchkit.Undo
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, "delay bench: "+format+"\n", a...) }

func (b *bench) run(ctx context.Context) (string, error) {
	if err := check(); err != nil {
		return "", err
	}
	if err := b.setup(ctx); err != nil {
		return "", err
	}
	var w strings.Builder
	load0 := benchkit.Loadavg()
	start := time.Now()

	time.Sleep(time.Second) // let the daemon settle after mounting
	c0, t0 := b.cpu(), time.Now()
	logf("measuring the idle daemon for %v", b.idle)
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(b.idle):
	}
	idleCPU := msPerSec(b.cpu()-c0, time.Since(t0))

	type line struct {
		r          row
		zero, res  result
		ceiling    float64
		cpuMsPerS  float64
		roundTrip  float64 // us
		hasRoundTr bool
		idle       result  // the zero-delay device with the delay as think time
		bound      float64 // 1 / (delay + idle's mean latency)
	}
	var lines []line
	for _, r := range rows {
		l := line{r: r}
		if !r.uring {
			logf("%s: zero-delay round trip (%v)", r.title, b.zeroRuntime)
			z, err := b.fio(ctx, r, "d0", b.zeroRuntime)
			if err != nil {
				return "", err
			}
			l.zero, l.roundTrip, l.hasRoundTr = z, z.meanUs, true
			l.ceiling = 1e6 / (r.delayMs*1e3 + z.meanUs)
			logf("%s: zero-delay round trip after %v ms idle (%v)", r.title, r.delayMs, b.zeroRuntime)
			think := fmt.Sprintf("--thinktime=%dus", int(r.delayMs*1e3))
			if l.idle, err = b.fio(ctx, r, "d0", b.zeroRuntime, think); err != nil {
				return "", err
			}
			l.bound = 1e6 / (r.delayMs*1e3 + l.idle.meanUs)
		} else {
			l.ceiling = 64 / (r.delayMs / 1e3)
		}
		logf("%s (%v)", r.title, b.runtime)
		c0, t0 := b.cpu(), time.Now()
		res, err := b.fio(ctx, r, r.dev, b.runtime)
		if err != nil {
			return "", err
		}
		l.cpuMsPerS = msPerSec(b.cpu()-c0, time.Since(t0))
		l.res = res
		lines = append(lines, l)
	}

	fmt.Fprintf(&w, "fio %s, %d CPUs, kernel %s; %v per row after a 2 s ramp, %v per zero-delay run; took %v; load average before %s, after %s\n\n",
		benchkit.FioVersion(), runtime.NumCPU(), benchkit.Kernel(), b.runtime, b.zeroRuntime, time.Since(start).Round(time.Second), load0, benchkit.Loadavg())
	fmt.Fprintf(&w, "| fio job (4k, --direct=1) | IOPS | ceiling | %% of ceiling | late p50 | late p99 | zero-delay round trip (mean / p50 / p99) | after an idle gap (mean / p50 / p99) | idle-gap bound | %% of bound |\n")
	fmt.Fprintf(&w, "|---|---:|---:|---:|---:|---:|---|---|---:|---:|\n")
	for _, l := range lines {
		rt, irt, bound, ofBound := "-", "-", "-", "-"
		if l.hasRoundTr {
			rt = fmt.Sprintf("%.0f / %.0f / %.0f us", l.roundTrip, l.zero.p50, l.zero.p99)
			irt = fmt.Sprintf("%.0f / %.0f / %.0f us", l.idle.meanUs, l.idle.p50, l.idle.p99)
			bound, ofBound = fmt.Sprintf("%.0f", l.bound), fmt.Sprintf("%.1f%%", 100*l.res.iops/l.bound)
		}
		d := l.r.delayMs * 1e3
		fmt.Fprintf(&w, "| %s | %.0f | %.0f | **%.1f%%** | %s | %s | %s | %s | %s | %s |\n", l.r.title, l.res.iops, l.ceiling,
			100*l.res.iops/l.ceiling, lateUs(l.res.p50-d), lateUs(l.res.p99-d), rt, irt, bound, ofBound)
	}
	fmt.Fprintf(&w, "\nLate = completion latency minus the requested delay (exact, from fio's per-I/O log; it includes the FUSE round trip).\n")
	fmt.Fprintf(&w, "After an idle gap = the zero-delay device with fio --thinktime equal to the row's delay: the round trip when the CPUs have idled for that long, as they do while a request waits; idle-gap bound = 1 / (delay + its mean).\n")
	fmt.Fprintf(&w, "Daemon CPU time (utime+stime of /proc/PID/stat): idle %.2f ms/s over %v", idleCPU, b.idle)
	for _, l := range lines {
		if l.r.cpu {
			fmt.Fprintf(&w, "; %s: %.0f ms/s at %.0f IOPS", l.r.title, l.cpuMsPerS, l.res.iops)
		}
	}
	fmt.Fprintf(&w, ".\n")
	return w.String(), nil
}

func lateUs(v float64) string {
	if v >= 1000 || v <= -1000 {
		return fmt.Sprintf("%.2f ms", v/1000)
	}
	return fmt.Sprintf("%.0f us", v)
}

func msPerSec(cpu, d time.Duration) float64 {
	return float64(cpu.Microseconds()) / 1e3 / d.Seconds()
}

// check fails early, saying what is missing.
func check() error {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root (for mounts)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		miss = append(miss, "/dev/fuse")
	}
	for _, t := range []string{"fio", "go"} {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, t)
		}
	}
	if len(miss) > 0 {
		return fmt.Errorf("missing: %s", strings.Join(miss, ", "))
	}
	return nil
}

// setup builds dmfuse, mounts the tmpfs and the daemon.
func (b *bench) setup(ctx context.Context) error {
	scratch, modDir, err := benchkit.Scratch(&b.undo, "dmfuse-delay-bench")
	if err != nil {
		return err
	}
	b.scratch = scratch
	bin := filepath.Join(b.scratch, "dmfuse")
	logf("building dmfuse in %s", b.scratch)
	if err := benchkit.Build(ctx, modDir, bin, "./cmd/dmfuse"); err != nil {
		return err
	}
	tmpfs := filepath.Join(b.scratch, "tmpfs")
	if err := benchkit.MountTmpfs(&b.undo, tmpfs, b.size+16<<20); err != nil {
		return err
	}
	img := filepath.Join(tmpfs, "base.img")
	// Random data: tmpfs reads holes without touching a page.
	if err := benchkit.Fill(img, b.size); err != nil {
		return err
	}
	sec := b.size / 512
	var cfg []string
	for _, d := range []string{"0", "0.1", "1", "10"} {
		cfg = append(cfg, fmt.Sprintf("d%s,,,rw,0 %d delay %s 0 %s", d, sec, img, d))
	}
	cfgPath := filepath.Join(b.scratch, "delay.conf")
	if err := os.WriteFile(cfgPath, []byte(strings.Join(cfg, ";\n")+"\n"), 0o644); err != nil {
		return err
	}
	b.mnt = filepath.Join(b.scratch, "mnt")
	argv := append([]string{bin, "mount", "--transport", b.transport, "--config", cfgPath}, b.extra...)
	return b.daemon(ctx, append(argv, b.mnt)...)
}

// daemon starts dmfuse (benchkit.StartMounted), stops it at cleanup, and
// waits until its devices answer.
func (b *bench) daemon(ctx context.Context, argv ...string) error {
	srv, err := benchkit.StartMounted(ctx, &b.undo, "dmfuse", b.mnt, benchkit.FileReady(filepath.Join(b.mnt, "d0")),
		[]string{"XDG_STATE_HOME=" + filepath.Join(b.scratch, "state")}, argv...)
	if err != nil {
		return err
	}
	b.pid = srv.Pid
	return nil
}

// cpu returns the daemon's CPU time so far.
func (b *bench) cpu() time.Duration { return benchkit.CPUTime(b.pid) }

// fio runs row r's job on device dev for rt and returns IOPS and exact
// completion latency percentiles.
func (b *bench) fio(ctx context.Context, r row, dev string, rt time.Duration, extra ...string) (result, error) {
	logDir, err := os.MkdirTemp(b.scratch, "lat-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(logDir)
	rw := "randread"
	if r.write {
		rw = "randwrite"
	}
	args := append(benchkit.FioArgs(rw, filepath.Join(b.mnt, dev), rt, 2*time.Second, b.size),
		"--rw="+rw, "--bs=4k", "--write_lat_log="+filepath.Join(logDir, "lat"), "--log_avg_msec=0")
	if r.uring {
		args = append(args, "--ioengine=io_uring", "--iodepth=32", "--numjobs=2")
	} else {
		args = append(args, "--ioengine=psync", "--iodepth=1", "--numjobs=1")
	}
	j, err := benchkit.RunFio(ctx, logDir, append(args, extra...)...)
	if err != nil {
		return result{}, fmt.Errorf("%s on %s: %w", rw, dev, err)
	}
	d := j.Read
	if r.write {
		d = j.Write
	}
	res := result{iops: d.IOPS, meanUs: d.Clat.Mean / 1e3}
	lat, err := readLatLogs(logDir)
	if err != nil {
		return result{}, err
	}
	if len(lat) == 0 {
		return result{}, errors.New("fio wrote no completion latencies")
	}
	slices.Sort(lat)
	res.n = len(lat)
	res.p50 = float64(lat[len(lat)/2]) / 1e3
	res.p99 = float64(lat[len(lat)*99/100]) / 1e3
	return res, nil
}

// readLatLogs reads the completion latencies (ns) of every job's clat log.
func readLatLogs(dir string) ([]int64, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "lat_clat.*.log"))
	var lat []int64
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		s := bufio.NewScanner(fh)
		for s.Scan() {
			// time (ms), value (ns), direction, block size, offset[, prio]
			parts := strings.SplitN(s.Text(), ",", 3)
			if len(parts) < 2 {
				continue
			}
			v, err := strconv.ParseInt(strings.TrimSpace(parts[1]), 10, 64)
			if err == nil {
				lat = append(lat, v)
			}
		}
		fh.Close()
	}
	return lat, nil
}
