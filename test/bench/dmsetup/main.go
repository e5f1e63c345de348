// Command dmsetup measures dmfuse's dmsetup personality: what the block
// device /dev/mapper/NAME costs against the same device's file on the
// daemon's mount, and how long the first `dmsetup create` takes when no
// daemon runs.
//
//	go run ./test/bench/dmsetup [-rounds N] [-runtime D] [-size MIB] [-starts N] [-transports T,...]
//
// It needs root, /dev/fuse, loop devices and fio; it installs nothing. It
// builds dmfuse, links it as dmsetup in a private folder, and uses a
// private system instance (DMFUSE_RUN_DIR) so that it never touches
// /run/dmfuse. The backing file (-size MiB, filled) is on a private tmpfs.
//
// Start-up: -starts times, with no daemon running, it times
// `dmsetup create bench --table "0 N linear FILE 0"` from the command's
// start until a 4 KiB O_DIRECT read of /dev/mapper/bench succeeds, then
// removes the device and stops the daemon.
//
// It does both for each transport of -transports (dev, uring, auto: the
// daemon's DMFUSE_TRANSPORT). For uring it switches the fuse module's
// enable_uring on for as long as each daemon takes to mount (a connection
// keeps the transport it got at mount), and puts the old value back at once.
//
// I/O: with one daemon and the device bench, fio runs 4 KiB O_DIRECT
// randread and randwrite at QD1 (psync, 1 job) and at 2 jobs x QD32
// (libaio), on the device's file (MOUNT/bench) and on /dev/mapper/bench, in
// -rounds interleaved rounds (the target that goes first alternates). It
// prints the median IOPS of each and the median over the rounds of the
// per-round ratio block/file, with the smallest and largest; and, per I/O,
// the machine's context switches and BLOCK softirqs during each run, which
// show what the loop device adds. Everything it set up is torn down on
// exit, on error and on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

type job struct {
	name    string
	rw      string
	engine  string
	jobs    int
	iodepth int
}

var jobs = []job{
	{"randread psync QD1", "randread", "psync", 1, 1},
	{"randwrite psync QD1", "randwrite", "psync", 1, 1},
	{"randread libaio 2x32", "randread", "libaio", 2, 32},
	{"randwrite libaio 2x32", "randwrite", "libaio", 2, 32},
}

func main() {
	rounds := flag.Int("rounds", 3, "interleaved rounds of the fio jobs")
	runtime := flag.Duration("runtime", 5*time.Second, "fio runtime of each run")
	size := flag.Int("size", 256, "device size in MiB")
	starts := flag.Int("starts", 10, "timed starts of the daemon")
	transports := flag.String("transports", "dev,uring", "the daemon's FUSE transports, one after the other (DMFUSE_TRANSPORT: auto, uring or dev)")
	flag.Parse()
	for i, transport := range strings.Split(*transports, ",") {
		if i > 0 {
			fmt.Println()
		}
		if err := run(*rounds, *runtime, *size, *starts, transport); err != nil {
			fmt.Fprintln(os.Stderr, "dmsetup bench:", err)
			os.Exit(1)
		}
	}
}

// bench is the private setup.
type bench struct {
	bin, dmsetup, run, img string
	env                    []string
	sectors                int64
	uring                  bool
}

func (b *bench) cmd(name string, args ...string) error {
	c := exec.Command(name, args...)
	c.Env = b.env
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return nil
}

// create creates the device bench, which starts a daemon if none runs.
func (b *bench) create() error {
	if b.uring {
		restore, err := benchkit.EnableURing()
		if err != nil {
			return err
		}
		defer restore()
	}
	return b.cmd(b.dmsetup, "create", "bench", "--table", fmt.Sprintf("0 %d linear %s 0", b.sectors, b.img))
}

// stop removes every device and stops the daemon.
func (b *bench) stop() {
	b.cmd(b.dmsetup, "remove_all")
	b.cmd(b.bin, "stop")
}

// usable reports whether a 4 KiB direct read of dev succeeds.
func usable(dev string, buf []byte) bool {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	n, err := unix.Pread(fd, buf, 0)
	return err == nil && n == len(buf)
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptr(unsafe.Pointer(&b[0]))&4095)
	return b[off : off+n]
}

