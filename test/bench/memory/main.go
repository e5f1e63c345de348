// Command memory measures the resident memory of the dmfuse daemon under
// bursts of I/O and after them, on each transport.
//
//	go run ./test/bench/memory [-transports dev,uring] [-round 8s] [-idle 30s] [-dmfuse BIN] [-daemon-args ARGS] [-out FILE]
//
// It needs root, /dev/fuse, fio and go; it installs nothing. It builds dmfuse
// (or runs -dmfuse), mounts a private tmpfs holding a 512 MiB backing file
// filled with random data, and mounts dmfuse on it with one linear device over
// that file, with --metrics-addr. For the io_uring transport it switches the
// fuse module's enable_uring on for as long as the mount takes (a connection
// keeps io_uring once negotiated) and puts the old value back at once, so that
// other mounts on the machine are not moved to io_uring.
//
// Then it runs these fio rounds (--direct=1, io_uring engine, -round each):
//
//	rw1  4k randwrite, 2 jobs x QD32
//	w1m  1 MiB write, QD16
//	r1m  1 MiB read, QD16
//	rw2  4k randwrite, 2 jobs x QD32
//	rw3  4k randwrite, 2 jobs x QD32
//	rw4  4k randwrite, 2 jobs x QD32
//
// and after each records the daemon's peak RSS during the round (sampled
// every 100 ms), its RSS at the end, and
// from its /metrics the Go heap in use, the live heap and the goroutines.
// Then it leaves the daemon idle for -idle, reading VmRSS every second.
//
// It prints a markdown table and the goals (never above 96 MiB; the last
// three rounds, the same load, peak no higher than the first of them; under
// 48 MiB within 30 s of idleness), and with -out writes them to a file. Everything
// it set up (fio, daemon, mounts, scratch folder, the module parameter) is
// put back on exit, on error and on SIGINT or SIGTERM.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// round is one fio burst.
type round struct {
	name, title string
	args        []string
	write, bw   bool
}

var rounds = func() []round {
	rw := func(n string) round {
		return round{name: n, title: "4k randwrite 2x32", write: true,
			args: []string{"--rw=randwrite", "--bs=4k", "--numjobs=2", "--iodepth=32"}}
	}
	return []round{
		rw("rw1"),
		{name: "w1m", title: "1M write QD16", write: true, bw: true, args: []string{"--rw=write", "--bs=1M", "--iodepth=16"}},
		{name: "r1m", title: "1M read QD16", bw: true, args: []string{"--rw=read", "--bs=1M", "--iodepth=16"}},
		rw("rw2"), rw("rw3"), rw("rw4"),
	}
}()

// Goals, in bytes.
const (
	goalPeak = 96 << 20
	goalIdle = 48 << 20
	// goalIdleWithin is how soon after the last round RSS must be under
	// goalIdle.
	goalIdleWithin = 30 * time.Second
	// flatSlack is how much higher than the peak of the first of the last
	// three rounds the others may peak before they count as growth: the
	// timing of collections moves RSS by a few MiB.
	flatSlack = 4 << 20
)

const backingSize = 512 << 20

// figures are one measurement of the daemon.
type figures struct {
	peak, rss           int64 // the round's peak and the RSS at its end (procRSS)
	heapInuse, heapLive int64 // from /metrics; -1 if absent
	goroutines, bound   int64
	perf                float64 // IOPS or MB/s of the round
	perfUnit            string
	idleSeries          []int64 // VmRSS each second while idle
	underGoalAfter      time.Duration
	underGoal           bool
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, "memory: "+format+"\n", a...) }

