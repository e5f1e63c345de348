// Command soak runs fio with verification on several stacked dmfuse devices
// while a driver reloads tables, suspends and resumes devices, fails and
// reinstates multipath paths and creates and deletes dm-stats regions, then
// reports the I/O completed, errors, verify failures, and the daemon's
// threads, open fds, RSS, Go heap and goroutines every -interval.
//
// Run it as root with /dev/fuse and fio, from inside the module:
//
//	go run ./test/soak                       # 10 minutes
//	go run ./test/soak -duration 1m -cycles 500
//	go run ./test/soak -profiles DIR         # also heap profiles at half time and at the end
//
// It mounts a private tmpfs for the backing files and removes everything it
// set up when it ends, also on Ctrl-C. It exits 1 if any I/O failed, any
// block failed verification, or the daemon's memory kept growing over the
// second half of the run: a least-squares line through the second half's
// samples of RSS, or of the live heap, rises by more than 8 MiB (or 10% of
// their mean, if more) from the first of them to the last.
//
// The devices (all over files on the tmpfs):
//
//	st    striped 2 x 16 sectors over two files        fio: randwrite, verify
//	base  linear over a file; dl: delay 0.5 ms on base  fio on dl: randwrite, verify
//	p1 p2 linear over one file; mp: multipath over them fio: randrw, verify
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/test/bench/benchkit"

	"golang.org/x/sys/unix"
)

const devSectors = 131072 // 64 MiB per device

var (
	duration = flag.Duration("duration", 10*time.Minute, "how long fio runs")
	cycles   = flag.Int("cycles", 0, "stop the driver after this many operations (0: run as long as fio)")
	pause    = flag.Duration("pause", 20*time.Millisecond, "pause between driver operations")
	seed     = flag.Uint64("seed", 1, "seed of the driver's choices")
	interval = flag.Duration("interval", 0, "how often to sample the daemon's memory (0: a 40th of -duration, at least 1s)")
	profiles = flag.String("profiles", "", "folder to write the daemon's heap profiles to (heap-half.pb.gz, heap-end.pb.gz), for go tool pprof -base")
)

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, "soak: "+format+"\n", a...) }

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := &soak{}
	err := s.run(ctx)
	s.cleanup()
	if err != nil {
		logf("%v", err)
		os.Exit(1)
	}
}

type soak struct {
	scratch, mnt, sock string
	pid                int
	undo               []func()
	metrics, pprof     string // the daemon's /metrics and /debug/pprof/ URLs
}

func (s *soak) cleanup() {
	for i := len(s.undo) - 1; i >= 0; i-- {
		s.undo[i]()
	}
	s.undo = nil
}

// usage is the daemon's threads, open fds and resident memory from /proc,
// and its Go heap and goroutines from its /metrics.
type usage struct {
	at                  time.Duration // since fio started
	threads, fds        int
	rssKiB              int
	heapInuse, heapLive int64 // bytes
	goroutines          int
}

func (s *soak) usage() usage {
	var u usage
	m := scrape(s.metrics)
	u.heapInuse, u.heapLive = int64(m["go_memstats_heap_inuse_bytes"]), int64(m["dmfuse_heap_live_bytes"])
	u.goroutines = int(m["go_goroutines"])
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.pid)); err == nil {
		u.fds = len(ents)
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "Threads:":
			u.threads, _ = strconv.Atoi(f[1])
		case "VmRSS:":
			u.rssKiB, _ = strconv.Atoi(f[1])
		}
	}
	return u
}