func run(rounds int, rt time.Duration, sizeMiB, starts int, transport string) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if _, err := os.Stat("/dev/mapper/bench"); err == nil {
		return errors.New("/dev/mapper/bench exists already")
	}
	work, err := os.MkdirTemp("", "dmfuse-dmsetup-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	b := &bench{bin: filepath.Join(work, "dmfuse"), dmsetup: filepath.Join(work, "dmsetup"), run: filepath.Join(work, "run")}
	if out, err := exec.Command("go", "build", "-o", b.bin, "./cmd/dmfuse").CombinedOutput(); err != nil {
		return fmt.Errorf("go build (run from the repository root): %v\n%s", err, out)
	}
	if err := os.Symlink(b.bin, b.dmsetup); err != nil {
		return err
	}
	b.env = append(os.Environ(), "DMFUSE_RUN_DIR="+b.run, "DMFUSE_TRANSPORT="+transport)
	b.uring = transport == "uring"
	tmpfs := filepath.Join(work, "tmpfs")
	os.Mkdir(tmpfs, 0o755)
	if err := unix.Mount("tmpfs", tmpfs, "tmpfs", 0, fmt.Sprintf("size=%dm", sizeMiB+16)); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	defer unix.Unmount(tmpfs, unix.MNT_DETACH)
	b.img = filepath.Join(tmpfs, "bench.img")
	b.sectors = int64(sizeMiB) << 11
	if err := benchkit.Fill(b.img, int64(sizeMiB)<<20); err != nil {
		return err
	}
	defer b.stop()

	// Start-up.
	buf := alignedBuf(4096)
	var times []float64
	for i := 0; i < starts && ctx.Err() == nil; i++ {
		b.stop()
		t0 := time.Now()
		if err := b.create(); err != nil {
			return err
		}
		for !usable("/dev/mapper/bench", buf) {
			if time.Since(t0) > 10*time.Second {
				return errors.New("/dev/mapper/bench not usable within 10 s")
			}
			time.Sleep(time.Millisecond)
		}
		d := time.Since(t0)
		times = append(times, float64(d.Microseconds())/1000)
		fmt.Fprintf(os.Stderr, "start %d: %.1f ms\n", i+1, times[len(times)-1])
	}

	if rounds == 0 {
		fmt.Printf("transport %s: first `dmsetup create` with no daemon until /dev/mapper/bench reads, %d starts: median %.1f ms, min %.1f ms, max %.1f ms\n",
			transport, len(times), benchkit.Median(times), slices.Min(times), slices.Max(times))
		return nil
	}

	// I/O.
	b.stop()
	if err := b.create(); err != nil {
		return err
	}
	// What the daemon says it got.
	var got string
	if log, err := os.ReadFile(filepath.Join(b.run, "daemon.log")); err == nil {
		for _, l := range strings.Split(string(log), "\n") {
			if i := strings.Index(l, "dmfuse: transport "); i >= 0 {
				got = l[i+len("dmfuse: "):]
			}
		}
	}
	file := filepath.Join(b.run, "mnt", "bench")
	targets := []string{file, "/dev/mapper/bench"}
	iops := map[string][]float64{}
	perIO := map[string][]result{}
	ratios := map[string][]float64{}
	for round := 0; round < rounds; round++ {
		for _, j := range jobs {
			got := map[string]float64{}
			for k := range targets {
				target := targets[(k+round)%2]
				res, err := fio(ctx, target, j, rt)
				if err != nil {
					return err
				}
				got[target] = res.iops
				iops[j.name+target] = append(iops[j.name+target], res.iops)
				perIO[j.name+target] = append(perIO[j.name+target], res)
				fmt.Fprintf(os.Stderr, "round %d %-15s %-40s %9.0f IOPS, %.2f context switches and %.2f BLOCK softirqs per I/O\n",
					round+1, j.name, target, res.iops, res.cs, res.softirqs)
			}
			ratios[j.name] = append(ratios[j.name], got[targets[1]]/got[targets[0]])
		}
	}
	var load string
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	fmt.Printf("kernel %s, fio %s, %d CPUs, load average %s at the end; DMFUSE_TRANSPORT=%s (daemon: %q); %d MiB linear device over a tmpfs file; fio 4 KiB O_DIRECT, %d rounds x %v\n\n",
		benchkit.Kernel(), benchkit.FioVersion(), runtime.NumCPU(), load, transport, got, sizeMiB, rounds, rt)
	fmt.Println("| job | file MOUNT/bench IOPS | /dev/mapper/bench IOPS | ratio block/file (rounds' range) |")
	fmt.Println("|---|---:|---:|---:|")
	for _, j := range jobs {
		r := ratios[j.name]
		fmt.Printf("| %s | %.0f | %.0f | **%.2f** (%.2f-%.2f) |\n", j.name, benchkit.Median(iops[j.name+targets[0]]),
			benchkit.Median(iops[j.name+targets[1]]), benchkit.Median(r), slices.Min(r), slices.Max(r))
	}
	median := func(rs []result, f func(result) float64) float64 {
		var v []float64
		for _, r := range rs {
			v = append(v, f(r))
		}
		return benchkit.Median(v)
	}
	cs := func(r result) float64 { return r.cs }
	si := func(r result) float64 { return r.softirqs }
	fmt.Println("\nPer I/O, medians over the rounds (the whole machine's counts, so other processes' count too):")
	fmt.Println()
	fmt.Println("| job | file: context switches | block: context switches | file: BLOCK softirqs | block: BLOCK softirqs |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, j := range jobs {
		f, b := perIO[j.name+targets[0]], perIO[j.name+targets[1]]
		fmt.Printf("| %s | %.2f | %.2f | %.2f | %.2f |\n", j.name, median(f, cs), median(b, cs), median(f, si), median(b, si))
	}
	fmt.Printf("\ntransport %s: first `dmsetup create` with no daemon until /dev/mapper/bench reads, %d starts: median %.1f ms, min %.1f ms, max %.1f ms\n",
		transport, len(times), benchkit.Median(times), slices.Min(times), slices.Max(times))
	return nil
}