func main() {
	var (
		transports = flag.String("transports", "dev,uring", "transports to measure, in order")
		roundDur   = flag.Duration("round", 8*time.Second, "fio runtime of each round")
		idle       = flag.Duration("idle", 30*time.Second, "how long to watch the idle daemon after the rounds")
		bin        = flag.String("dmfuse", "", "dmfuse binary to measure (default: build ./cmd/dmfuse)")
		xargs      = flag.String("daemon-args", "", "extra dmfuse mount flags, space separated, e.g. --memory-limit=128MiB")
		out        = flag.String("out", "", "file to write the markdown report to")
	)
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run ./test/bench/memory [flags]\n\nNeeds root, /dev/fuse, fio and go.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &bench{round: *roundDur, idle: *idle, bin: *bin, daemonArgs: strings.Fields(*xargs)}
	err := b.run(ctx, strings.Split(*transports, ","))
	b.undo.Run()
	if err == nil {
		report := b.report()
		fmt.Print(report)
		if *out != "" {
			err = os.WriteFile(*out, []byte(report), 0o644)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		logf("%v", err)
		os.Exit(1)
	}
}

// bench is one run: settings, what it set up, and what it measured.
type bench struct {
	round, idle time.Duration
	bin         string
	daemonArgs  []string

	scratch string
	undo    benchkit.Undo
	started time.Time

	results []transportResult
}

// transportResult is what one transport measured.
type transportResult struct {
	transport string
	start     figures
	rounds    []figures
	idle      figures
	plan      string // the daemon's own line about its memory plan
}

func (b *bench) run(ctx context.Context, transports []string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (FUSE mount, tmpfs, /proc/PID/clear_refs)")
	}
	for _, t := range []string{"fio", "go"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("missing %s (e.g. apt-get install -y fio)", t)
		}
	}
	var err error
	if b.scratch, err = benchkit.TempDir(&b.undo, "dmfuse-memory"); err != nil {
		return err
	}
	if b.bin == "" {
		modDir, err := benchkit.ModuleDir()
		if err != nil {
			return err
		}
		b.bin = filepath.Join(b.scratch, "dmfuse")
		if err := benchkit.Build(ctx, modDir, b.bin, "./cmd/dmfuse"); err != nil {
			return err
		}
	}
	tmpfs := filepath.Join(b.scratch, "tmpfs")
	if err := benchkit.MountTmpfs(&b.undo, tmpfs, backingSize+16<<20); err != nil {
		return err
	}
	backing := filepath.Join(tmpfs, "lin.img")
	if err := benchkit.Fill(backing, backingSize); err != nil {
		return err
	}
	b.started = time.Now()
	for _, t := range transports {
		if t == "" {
			continue
		}
		r, err := b.transport(ctx, t, backing)
		if err != nil {
			return fmt.Errorf("transport %s: %w", t, err)
		}
		b.results = append(b.results, r)
	}
	return nil
}

