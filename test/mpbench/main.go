// Command mpbench measures how dmfuse's multipath selectors spread I/O over
// paths of unequal speed, on a real mount with fio.
//
//	go run ./test/mpbench [-runtime 10s] [-size 64] [-delay 2] [-out FILE]
//
// It needs root, /dev/fuse and fio; it installs nothing. It builds dmfuse,
// mounts a private tmpfs with four backing files and mounts dmfuse on it with
// four path devices, two fast and two slow:
//
//	f1, f2   linear over TMPFS/fN.img
//	s1, s2   delay over TMPFS/sN.img, -delay ms (default 2) on every I/O
//
// and these multipath devices over them (all paths in one priority group):
//
//	rr      round-robin over f1 f2 s1 s2
//	ql      queue-length over f1 f2 s1 s2
//	st      service-time over f1 f2 s1 s2, relative_throughput 1 each
//	st-rt   service-time with relative_throughput set to the paths' real
//	        ratio, measured first with fio (4k randread, QD1) on f1 and s1
//	hst     historical-service-time (defaults) over f1 f2 s1 s2
//	fast    round-robin over f1 f2 only
//
// Each multipath device gets the same fio job, one after the other: 4 KiB
// random reads, O_DIRECT, libaio, 2 jobs of queue depth 16, -runtime long. The
// table gives the total IOPS and, per path, the reads it completed during the
// job (from stats/NAME/stat) and their share. It is printed and written to
// -out. Everything it set up is torn down on exit, on error and on SIGINT or
// SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"

	"golang.org/x/sys/unix"
)

var (
	runtime = flag.Duration("runtime", 10*time.Second, "fio run time per multipath device")
	sizeMiB = flag.Int("size", 64, "size of each path in MiB")
	delayMs = flag.Float64("delay", 2, "delay of the slow paths in ms")
	outFile = flag.String("out", "", "also write the table to this file")
)

var paths = []string{"f1", "f2", "s1", "s2"}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mpbench:", err)
		os.Exit(1)
	}
}

// env is what run sets up; teardown undoes it.
type env struct {
	dir, tmpfs, mnt string
	daemon          *exec.Cmd
	done            chan error
}