// kernelCounts are the machine's context switches (/proc/stat ctxt) and
// BLOCK softirqs (/proc/softirqs, all CPUs) so far.
func kernelCounts() (cs, blockSoftirqs float64) {
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "ctxt" {
				fmt.Sscan(f[1], &cs)
			}
		}
	}
	if b, err := os.ReadFile("/proc/softirqs"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "BLOCK:" {
				for _, v := range f[1:] {
					var n float64
					fmt.Sscan(v, &n)
					blockSoftirqs += n
				}
			}
		}
	}
	return cs, blockSoftirqs
}

// result is one fio run: IOPS, and the machine's context switches and
// BLOCK softirqs per I/O during it (IOPS x runtime I/Os; other processes'
// count too).
type result struct{ iops, cs, softirqs float64 }

// fio runs one job on target.
func fio(ctx context.Context, target string, j job, rt time.Duration) (result, error) {
	cmd := exec.CommandContext(ctx, "fio", "--name="+j.rw, "--filename="+target, "--rw="+j.rw, "--bs=4k",
		"--direct=1", "--ioengine="+j.engine, fmt.Sprintf("--iodepth=%d", j.iodepth), fmt.Sprintf("--numjobs=%d", j.jobs),
		"--group_reporting", "--time_based", fmt.Sprintf("--runtime=%ds", int(rt.Seconds())), "--output-format=json")
	cs0, si0 := kernelCounts()
	out, err := cmd.Output()
	cs1, si1 := kernelCounts()
	if err != nil {
		return result{}, fmt.Errorf("fio %s on %s: %v", j.name, target, err)
	}
	r, err := benchkit.ParseFio(out)
	if err != nil {
		return result{}, err
	}
	res := result{iops: r.Read.IOPS}
	if strings.HasPrefix(j.rw, "randwrite") {
		res.iops = r.Write.IOPS
	}
	if ios := res.iops * rt.Seconds(); ios > 0 {
		res.cs, res.softirqs = (cs1-cs0)/ios, (si1-si0)/ios
	}
	return res, nil
}