// transport mounts dmfuse with transport t, runs the rounds and the idle
// watch, and stops the daemon.
func (b *bench) transport(ctx context.Context, t, backing string) (transportResult, error) {
	res := transportResult{transport: t}
	dir := filepath.Join(b.scratch, t)
	mnt := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return res, err
	}
	cfg := filepath.Join(dir, "memory.conf")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("lin,,,rw,0 %d linear %s 0\n", backingSize/512, backing)), 0o644); err != nil {
		return res, err
	}
	port, err := freePort()
	if err != nil {
		return res, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	argv := append([]string{b.bin, "mount", "--config", cfg, "--control", filepath.Join(dir, "ctl.sock"),
		"--transport=" + t, "--metrics-addr", addr}, b.daemonArgs...)
	argv = append(argv, mnt)

	if t == "uring" {
		restore, err := benchkit.EnableURing()
		if err != nil {
			return res, err
		}
		// Restored as soon as the mount answers, and again at cleanup
		// if setting up fails first.
		defer restore()
		b.undo.Push(restore)
	}
	srv, err := benchkit.StartServer("dmfuse", mnt, []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state")}, argv...)
	if err != nil {
		return res, err
	}
	stopped := false
	stopSrv := func() {
		if !stopped {
			stopped = true
			srv.Stop(20 * time.Second)
		}
	}
	b.undo.Push(stopSrv)
	dev := filepath.Join(mnt, "lin")
	if err := srv.WaitReady(ctx, benchkit.FileReady(dev)); err != nil {
		return res, err
	}
	for _, l := range strings.Split(srv.Stderr(), "\n") {
		if strings.Contains(l, "memory limit") {
			res.plan = strings.TrimPrefix(l, "dmfuse: ")
		}
	}
	logf("%s: daemon pid %d, %s", t, srv.Pid, res.plan)

	res.start = b.measure(srv.Pid, addr)
	for _, r := range rounds {
		stop := make(chan struct{})
		peak := make(chan int64)
		go func() {
			var p int64
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				p = max(p, procRSS(srv.Pid))
				select {
				case <-stop:
					peak <- p
					return
				case <-t.C:
				}
			}
		}()
		perf, err := b.fio(ctx, dev, r)
		close(stop)
		p := <-peak
		if err != nil {
			return res, err
		}
		f := b.measure(srv.Pid, addr)
		f.peak = max(p, f.rss)
		f.perf = perf
		f.perfUnit = "IOPS"
		if r.bw {
			f.perfUnit = "MB/s"
		}
		res.rounds = append(res.rounds, f)
		logf("%s %s: %.0f %s, peak RSS %s, RSS %s, heap in use %s", t, r.name, perf, f.perfUnit, mib(f.peak), mib(f.rss), mib(f.heapInuse))
	}
	idleStart := time.Now()
	var series []int64
	under := time.Duration(-1)
	for i := 1; time.Since(idleStart) < b.idle; i++ {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Until(idleStart.Add(time.Duration(i) * time.Second))):
		}
		rss := procRSS(srv.Pid)
		series = append(series, rss)
		if rss < goalIdle && under < 0 {
			under = time.Since(idleStart).Round(time.Second)
		}
	}
	res.idle = b.measure(srv.Pid, addr)
	res.idle.idleSeries = series
	res.idle.underGoalAfter = under
	res.idle.underGoal = under >= 0 && under <= goalIdleWithin
	stopSrv()
	return res, nil
}

// freePort returns a TCP port on the loopback interface that was free a
// moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// procRSS returns the daemon's resident memory: VmRSS less RssShmem, the
// pages of the backing file on tmpfs that the daemon maps (stack's
// filemap.go), which are the file's, not the daemon's.
func procRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	var rss, shmem int64
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fs[1], 10, 64)
		switch fs[0] {
		case "VmRSS:":
			rss = kb << 10
		case "RssShmem:":
			shmem = kb << 10
		}
	}
	return rss - shmem
}

// measure reads the daemon's memory from /proc and from its /metrics.
func (b *bench) measure(pid int, addr string) figures {
	var f figures
	f.rss = procRSS(pid)
	m := scrape(addr)
	get := func(name string) int64 {
		if v, ok := m[name]; ok {
			return int64(v)
		}
		return -1
	}
	f.heapInuse = get("go_memstats_heap_inuse_bytes")
	f.heapLive = get("dmfuse_heap_live_bytes")
	f.goroutines = get("go_goroutines")
	f.bound = get("dmfuse_request_memory_bound_bytes")
	return f
}

// scrape returns the unlabelled samples of the daemon's /metrics.
func scrape(addr string) map[string]float64 {
	out := map[string]float64{}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		name, val, ok := strings.Cut(l, " ")
		if !ok || strings.ContainsAny(name, "{#") {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// fio runs one round on dev and returns its IOPS (or MB/s).
func (b *bench) fio(ctx context.Context, dev string, r round) (float64, error) {
	args := append([]string{"--name=" + r.name, "--filename=" + dev, "--direct=1", "--ioengine=io_uring",
		"--time_based", fmt.Sprintf("--runtime=%dms", b.round.Milliseconds()), fmt.Sprintf("--size=%d", backingSize),
		"--group_reporting", "--randrepeat=0", "--output-format=json"}, r.args...)
	j, err := benchkit.RunFio(ctx, "", args...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", r.name, err)
	}
	d := j.Read
	if r.write {
		d = j.Write
	}
	if r.bw {
		return d.BWBytes / 1e6, nil
	}
	return d.IOPS, nil
}

func mib(n int64) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(n)/(1<<20))
}