func (e *env) teardown() {
	if e.daemon != nil && e.daemon.Process != nil {
		e.daemon.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(20 * time.Second):
			e.daemon.Process.Kill()
			<-e.done
		}
		unix.Unmount(e.mnt, unix.MNT_DETACH)
	}
	if e.tmpfs != "" {
		unix.Unmount(e.tmpfs, unix.MNT_DETACH)
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

func run() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (FUSE and tmpfs mounts)")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		return errors.New("needs fio")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{}
	defer e.teardown()
	var err error
	if e.dir, err = os.MkdirTemp("", "dmfuse-mpbench-"); err != nil {
		return err
	}
	bin := filepath.Join(e.dir, "dmfuse")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/dmfuse").CombinedOutput(); err != nil {
		return fmt.Errorf("building dmfuse (run from the repository root): %v\n%s", err, out)
	}
	e.tmpfs = filepath.Join(e.dir, "tmpfs")
	os.MkdirAll(e.tmpfs, 0o755)
	if err := unix.Mount("tmpfs", e.tmpfs, "tmpfs", 0, fmt.Sprintf("size=%dm", 4*(*sizeMiB)+16)); err != nil {
		e.tmpfs = ""
		return fmt.Errorf("mounting tmpfs: %w", err)
	}
	size := int64(*sizeMiB) << 20
	for _, p := range paths {
		f, err := os.Create(filepath.Join(e.tmpfs, p+".img"))
		if err != nil {
			return err
		}
		// Allocated, not sparse, so that reads copy real pages.
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
		f.Close()
		if err != nil {
			return err
		}
	}
	sectors := size / 512
	dms := strconv.FormatFloat(*delayMs, 'f', -1, 64)
	var cfg strings.Builder
	for _, p := range paths {
		img := filepath.Join(e.tmpfs, p+".img")
		if p[0] == 'f' {
			fmt.Fprintf(&cfg, "%s,,,rw,0 %d linear %s 0;\n", p, sectors, img)
		} else {
			fmt.Fprintf(&cfg, "%s,,,rw,0 %d delay %s 0 %s;\n", p, sectors, img, dms)
		}
	}
	cfgPath := filepath.Join(e.dir, "mp.conf")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		return err
	}
	e.mnt = filepath.Join(e.dir, "mnt")
	e.daemon = exec.Command(bin, "mount", "--config", cfgPath, "--control", filepath.Join(e.dir, "ctl.sock"), e.mnt)
	e.daemon.Stderr = os.Stderr
	e.daemon.Env = append(os.Environ(), "XDG_STATE_HOME="+filepath.Join(e.dir, "state"))
	if err := e.daemon.Start(); err != nil {
		e.daemon = nil
		return err
	}
	e.done = make(chan error, 1)
	go func() { e.done <- e.daemon.Wait() }()
	if err := waitMount(ctx, e); err != nil {
		return err
	}
	ctl := func(args ...string) error {
		out, err := exec.Command(bin, append([]string{"--control", filepath.Join(e.dir, "ctl.sock")}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("dmfuse %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}

	// The paths' real ratio, for service-time's relative_throughput.
	fastLat, err := fioLatency(ctx, filepath.Join(e.mnt, "f1"))
	if err != nil {
		return err
	}
	slowLat, err := fioLatency(ctx, filepath.Join(e.mnt, "s1"))
	if err != nil {
		return err
	}
	ratio := slowLat / fastLat
	rtSlow := max(1, int(math.Round(100/ratio)))
	fmt.Printf("QD1 4k randread mean latency: fast %.1f us, slow %.1f us, ratio %.1f -> relative_throughput 100 (fast) : %d (slow)\n",
		fastLat/1e3, slowLat/1e3, ratio, rtSlow)

	devs := []struct{ name, table string }{
		{"rr", fmt.Sprintf("0 %d multipath 0 0 1 1 round-robin 0 4 1 f1 1 f2 1 s1 1 s2 1", sectors)},
		{"ql", fmt.Sprintf("0 %d multipath 0 0 1 1 queue-length 0 4 1 f1 1 f2 1 s1 1 s2 1", sectors)},
		{"st", fmt.Sprintf("0 %d multipath 0 0 1 1 service-time 0 4 2 f1 1 1 f2 1 1 s1 1 1 s2 1 1", sectors)},
		{"st-rt", fmt.Sprintf("0 %d multipath 0 0 1 1 service-time 0 4 2 f1 1 100 f2 1 100 s1 1 %d s2 1 %d", sectors, rtSlow, rtSlow)},
		{"hst", fmt.Sprintf("0 %d multipath 0 0 1 1 historical-service-time 0 4 1 f1 1 f2 1 s1 1 s2 1", sectors)},
		{"fast", fmt.Sprintf("0 %d multipath 0 0 1 1 round-robin 0 2 1 f1 1 f2 1", sectors)},
	}
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "4 KiB randread, O_DIRECT, libaio, 2 jobs x QD16, %s per device; slow paths: delay %s ms; st-rt: relative_throughput 100:100:%d:%d\n\n",
		*runtime, dms, rtSlow, rtSlow)
	fmt.Fprintf(&tbl, "| multipath | selector | IOPS | f1 reads | f2 reads | s1 reads | s2 reads | fast share | slow share |\n")
	fmt.Fprintf(&tbl, "|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, d := range devs {
		if err := ctl("create", d.name, "--table", d.table); err != nil {
			return err
		}
		before, err := pathReads(e.mnt)
		if err != nil {
			return err
		}
		iops, err := fioIOPS(ctx, filepath.Join(e.mnt, d.name))
		if err != nil {
			return err
		}
		after, err := pathReads(e.mnt)
		if err != nil {
			return err
		}
		var n [4]uint64
		var total uint64
		for i := range paths {
			n[i] = after[i] - before[i]
			total += n[i]
		}
		share := func(a, b uint64) string {
			if total == 0 {
				return "-"
			}
			return fmt.Sprintf("%.3f", float64(a+b)/float64(total))
		}
		sel := strings.Fields(d.table)[7]
		fmt.Fprintf(&tbl, "| %s | %s | %.0f | %d | %d | %d | %d | %s | %s |\n", d.name, sel, iops, n[0], n[1], n[2], n[3],
			share(n[0], n[1]), share(n[2], n[3]))
		if err := ctl("remove", d.name); err != nil {
			return err
		}
	}
	fmt.Print(tbl.String())
	if *outFile != "" {
		return os.WriteFile(*outFile, []byte(tbl.String()), 0o644)
	}
	return nil
}

// waitMount waits until the daemon serves its mount.
func waitMount(ctx context.Context, e *env) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.ReadFile(filepath.Join(e.mnt, "stats", "diskstats")); err == nil {
			return nil
		}
		select {
		case err := <-e.done:
			e.done <- err
			return fmt.Errorf("dmfuse exited before mounting: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("dmfuse did not mount within 20s")
		}
	}
}

// pathReads reads the completed-reads field of each path's stat file.
func pathReads(mnt string) ([]uint64, error) {
	var out []uint64
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(mnt, "stats", p, "stat"))
		if err != nil {
			return nil, err
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return nil, fmt.Errorf("%s: empty stat", p)
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func fio(ctx context.Context, file string, jobs, depth int, rt time.Duration) (*benchkit.FioJob, error) {
	args := []string{"--name=mp", "--filename=" + file, "--direct=1", "--rw=randread", "--bs=4k", "--ioengine=libaio",
		fmt.Sprintf("--iodepth=%d", depth), fmt.Sprintf("--numjobs=%d", jobs), "--time_based",
		fmt.Sprintf("--runtime=%dms", rt.Milliseconds()), "--group_reporting", "--output-format=json"}
	out, err := exec.CommandContext(ctx, "fio", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("fio on %s: %w", file, err)
	}
	return benchkit.ParseFio(out)
}

// fioIOPS runs the measured job: 2 jobs x QD16.
func fioIOPS(ctx context.Context, file string) (float64, error) {
	r, err := fio(ctx, file, 2, 16, *runtime)
	if err != nil {
		return 0, err
	}
	return r.Read.IOPS, nil
}

// fioLatency returns the mean latency in ns of 4k random reads at QD1.
func fioLatency(ctx context.Context, file string) (float64, error) {
	r, err := fio(ctx, file, 1, 1, 3*time.Second)
	if err != nil {
		return 0, err
	}
	return r.Read.Lat.Mean, nil
}
