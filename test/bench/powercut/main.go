// Command powercut measures what the powercut target's volatile write cache
// does to write speed: the same fio jobs on a powercut device and on a
// linear device over the same backing file, in one run.
//
//	go run ./test/bench/powercut [-pairs N] [-runtime D] [-size MIB] [-cache SECTORS] [-transport T] [-out FILE]
//
// It needs root, /dev/fuse, fio and go; it installs nothing. It builds
// dmfuse, mounts a private tmpfs with one filled backing file of -size MiB,
// and mounts dmfuse with two devices over that file:
//
//	lin  0 S linear TMPFS/data.img 0
//	pc   0 S powercut TMPFS/data.img 0 [2 cache_sectors N]
//
// Four fio jobs, 4 KiB random writes with O_DIRECT over the whole device:
// psync QD1 and libaio 2 jobs x QD32, each without flushes and with an
// fsync every 32 writes (fio --fsync=32; each job's own file descriptor,
// each fsync a FUSE fsync, which is a flush of the device). Each runs on lin
// and on pc, the two alternating in an order that flips every round, for
// -pairs rounds. After each run on pc the device is fsynced, which writes
// back what the cache still holds (at most -cache sectors), so that the
// next run, on either device, starts from a clean cache; that write-back is
// timed apart and not counted in the IOPS. The table gives the median IOPS
// of each device, the median of the per-round ratios pc/lin (with the
// smallest and largest), the daemon's CPU time (utime+stime) per write, the
// context switches of the whole machine per write (/proc/stat ctxt: fio's,
// the daemon's and everyone else's), and the median write-back time.
//
// Everything it set up is torn down on exit, on error and on SIGINT or
// SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

func main() {
	pairs := flag.Int("pairs", 5, "interleaved rounds")
	rt := flag.Duration("runtime", 10*time.Second, "fio runtime of each run")
	size := flag.Int("size", 1024, "size of the backing file and of each device in MiB")
	cache := flag.Int64("cache", -1, "powercut cache_sectors (-1: the default, 65536 sectors = 32 MiB)")
	transport := flag.String("transport", "auto", "dmfuse --transport (auto: io_uring where the kernel has it switched on, as users get)")
	out := flag.String("out", "", "also write the table to this file")
	jobs := flag.String("jobs", "", "run only the jobs whose title ends with this (e.g. \"2x32\": libaio 2x32 without fsync)")
	pprof := flag.String("pprof", "", "daemon --pprof HOST:PORT, to profile it during the runs")
	flag.Parse()
	if !slices.ContainsFunc(benchkit.RandWriteJobs, func(j benchkit.Job) bool { return strings.HasSuffix(j.Title, *jobs) }) {
		fmt.Fprintf(os.Stderr, "powercut bench: -jobs %q: no job title ends with it\n", *jobs)
		os.Exit(2)
	}
	b := &bench{pairs: *pairs, rt: *rt, sizeMiB: *size, cache: *cache, transport: *transport, jobs: *jobs, pprof: *pprof}
	benchkit.Main("powercut", *out, b.run)
}

type bench struct {
	pairs     int
	rt        time.Duration
	sizeMiB   int
	cache     int64
	transport string
	jobs      string
	pprof     string
	bin, sock string
	mnt       string
	pid       int // the daemon
}

func (b *bench) run(w io.Writer) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	work, err := os.MkdirTemp("", "dmfuse-powercut-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	b.bin = filepath.Join(work, "dmfuse")
	if out, err := exec.Command("go", "build", "-o", b.bin, "./cmd/dmfuse").CombinedOutput(); err != nil {
		return fmt.Errorf("go build (run from the repository root): %v\n%s", err, out)
	}
	tmpfs := filepath.Join(work, "tmpfs")
	b.mnt = filepath.Join(work, "mnt")
	os.Mkdir(tmpfs, 0o755)
	if err := unix.Mount("tmpfs", tmpfs, "tmpfs", 0, fmt.Sprintf("size=%dm", b.sizeMiB+64)); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	defer unix.Unmount(tmpfs, unix.MNT_DETACH)
	data := filepath.Join(tmpfs, "data.img")
	if err := benchkit.Fill(data, int64(b.sizeMiB)<<20); err != nil {
		return err
	}
	sectors := int64(b.sizeMiB) << 11
	feat := ""
	if b.cache >= 0 {
		feat = fmt.Sprintf(" 2 cache_sectors %d", b.cache)
	}
	cfg := filepath.Join(work, "bench.conf")
	conf := fmt.Sprintf("lin,,,rw,0 %d linear %s 0;\npc,,,rw,0 %d powercut %s 0%s;\n", sectors, data, sectors, data, feat)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	b.sock = filepath.Join(work, "ctl.sock")
	args := []string{"mount", "--config", cfg, "--control", b.sock, "--transport", b.transport}
	if b.pprof != "" {
		args = append(args, "--pprof", b.pprof)
	}
	srv, err := benchkit.StartServer("dmfuse", b.mnt, nil, append(append([]string{b.bin}, args...), b.mnt)...)
	if err != nil {
		return err
	}
	defer srv.Stop(30 * time.Second)
	b.pid = srv.Pid
	if err := srv.WaitReady(ctx, benchkit.FileReady(filepath.Join(b.mnt, "pc"))); err != nil {
		return err
	}
	if err := srv.WaitServing(ctx); err != nil {
		return err
	}
	table, err := benchkit.Ctl(b.bin, b.sock, "table", "pc")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Machine: %d CPUs, kernel %s, fio %s, %s; --transport %s: %s; load average at the start: %s.\n",
		runtime.NumCPU(), benchkit.Kernel(), benchkit.FioVersion(), runtime.Version(), b.transport,
		benchkit.ServerLine(srv, "transport "), loadavg())
	fmt.Fprintf(w, "Devices of %d MiB over one tmpfs file: lin (linear) and pc (%s).\n\n", b.sizeMiB, strings.TrimSpace(table))
	return b.measure(ctx, w)
}

