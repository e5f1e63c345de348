// Command logwrites measures what recording with the log-writes target
// costs, and how fast `dmfuse replay-log` replays a log, in one run.
//
//	go run ./test/bench/logwrites [-pairs N] [-runtime D] [-size MIB] [-replay-mib MIB] [-transport T] [-xfstests BIN] [-out FILE]
//
// It needs root, /dev/fuse, fio and go; it installs nothing. It builds
// dmfuse, mounts a private tmpfs for every backing file and log, and mounts
// dmfuse with one device, base (linear over a filled file of -size MiB).
//
// Recording cost: four fio jobs, 4 KiB random writes with O_DIRECT, psync
// QD1 and libaio 2 jobs x QD32, each without flushes and with an fsync every
// 32 writes (fio --fsync=32), run on base and on lw, a log-writes device
// over another filled file of the same size with its log on the tmpfs. lw
// is created afresh for each run (so its log starts over) and removed after
// it; the removal, which writes out what is left, is timed apart. The two
// setups alternate, in an order that flips every round, for -pairs rounds;
// the table gives the median IOPS of each, the median of the per-round
// ratios lw/base, and the daemon's CPU time (utime+stime) per write.
//
// Replay rate: for each of 4 KiB and 128 KiB writes, a log-writes device of
// -replay-mib MiB over a sparse file records fio random writes (2 jobs x
// QD32, an fsync every 256 writes, each job writing every block of its half
// once, so that no two writes in flight overlap), the device is removed, and
// `dmfuse replay-log` replays the whole log onto a new sparse file; the
// result must equal the data file. The table gives entries, log size, time,
// entries/s, MiB/s of data, the same per second of CPU time of the
// replay-log process (user and system; less sensitive than wall time to
// other work on the machine), and its largest resident size (the log is
// read through a window of fixed size). With -xfstests, xfstests' own
// replay-log replays each log as well, and must give the same bytes. Each
// replay goes onto a new sparse file; each tool replays each log twice, in
// the order dmfuse, xfstests, xfstests, dmfuse, and the table gives the
// means.
//
// Everything it set up is torn down on exit, on error and on SIGINT or
// SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

func main() {
	pairs := flag.Int("pairs", 3, "interleaved rounds of the recording table")
	rt := flag.Duration("runtime", 10*time.Second, "fio runtime of each recording run")
	size := flag.Int("size", 1024, "size of each device in MiB")
	replayMiB := flag.Int("replay-mib", 1100, "MiB written into each log that is replayed")
	transport := flag.String("transport", "dev", "dmfuse --transport")
	out := flag.String("out", "", "also write the tables to this file")
	xfs := flag.String("xfstests", "", "an xfstests src/log-writes/replay-log binary: replay each log with it too, and compare")
	flag.Parse()
	b := &bench{pairs: *pairs, rt: *rt, sizeMiB: *size, replayMiB: *replayMiB, transport: *transport, xfstests: *xfs}
	benchkit.Main("logwrites", *out, b.run)
}

type bench struct {
	pairs             int
	rt                time.Duration
	sizeMiB           int
	replayMiB         int
	transport         string
	work, tmpfs, bin  string
	sock, mnt         string
	ctx               context.Context
	sectors           int64
	data, logf, saved string
	pid               int // the daemon
	xfstests          string
}

// cpuTicks returns the daemon's CPU time in clock ticks.
func (b *bench) cpuTicks() int64 { return benchkit.CPUTicks(b.pid) }

func (b *bench) run(w io.Writer) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	b.ctx = ctx
	if b.work, err = os.MkdirTemp("", "dmfuse-logwrites-bench-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.work)
	b.bin = filepath.Join(b.work, "dmfuse")
	if out, err := exec.Command("go", "build", "-o", b.bin, "./cmd/dmfuse").CombinedOutput(); err != nil {
		return fmt.Errorf("go build (run from the repository root): %v\n%s", err, out)
	}
	b.tmpfs = filepath.Join(b.work, "tmpfs")
	b.mnt = filepath.Join(b.work, "mnt")
	os.Mkdir(b.tmpfs, 0o755)
	// Two data files, the replay target, and the log (sparse: only what a
	// run writes takes memory).
	tsize := 16 << 10
	if err := unix.Mount("tmpfs", b.tmpfs, "tmpfs", 0, fmt.Sprintf("size=%dm", tsize)); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	defer unix.Unmount(b.tmpfs, unix.MNT_DETACH)
	b.sectors = int64(b.sizeMiB) << 11
	base := filepath.Join(b.tmpfs, "base.img")
	b.data = filepath.Join(b.tmpfs, "data.img")
	b.logf = filepath.Join(b.tmpfs, "log.img")
	b.saved = filepath.Join(b.tmpfs, "replayed.img")
	for _, f := range []string{base, b.data} {
		if err := benchkit.Fill(f, int64(b.sizeMiB)<<20); err != nil {
			return err
		}
	}
	if err := os.WriteFile(b.logf, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(b.logf, 12<<30); err != nil {
		return err
	}
	cfg := filepath.Join(b.work, "bench.conf")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "base,,,rw,0 %d linear %s 0;\n", b.sectors, base), 0o644); err != nil {
		return err
	}
	b.sock = filepath.Join(b.work, "ctl.sock")
	srv, err := benchkit.StartServer("dmfuse", b.mnt, nil, b.bin, "mount", "--config", cfg, "--control", b.sock, "--transport", b.transport, b.mnt)
	if err != nil {
		return err
	}
	defer srv.Stop(30 * time.Second)
	b.pid = srv.Pid
	if err := srv.WaitReady(ctx, benchkit.FileReady(filepath.Join(b.mnt, "base"))); err != nil {
		return err
	}

	fmt.Fprintf(w, "Machine: %d CPUs, kernel %s, fio %s, %s; devices of %d MiB over tmpfs files, transport %s.\n\n",
		runtime.NumCPU(), benchkit.Kernel(), benchkit.FioVersion(), runtime.Version(), b.sizeMiB, b.transport)
	if err := b.recording(w); err != nil {
		return err
	}
	return b.replays(w)
}