// report renders the results and the goals as markdown.
func (b *bench) report() string {
	var w strings.Builder
	host, _ := os.Hostname()
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&w, "fio %s, %d CPUs, kernel %s, %s; rounds of %v, idle %v; daemon flags %q; load average at the end: %s\n\n",
		benchkit.FioVersion(), runtime.NumCPU(), benchkit.Kernel(), host, b.round, b.idle, b.daemonArgs,
		strings.Join(strings.Fields(string(load))[:3], " "))
	for _, r := range b.results {
		fmt.Fprintf(&w, "* %s: %s\n", r.transport, r.plan)
	}
	fmt.Fprintf(&w, "\nMiB; RSS is VmRSS less RssShmem (the mapped backing file's pages), sampled every 100 ms; peak is the highest during the round, RSS and heap in use are at its end.\n\n")
	fmt.Fprintf(&w, "| transport | round | fio | peak RSS | RSS | Go heap in use | live heap | goroutines |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range b.results {
		fmt.Fprintf(&w, "| %s | start | | | %s | %s | %s | %d |\n", r.transport, mib(r.start.rss), mib(r.start.heapInuse), mib(r.start.heapLive), r.start.goroutines)
		for i, f := range r.rounds {
			perf := fmt.Sprintf("%.0f %s", f.perf, f.perfUnit)
			if f.perfUnit == "IOPS" {
				perf = fmt.Sprintf("%.1fk IOPS", f.perf/1e3)
			}
			fmt.Fprintf(&w, "| %s | %s %s | %s | %s | %s | %s | %s | %d |\n", r.transport, rounds[i].name, rounds[i].title, perf,
				mib(f.peak), mib(f.rss), mib(f.heapInuse), mib(f.heapLive), f.goroutines)
		}
		for _, s := range []int{10, 30} {
			if len(r.idle.idleSeries) >= s {
				fmt.Fprintf(&w, "| %s | idle %d s | | | %s | | | |\n", r.transport, s, mib(r.idle.idleSeries[s-1]))
			}
		}
		fmt.Fprintf(&w, "| %s | idle %v (end) | | | %s | %s | %s | %d |\n", r.transport, b.idle, mib(r.idle.rss), mib(r.idle.heapInuse), mib(r.idle.heapLive), r.idle.goroutines)
	}
	fmt.Fprintf(&w, "\nGoals:\n\n")
	for _, r := range b.results {
		var peak int64
		for _, f := range r.rounds {
			peak = max(peak, f.peak)
		}
		last := r.rounds[len(r.rounds)-3:]
		flat := true
		for _, f := range last[1:] {
			flat = flat && f.peak <= last[0].peak+flatSlack
		}
		idle := fmt.Sprintf("not under %s MiB within %v", mib(goalIdle), b.idle)
		if r.idle.underGoalAfter >= 0 {
			idle = fmt.Sprintf("under %s MiB after %v", mib(goalIdle), r.idle.underGoalAfter)
		}
		fmt.Fprintf(&w, "* %s: peak %s MiB (goal at most %s): %s; peaks of the last three rounds %s / %s / %s MiB (goal: no growth): %s; %s (goal within %v): %s\n",
			r.transport, mib(peak), mib(goalPeak), yes(peak <= goalPeak),
			mib(last[0].peak), mib(last[1].peak), mib(last[2].peak), yes(flat),
			idle, goalIdleWithin, yes(r.idle.underGoal))
	}
	return w.String()
}

func yes(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