// ctxSwitches returns the context switches of the whole machine since boot
// (/proc/stat ctxt), 0 if it cannot tell.
func ctxSwitches() int64 {
	s, _ := os.ReadFile("/proc/stat")
	for _, l := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(l, "ctxt "); ok {
			var n int64
			fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}

// loadavg returns the first three fields of /proc/loadavg.
func loadavg() string {
	s, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(s))
	return strings.Join(f[:min(3, len(f))], " ")
}

// flush fsyncs dev (a flush of the device: powercut writes its cache back)
// and returns how long it took.
func flush(dev string) (time.Duration, error) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	t0 := time.Now()
	err = f.Sync()
	return time.Since(t0), err
}

func (b *bench) measure(ctx context.Context, w io.Writer) error {
	names := [2]string{"lin", "pc"}
	iops := map[string][]float64{}
	cpuUs := map[string][]float64{}
	switches := map[string][]float64{}
	ratios := map[string][]float64{}
	wb := map[string][]float64{}
	cached := map[string][]float64{}
	t0 := time.Now()
	for round := range b.pairs {
		for _, j := range benchkit.RandWriteJobs {
			if !strings.HasSuffix(j.Title, b.jobs) {
				continue
			}
			var got [2]float64
			for k := range 2 {
				d := (k + round) % 2
				dev := filepath.Join(b.mnt, names[d])
				c0, s0 := benchkit.CPUTicks(b.pid), ctxSwitches()
				r, err := benchkit.FioRandWrite(ctx, dev, b.rt, j.Args...)
				if err != nil {
					return err
				}
				got[d] = r
				key := j.Title + "/" + names[d]
				iops[key] = append(iops[key], r)
				cpuUs[key] = append(cpuUs[key], float64(benchkit.CPUTicks(b.pid)-c0)/benchkit.TicksPerSec*1e6/(r*b.rt.Seconds()))
				switches[key] = append(switches[key], float64(ctxSwitches()-s0)/(r*b.rt.Seconds()))
				if d == 1 {
					st, err := benchkit.Ctl(b.bin, b.sock, "status", "pc")
					if err != nil {
						return err
					}
					var n, s int64
					if i := strings.Index(st, " cached "); i >= 0 {
						fmt.Sscanf(st[i:], " cached %d %d", &n, &s)
					}
					cached[j.Title] = append(cached[j.Title], float64(s)/2048)
					took, err := flush(dev)
					if err != nil {
						return fmt.Errorf("fsync pc: %w", err)
					}
					wb[j.Title] = append(wb[j.Title], took.Seconds()*1000)
				}
				fmt.Fprintf(os.Stderr, "round %d %-32s %-3s %9.0f IOPS\n", round+1, j.Title, names[d], r)
			}
			ratios[j.Title] = append(ratios[j.Title], got[1]/got[0])
		}
	}
	fmt.Fprintf(w, "fio 4 KiB randwrite, O_DIRECT, %d rounds x %v per device, devices interleaved (order flipped every round); took %v; load average at the end: %s.\n\n",
		b.pairs, b.rt, time.Since(t0).Round(time.Second), loadavg())
	fmt.Fprintln(w, "| job | linear IOPS | powercut IOPS | ratio pc/linear (min-max) | daemon CPU µs/write linear | powercut | context switches/write linear | powercut | cached at the end (MiB) | write-back fsync (ms) |")
	fmt.Fprintln(w, "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
	for _, j := range benchkit.RandWriteJobs {
		r := ratios[j.Title]
		if len(r) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | **%.3f** (%.2f-%.2f) | %.1f | %.1f | %.2f | %.2f | %.1f | %.1f |\n", j.Title,
			benchkit.Median(iops[j.Title+"/lin"]), benchkit.Median(iops[j.Title+"/pc"]),
			benchkit.Median(r), slices.Min(r), slices.Max(r),
			benchkit.Median(cpuUs[j.Title+"/lin"]), benchkit.Median(cpuUs[j.Title+"/pc"]),
			benchkit.Median(switches[j.Title+"/lin"]), benchkit.Median(switches[j.Title+"/pc"]),
			benchkit.Median(cached[j.Title]), benchkit.Median(wb[j.Title]))
	}
	fmt.Fprintln(w)
	return nil
}