// ctl runs a dmfuse control command.
func (b *bench) ctl(args ...string) (string, error) { return benchkit.Ctl(b.bin, b.sock, args...) }

func (b *bench) createLW() error { return b.createLWOver(b.data, b.sectors) }

func (b *bench) createLWOver(data string, sectors int64) error {
	_, err := b.ctl("create", "lw", "--table", fmt.Sprintf("0 %d log-writes %s %s", sectors, data, b.logf))
	return err
}

// removeLW removes lw (its teardown writes out what is still held) and
// returns how long that took and how many entries the log then holds.
func (b *bench) removeLW() (time.Duration, uint64, error) {
	t0 := time.Now()
	for {
		_, err := b.ctl("remove", "lw")
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "device is open") || time.Since(t0) > 10*time.Second {
			return 0, 0, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	d := time.Since(t0)
	out, err := exec.Command(b.bin, "replay-log", "--log", b.logf, "--num-entries").Output()
	if err != nil {
		return 0, 0, fmt.Errorf("replay-log --num-entries: %v", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	return d, n, err
}

// fio runs one job on dev and returns its write IOPS.
func (b *bench) fio(dev string, rt time.Duration, extra ...string) (float64, error) {
	return benchkit.FioRandWrite(b.ctx, dev, rt, extra...)
}

func (b *bench) recording(w io.Writer) error {
	base := filepath.Join(b.mnt, "base")
	lw := filepath.Join(b.mnt, "lw")
	iops := map[string][]float64{}
	ratios := map[string][]float64{}
	teardown := map[string][]float64{}
	entries := map[string][]float64{}
	cpuUs := map[string][]float64{} // daemon CPU µs per write, job/setup
	for round := range b.pairs {
		for _, j := range benchkit.RandWriteJobs {
			got := map[bool]float64{}
			for k := range 2 {
				onLW := (k+round)%2 == 1
				dev := base
				if onLW {
					if err := b.createLW(); err != nil {
						return err
					}
					dev = lw
				}
				c0 := b.cpuTicks()
				r, err := b.fio(dev, b.rt, j.Args...)
				if err != nil {
					return err
				}
				got[onLW] = r
				setup := map[bool]string{false: "/base", true: "/lw"}[onLW]
				cpuUs[j.Title+setup] = append(cpuUs[j.Title+setup], float64(b.cpuTicks()-c0)/benchkit.TicksPerSec*1e6/(r*b.rt.Seconds()))
				if onLW {
					td, n, err := b.removeLW()
					if err != nil {
						return err
					}
					if float64(n) < 0.95*r*b.rt.Seconds() {
						return fmt.Errorf("%s: the log holds %d entries after %.0f IOPS for %v: it stopped (log device full?)", j.Title, n, r, b.rt)
					}
					teardown[j.Title] = append(teardown[j.Title], td.Seconds())
					entries[j.Title] = append(entries[j.Title], float64(n))
				}
				fmt.Fprintf(os.Stderr, "round %d %-34s %-4s %9.0f IOPS\n", round+1, j.Title, map[bool]string{false: "base", true: "lw"}[onLW], r)
			}
			iops[j.Title+"/base"] = append(iops[j.Title+"/base"], got[false])
			iops[j.Title+"/lw"] = append(iops[j.Title+"/lw"], got[true])
			ratios[j.Title] = append(ratios[j.Title], got[true]/got[false])
		}
	}
	fmt.Fprintf(w, "Recording cost: fio 4 KiB randwrite, O_DIRECT, %d rounds x %v per setup, setups interleaved.\n\n", b.pairs, b.rt)
	fmt.Fprintln(w, "| job | base IOPS | log-writes IOPS | ratio lw/base | daemon CPU µs/write base | log-writes | entries logged per run | removal (s) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, j := range benchkit.RandWriteJobs {
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.3f | %.1f | %.1f | %.0f | %.2f |\n", j.Title, benchkit.Median(iops[j.Title+"/base"]),
			benchkit.Median(iops[j.Title+"/lw"]), benchkit.Median(ratios[j.Title]), benchkit.Median(cpuUs[j.Title+"/base"]),
			benchkit.Median(cpuUs[j.Title+"/lw"]), benchkit.Median(entries[j.Title]), benchkit.Median(teardown[j.Title]))
	}
	fmt.Fprintln(w)
	return nil
}

// replays records and replays one log per block size.
func (b *bench) replays(w io.Writer) error {
	fmt.Fprintf(w, "Replay rate: `dmfuse replay-log --log LOG --replay FILE` of a whole log, log and target on tmpfs; the log holds fio randwrite (libaio 2x32, fsync every 256 writes, every block of a %d MiB device written once).\n\n", b.replayMiB)
	fmt.Fprintln(w, "| writes | replayed by | entries | log (MiB) | data (MiB) | replay (s) | entries/s | MiB/s of data | CPU (s) | entries per CPU s | MiB per CPU s | max RSS (MiB) |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	data := filepath.Join(b.tmpfs, "rdata.img")
	half := b.replayMiB / 2
	sectors := int64(2*half) << 11
	for _, bs := range []int{4, 128} {
		if err := sparse(data, sectors*512); err != nil {
			return err
		}
		if err := b.createLWOver(data, sectors); err != nil {
			return err
		}
		args := []string{"--name=rec", "--filename=" + filepath.Join(b.mnt, "lw"), "--rw=randwrite", fmt.Sprintf("--bs=%dk", bs),
			"--direct=1", "--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--fsync=256",
			fmt.Sprintf("--size=%dm", half), fmt.Sprintf("--offset_increment=%dm", half), "--group_reporting"}
		if out, err := exec.CommandContext(b.ctx, "fio", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("fio: %v\n%s", err, out)
		}
		if _, _, err := b.removeLW(); err != nil {
			return err
		}
		info, err := exec.Command(b.bin, "replay-log", "--log", b.logf, "--find", "--end-mark", "dm-log-writes-end").Output()
		if err != nil {
			return fmt.Errorf("replay-log --find: %v", err)
		}
		var n, units uint64
		fmt.Sscanf(string(info), "%d@%d", &n, &units)
		n++
		tools := [][]string{{"dmfuse replay-log", b.bin, "replay-log"}}
		if b.xfstests != "" {
			tools = append(tools, []string{"xfstests replay-log", b.xfstests})
		}
		// Each tool replays twice, in the order a b b a, so that neither
		// always goes first onto memory just freed; the row gives the means.
		secs := make([]float64, len(tools))
		cpus := make([]float64, len(tools))
		rss := make([]float64, len(tools))
		order := []int{0, 1, 1, 0}
		if len(tools) == 1 {
			order = []int{0, 0}
		}
		for _, k := range order {
			tool := tools[k]
			if err := sparse(b.saved, sectors*512); err != nil {
				return err
			}
			t0 := time.Now()
			cmd := exec.CommandContext(b.ctx, tool[1], append(tool[2:], "--log", b.logf, "--replay", b.saved)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v\n%s", tool[0], err, out)
			}
			secs[k] += time.Since(t0).Seconds() / 2
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				rss[k] = max(rss[k], float64(ru.Maxrss)/1024)
				cpus[k] += time.Duration(ru.Utime.Nano()+ru.Stime.Nano()).Seconds() / 2
			}
			same, err := sameFiles(b.saved, data)
			if err != nil {
				return err
			}
			if !same {
				return fmt.Errorf("%d KiB writes: the file %s replayed differs from the recorded device", bs, tool[0])
			}
		}
		dataMiB := float64(2 * half)
		logMiB := float64(units*512) / (1 << 20)
		for k, tool := range tools {
			d, cpu := secs[k], cpus[k]
			fmt.Fprintf(w, "| %d KiB | %s | %d | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f | %.0f | %.0f | %.0f |\n", bs, tool[0], n, logMiB, dataMiB, d, float64(n)/d, dataMiB/d, cpu, float64(n)/cpu, dataMiB/cpu, rss[k])
		}
	}
	fmt.Fprintln(w, "\nEach replayed file (a new sparse file for each replay) was compared with the recorded device's data file: equal.")
	return nil
}

// sparse makes path a new sparse file of size bytes.
func sparse(path string, size int64) error {
	os.Remove(path)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return err
	}
	return os.Truncate(path, size)
}

func sameFiles(a, b string) (bool, error) {
	err := exec.Command("cmp", "-s", a, b).Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		return false, nil
	}
	return false, fmt.Errorf("cmp: %v", err)
}