func (u usage) String() string {
	return fmt.Sprintf("%d threads, %d open fds, RSS %.1f MiB, Go heap in use %.1f MiB (live %.1f MiB), %d goroutines",
		u.threads, u.fds, float64(u.rssKiB)/1024, mib(u.heapInuse), mib(u.heapLive), u.goroutines)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// scrape returns the unlabelled samples of a /metrics page (none on error).
func scrape(url string) map[string]float64 {
	out := map[string]float64{}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
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
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// growth fits a least-squares line through the samples of value over time
// and returns how much it rises from the first sample's time to the last's,
// and the samples' mean.
func growth(us []usage, value func(usage) float64) (rise, mean float64) {
	if len(us) < 2 {
		return 0, 0
	}
	var st, sv float64
	for _, u := range us {
		st += u.at.Seconds()
		sv += value(u)
	}
	n := float64(len(us))
	mt, mv := st/n, sv/n
	var cov, vt float64
	for _, u := range us {
		dt := u.at.Seconds() - mt
		cov += dt * (value(u) - mv)
		vt += dt * dt
	}
	if vt == 0 {
		return 0, mv
	}
	return cov / vt * (us[len(us)-1].at - us[0].at).Seconds(), mv
}

// growthSlack is how much memory may rise over the second half before the
// soak calls it growth: the larger of 8 MiB and a tenth of the mean.
func growthSlack(mean float64) float64 { return max(8<<20, mean/10) }

// sampler records the daemon's usage every interval until stop is closed,
// and writes a heap profile at half time.
func (s *soak) sampler(t0 time.Time, every, half time.Duration, stop <-chan struct{}) []usage {
	var out []usage
	halfDone := false
	for i := 1; ; i++ {
		select {
		case <-stop:
			return out
		case <-time.After(time.Until(t0.Add(time.Duration(i) * every))):
		}
		u := s.usage()
		u.at = time.Since(t0).Round(time.Second)
		out = append(out, u)
		logf("%v: %v", u.at, u)
		if !halfDone && u.at >= half {
			halfDone = true
			s.heapProfile("heap-half.pb.gz")
		}
	}
}

// heapProfile saves the daemon's heap profile (after a collection) into
// -profiles.
func (s *soak) heapProfile(name string) {
	if *profiles == "" {
		return
	}
	c := http.Client{Timeout: time.Minute}
	resp, err := c.Get(s.pprof + "heap?gc=1")
	if err != nil {
		logf("heap profile: %v", err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(filepath.Join(*profiles, name), b, 0o644)
	}
	if err != nil {
		logf("heap profile: %v", err)
		return
	}
	logf("wrote %s", filepath.Join(*profiles, name))
}

func (s *soak) run(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (FUSE mount, tmpfs)")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		return errors.New("needs fio")
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return errors.New("run from inside the dmfuse module")
	}
	modDir := filepath.Dir(strings.TrimSpace(string(out)))
	if s.scratch, err = os.MkdirTemp("", "dmfuse-soak-"); err != nil {
		return err
	}
	s.undo = append(s.undo, func() { os.RemoveAll(s.scratch) })
	bin := filepath.Join(s.scratch, "dmfuse")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/dmfuse")
	build.Dir = modDir
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	tmpfs := filepath.Join(s.scratch, "tmpfs")
	os.Mkdir(tmpfs, 0o755)
	if err := unix.Mount("tmpfs", tmpfs, "tmpfs", 0, fmt.Sprintf("size=%dk", 5*devSectors/2+16<<10)); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	s.undo = append(s.undo, func() { unix.Unmount(tmpfs, unix.MNT_DETACH) })
	for _, n := range []string{"a", "b", "c", "d"} {
		if err := os.WriteFile(filepath.Join(tmpfs, n+".img"), nil, 0o600); err != nil {
			return err
		}
		size := int64(devSectors) * 512
		if n == "a" || n == "b" {
			size /= 2
		}
		if err := os.Truncate(filepath.Join(tmpfs, n+".img"), size); err != nil {
			return err
		}
	}
	cfg := fmt.Sprintf(`st,,,rw,0 %[1]d striped 2 16 ./a.img 0 ./b.img 0;
base,,,rw,0 %[1]d linear ./c.img 0;
dl,,,rw,0 %[1]d delay base 0 0.5;
p1,,,rw,0 %[1]d linear ./d.img 0;
p2,,,rw,0 %[1]d linear ./d.img 0;
mp,,,rw,0 %[1]d multipath 1 queue_if_no_path 0 1 1 round-robin 0 2 1 p1 1 p2 1;
`, devSectors)
	cfgPath := filepath.Join(tmpfs, "soak.conf")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	s.mnt = filepath.Join(s.scratch, "mnt")
	s.sock = filepath.Join(s.scratch, "ctl.sock")
	if *profiles != "" {
		if err := os.MkdirAll(*profiles, 0o755); err != nil {
			return err
		}
	}
	if err := s.daemon(ctx, bin, "mount", "--config", cfgPath, "--control", s.sock,
		"--metrics-addr", "127.0.0.1:0", "--pprof", "127.0.0.1:0", s.mnt); err != nil {
		return err
	}

	start := s.usage()
	logf("daemon pid %d at start: %v", s.pid, start)
	every := *interval
	if every <= 0 {
		every = max(*duration/40, time.Second)
	}
	t0 := time.Now()
	stopSampling := make(chan struct{})
	samplesDone := make(chan []usage, 1)
	go func() { samplesDone <- s.sampler(t0, every, *duration/2, stopSampling) }()
	fioCtx, fioCancel := context.WithCancel(ctx)
	defer fioCancel()
	var wg sync.WaitGroup
	results := map[string]*fioResult{}
	for _, j := range []struct{ dev, rw string }{{"st", "randwrite"}, {"dl", "randwrite"}, {"mp", "randrw"}} {
		r := &fioResult{}
		results[j.dev] = r
		wg.Go(func() { *r = s.fio(fioCtx, j.dev, j.rw) })
	}
	drv := &driver{s: s, rng: rand.New(rand.NewPCG(*seed, 7))}
	drvDone := make(chan error, 1)
	drvCtx, drvCancel := context.WithCancel(ctx)
	go func() { drvDone <- drv.loop(drvCtx) }()
	wg.Wait()
	drvCancel()
	derr := <-drvDone
	elapsed := time.Since(t0)
	close(stopSampling)
	samples := <-samplesDone
	time.Sleep(time.Second) // let the daemon settle before measuring
	end := s.usage()
	end.at = time.Since(t0).Round(time.Second)
	s.heapProfile("heap-end.pb.gz")

	fmt.Printf("soak: %v of fio (%s), driver seed %d\n", elapsed.Round(time.Second), fioVersion(), *seed)
	var ios, errs, verify int64
	fmt.Printf("| device | job | I/Os completed | errors | verify failures | fio exit |\n|---|---|---:|---:|---:|---|\n")
	for _, dev := range []string{"st", "dl", "mp"} {
		r := results[dev]
		fmt.Printf("| %s | %s | %d | %d | %d | %s |\n", dev, r.rw, r.ios, r.errs, r.verify, r.exit)
		ios, errs, verify = ios+r.ios, errs+r.errs, verify+r.verify
	}
	fmt.Printf("total: %d I/Os, %d errors, %d verify failures\n", ios, errs, verify)
	fmt.Printf("driver: %d operations: %s\n", drv.ops, drv.summary())
	fmt.Printf("daemon at start: %v\ndaemon at end:   %v\n", start, end)
	fmt.Printf("\n| time | RSS MiB | Go heap in use MiB | live heap MiB | goroutines | threads | fds |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, u := range append(append([]usage{start}, samples...), end) {
		fmt.Printf("| %v | %.1f | %.1f | %.1f | %d | %d | %d |\n", u.at, float64(u.rssKiB)/1024, mib(u.heapInuse), mib(u.heapLive), u.goroutines, u.threads, u.fds)
	}
	var second []usage
	for _, u := range samples {
		if u.at >= elapsed/2 {
			second = append(second, u)
		}
	}
	var grew []string
	for _, m := range []struct {
		name  string
		value func(usage) float64
	}{
		{"RSS", func(u usage) float64 { return float64(u.rssKiB) * 1024 }},
		{"live heap", func(u usage) float64 { return float64(u.heapLive) }},
	} {
		rise, mean := growth(second, m.value)
		fmt.Printf("second half (%d samples): %s rises %+.1f MiB along its trend (growth above %.1f MiB fails)\n",
			len(second), m.name, rise/(1<<20), growthSlack(mean)/(1<<20))
		if rise > growthSlack(mean) {
			grew = append(grew, fmt.Sprintf("%s rose %.1f MiB over the second half", m.name, rise/(1<<20)))
		}
	}
	if derr != nil {
		return fmt.Errorf("driver: %w", derr)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errs > 0 || verify > 0 {
		return fmt.Errorf("%d I/O errors, %d verify failures", errs, verify)
	}
	for dev, r := range results {
		if r.exit != "0" {
			return fmt.Errorf("fio on %s: exit %s: %s", dev, r.exit, r.stderr)
		}
	}
	if len(second) < 3 {
		return fmt.Errorf("only %d samples in the second half: too few to tell growth (lower -interval)", len(second))
	}
	if len(grew) > 0 {
		return fmt.Errorf("the daemon's memory kept growing: %s", strings.Join(grew, "; "))
	}
	return nil
}

// daemon starts dmfuse (benchkit.StartServer) and waits for its mount;
// cleanup stops it.
func (s *soak) daemon(ctx context.Context, argv ...string) error {
	srv, err := benchkit.StartServer("dmfuse", s.mnt, []string{"XDG_STATE_HOME=" + filepath.Join(s.scratch, "state")}, argv...)
	if err != nil {
		return err
	}
	s.undo = append(s.undo, func() { srv.Stop(20 * time.Second) })
	ready := func() bool {
		_, err := os.ReadFile(filepath.Join(s.mnt, "stats", "diskstats"))
		return err == nil
	}
	if err := srv.WaitReady(ctx, ready); err != nil {
		return err
	}
	s.pid = srv.Pid
	for range 500 {
		// The daemon says where it listens right after mounting.
		if m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(srv.Stderr()); m != nil {
			s.metrics = m[1]
		}
		if m := regexp.MustCompile(`pprof on (http://\S+/debug/pprof/)`).FindStringSubmatch(srv.Stderr()); m != nil {
			s.pprof = m[1]
		}
		if s.metrics != "" && s.pprof != "" {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("the daemon did not say where it serves metrics and profiles:\n%s", srv.Stderr())
}

type fioResult struct {
	rw                string
	ios, errs, verify int64
	exit, stderr      string
}

// fio runs one verifying job on a device for the soak's duration.
func (s *soak) fio(ctx context.Context, dev, rw string) fioResult {
	r := fioResult{rw: rw}
	args := []string{"--name=" + dev, "--filename=" + filepath.Join(s.mnt, dev), "--rw=" + rw,
		"--direct=1", "--ioengine=libaio", "--iodepth=8", "--bsrange=4k-64k", "--size=100%",
		"--time_based", "--runtime=" + strconv.Itoa(int(duration.Seconds())),
		"--verify=crc32c", "--verify_backlog=256", "--verify_fatal=0", "--do_verify=1",
		"--output-format=json"}
	c := exec.CommandContext(ctx, "fio", args...)
	c.Dir = s.scratch // fio leaves its verify state files in its folder
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	r.exit = "0"
	if err != nil {
		r.exit = err.Error()
	}
	r.stderr = stderr.String()
	r.verify = int64(strings.Count(r.stderr, "verify: bad") + strings.Count(r.stderr, "bad magic") +
		strings.Count(r.stderr, "bad header"))
	var out struct {
		Jobs []struct {
			Error    int   `json:"error"`
			TotalErr int64 `json:"total_err"`
			Read     struct {
				TotalIOs int64 `json:"total_ios"`
			} `json:"read"`
			Write struct {
				TotalIOs int64 `json:"total_ios"`
			} `json:"write"`
		} `json:"jobs"`
	}
	// fio may print notes before the JSON object.
	js := stdout.Bytes()
	if i := bytes.IndexByte(js, '{'); i > 0 {
		js = js[i:]
	}
	if err := json.Unmarshal(js, &out); err != nil {
		r.errs = 1
		r.stderr += "\ncannot parse fio's output: " + err.Error()
		return r
	}
	for _, j := range out.Jobs {
		r.ios += j.Read.TotalIOs + j.Write.TotalIOs
		r.errs += j.TotalErr
		if j.Error != 0 {
			r.errs++
		}
	}
	return r
}

func fioVersion() string {
	out, _ := exec.Command("fio", "--version").Output()
	return strings.TrimSpace(string(out))
}

// driver changes the devices under fio's feet, one operation at a time.
type driver struct {
	s      *soak
	rng    *rand.Rand
	ops    int
	counts map[string]int
	failed string // the multipath path now failed, if any
	region map[string][]string
}

func (d *driver) summary() string {
	var parts []string
	for _, k := range []string{"reload", "suspend/resume", "suspend --noflush/resume", "fail_path", "reinstate_path", "@stats_create", "@stats_delete", "@stats_print"} {
		parts = append(parts, fmt.Sprintf("%s %d", k, d.counts[k]))
	}
	return strings.Join(parts, ", ")
}

func (d *driver) call(r *control.Request) (string, error) {
	resp, err := control.Call(d.s.sock, r)
	if err != nil {
		return "", err
	}
	if resp.Error != "" {
		return "", fmt.Errorf("%s %s: %s", r.Op, r.Name, resp.Error)
	}
	return resp.Output, nil
}

// reloads are the equivalent tables each device is reloaded to, in turn.
func reloads(dir string) map[string][]string {
	n, h := devSectors, devSectors/2
	return map[string][]string{
		"st": {fmt.Sprintf("0 %d striped 2 16 %s/a.img 0 %s/b.img 0", n, dir, dir),
			fmt.Sprintf("0 %d striped 2 16 %s/a.img 0 %s/b.img 0\n%d %d striped 2 16 %s/a.img %d %s/b.img %d", h, dir, dir, h, h, dir, h/2, dir, h/2)},
		"base": {fmt.Sprintf("0 %d linear %s/c.img 0", n, dir),
			fmt.Sprintf("0 %d linear %s/c.img 0\n%d %d linear %s/c.img %d", h, dir, h, h, dir, h)},
		"dl": {fmt.Sprintf("0 %d delay base 0 0.5", n), fmt.Sprintf("0 %d delay base 0 0", n),
			fmt.Sprintf("0 %d delay base 0 1 base 0 0", n)},
		"mp": {fmt.Sprintf("0 %d multipath 1 queue_if_no_path 0 1 1 round-robin 0 2 1 p1 1 p2 1", n),
			fmt.Sprintf("0 %d multipath 1 queue_if_no_path 0 1 1 queue-length 0 2 1 p1 1 p2 1", n),
			fmt.Sprintf("0 %d multipath 1 queue_if_no_path 0 1 1 service-time 0 2 2 p1 1 1 p2 1 1", n)},
		"p1": {fmt.Sprintf("0 %d linear %s/d.img 0", n, dir)},
		"p2": {fmt.Sprintf("0 %d linear %s/d.img 0", n, dir)},
	}
}

func (d *driver) loop(ctx context.Context) error {
	d.counts = map[string]int{}
	d.region = map[string][]string{}
	tables := reloads(filepath.Join(d.s.scratch, "tmpfs"))
	devs := []string{"st", "base", "dl", "mp", "p1", "p2"}
	for ; *cycles == 0 || d.ops < *cycles; d.ops++ {
		select {
		case <-ctx.Done():
			return d.settle()
		case <-time.After(*pause):
		}
		dev := devs[d.rng.IntN(len(devs))]
		var err error
		switch k := d.rng.IntN(10); {
		case k < 3:
			ts := tables[dev]
			if _, err = d.call(&control.Request{Op: control.OpLoad, Name: dev, Table: ts[d.rng.IntN(len(ts))]}); err == nil {
				_, err = d.call(&control.Request{Op: control.OpResume, Name: dev})
				if dev == "mp" {
					d.failed = "" // a new multipath table starts with both paths
				}
			}
			d.counts["reload"]++
		case k < 5:
			noflush := d.rng.IntN(2) == 0
			if _, err = d.call(&control.Request{Op: control.OpSuspend, Name: dev, NoFlush: noflush}); err == nil {
				time.Sleep(time.Duration(d.rng.IntN(20)) * time.Millisecond)
				_, err = d.call(&control.Request{Op: control.OpResume, Name: dev})
			}
			if noflush {
				d.counts["suspend --noflush/resume"]++
			} else {
				d.counts["suspend/resume"]++
			}
		case k < 7:
			if d.failed == "" {
				d.failed = []string{"p1", "p2"}[d.rng.IntN(2)]
				_, err = d.call(&control.Request{Op: control.OpMessage, Name: "mp", Args: []string{"fail_path", d.failed}})
				d.counts["fail_path"]++
			} else {
				_, err = d.call(&control.Request{Op: control.OpMessage, Name: "mp", Args: []string{"reinstate_path", d.failed}})
				d.failed = ""
				d.counts["reinstate_path"]++
			}
		default:
			err = d.stats(dev)
		}
		if err != nil {
			return fmt.Errorf("operation %d: %w", d.ops, err)
		}
	}
	<-ctx.Done()
	return d.settle()
}

// stats creates a region on dev, or prints and deletes one.
func (d *driver) stats(dev string) error {
	msg := func(words ...string) (string, error) {
		return d.call(&control.Request{Op: control.OpMessage, Name: dev, Args: words})
	}
	if rs := d.region[dev]; len(rs) > 0 && d.rng.IntN(2) == 0 {
		id := rs[0]
		d.region[dev] = rs[1:]
		if _, err := msg("@stats_print", id); err != nil {
			return err
		}
		d.counts["@stats_print"]++
		d.counts["@stats_delete"]++
		_, err := msg("@stats_delete", id)
		return err
	}
	specs := [][]string{{"-", "/8"}, {"0+4096", "512"}, {"-", "/2", "2", "precise_timestamps", "histogram:1000,100000"}}
	out, err := msg(append([]string{"@stats_create"}, specs[d.rng.IntN(len(specs))]...)...)
	if err == nil {
		d.region[dev] = append(d.region[dev], strings.TrimSpace(out))
		d.counts["@stats_create"]++
	}
	return err
}

// settle leaves both paths usable when the driver stops.
func (d *driver) settle() error {
	if d.failed != "" {
		_, err := d.call(&control.Request{Op: control.OpMessage, Name: "mp", Args: []string{"reinstate_path", d.failed}})
		d.failed = ""
		return err
	}
	return nil
}
