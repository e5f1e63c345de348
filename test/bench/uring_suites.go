package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// target is one device file measured in the transports suite.
type target struct {
	name string
	c    *config // nil for the loop device
	dev  string
}

// transports runs every job on each config's linear device and on the loop
// device, in interleaved rounds.
func (b *ubench) transports(ctx context.Context) error {
	var ts []target
	for _, c := range b.configs {
		ts = append(ts, target{c.name, c, c.dev("linear")})
	}
	ts = append(ts, target{name: "loop", dev: b.loop})
	res := map[string]map[string][]urun{} // job -> target -> one run a round
	for _, j := range b.jobs {
		res[j.name] = map[string][]urun{}
	}
	runs := b.rounds * len(b.jobs) * len(ts)
	logf("transports: %d fio runs of %v (+%v ramp)", runs, b.runtime, b.ramp(b.runtime))
	start := time.Now()
	for r := range b.rounds {
		for _, j := range b.jobs {
			for _, t := range rotate(ts, r) {
				run, err := b.fio(ctx, j, t.c, t.dev, b.runtime)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", j.name, t.name, err)
				}
				res[j.name][t.name] = append(res[j.name][t.name], run)
			}
		}
		logf("transports: round %d/%d done (%v)", r+1, b.rounds, time.Since(start).Round(time.Second))
	}

	w := &b.w
	ref := b.configs[0].name
	fmt.Fprintf(w, "### Transports\n\nA linear device over the tmpfs file on each daemon, and the loop device over the same file; 4k jobs in IOPS, 1 MiB jobs in MB/s; medians of %d interleaved rounds. A ratio is the median (min-max) of the per-round ratios.\n\n", b.rounds)
	head := []string{"job"}
	for _, t := range ts {
		head = append(head, t.name)
	}
	for _, c := range b.configs[1:] {
		head = append(head, c.name+" / "+ref)
	}
	for _, c := range b.configs {
		head = append(head, c.name+" / loop")
	}
	table(w, head)
	for _, j := range b.jobs {
		row := []string{j.title}
		for _, t := range ts {
			v := medOf(res[j.name][t.name], j.value)
			if j.bw {
				row = append(row, fmt.Sprintf("%.0f MB/s", v))
			} else {
				row = append(row, kilo(v))
			}
		}
		per := func(a, c string) []float64 { return perRound(res[j.name][a], res[j.name][c], j.value) }
		for _, c := range b.configs[1:] {
			row = append(row, ratioCell(per(c.name, ref)))
		}
		for _, c := range b.configs {
			row = append(row, ratioCell(per(c.name, "loop")))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintf(w, "\nLatency (fio's submission to completion) and CPU, medians; daemon CPU is utime+stime of /proc/PID/stat and machine busy all CPUs' non-idle time of /proc/stat, both over the middle 80%% of each run after its ramp, in cores; CPU per 1k IOPS is the daemon's CPU in ms per second divided by thousands of IOPS (= us of daemon CPU per I/O).\n\n")
	table(w, []string{"job", "device", "mean lat", "p99 lat", "daemon CPU", "daemon CPU per 1k IOPS", "machine busy"})
	for _, j := range b.jobs {
		for _, t := range ts {
			rs := res[j.name][t.name]
			cpu, per := "-", "-"
			if t.c != nil {
				cpu = fmt.Sprintf("%.2f", medOf(rs, func(r urun) float64 { return r.cpu }))
				per = fmt.Sprintf("%.1f ms/s", medOf(rs, func(r urun) float64 { return r.cpu * 1e6 / r.iops }))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %.2f |\n", j.title, t.name,
				us(medOf(rs, func(r urun) float64 { return r.meanUs })), us(medOf(rs, func(r urun) float64 { return r.p99Us })),
				cpu, per, medOf(rs, func(r urun) float64 { return r.machine }))
		}
	}
	fmt.Fprintln(w)
	return nil
}

// mpJob is the multipath suite's job, that of test/mpbench.
var mpJob = job{name: "mp-randread", title: "4k randread libaio 2x16",
	args: []string{"--rw=randread", "--bs=4k", "--ioengine=libaio", "--iodepth=16", "--numjobs=2"}}

// multipath runs mpJob on each daemon's hst (historical-service-time over
// f1 and the delayed s1, s2, s3), fast (multipath over f1 alone) and f1 (the
// fast path itself), in interleaved rounds, and counts the reads each path
// completed during the hst runs.
func (b *ubench) multipath(ctx context.Context) error {
	devs := []string{"hst", "fast", "f1"}
	res := map[string]map[string][]urun{} // config -> device -> one run a round
	slow := map[string][]float64{}        // config -> share of the hst run's reads on s1-s3
	for _, c := range b.configs {
		res[c.name] = map[string][]urun{}
	}
	logf("multipath: %d fio runs of %v (+%v ramp)", b.rounds*len(b.configs)*len(devs), b.runtime, b.ramp(b.runtime))
	start := time.Now()
	for r := range b.rounds {
		for _, c := range rotate(b.configs, r) {
			for _, d := range rotate(devs, r) {
				var before []uint64
				if d == "hst" {
					before = pathReads(c)
				}
				run, err := b.fio(ctx, mpJob, c, c.dev(d), b.runtime)
				if err != nil {
					return fmt.Errorf("%s on %s of %s: %w", mpJob.name, d, c.name, err)
				}
				res[c.name][d] = append(res[c.name][d], run)
				if d == "hst" {
					after := pathReads(c)
					var all, sl uint64
					for i := range after {
						n := after[i] - before[i]
						all += n
						if i > 0 {
							sl += n
						}
					}
					if all > 0 {
						slow[c.name] = append(slow[c.name], float64(sl)/float64(all))
					}
				}
			}
		}
		logf("multipath: round %d/%d done (%v)", r+1, b.rounds, time.Since(start).Round(time.Second))
	}

	w := &b.w
	fmt.Fprintf(w, "### Multipath\n\n%s; hst is historical-service-time over f1 (linear over the tmpfs file) and s1, s2, s3 (delay %s ms over it); fast is a multipath device over f1 alone; IOPS medians of %d interleaved rounds, ratios the median (min-max) of the per-round ratios; slow share: the hst runs' reads completed by s1-s3; per read: the whole machine's busy CPU time and context switches over the middle of the hst and fast runs, divided by their reads (medians).\n\n",
		mpJob.title, b.mpDelay, b.rounds)
	table(w, []string{"daemon", "hst", "fast", "f1", "hst / fast", "hst / f1", "slow share", "daemon CPU in hst", "machine us / read hst (fast)", "switches / read hst (fast)"})
	for _, c := range b.configs {
		rs := res[c.name]
		per := func(a, d string) []float64 { return perRound(rs[a], rs[d], mpJob.value) }
		usPer := func(r urun) float64 { return r.machine / r.iops * 1e6 }
		swPer := func(r urun) float64 { return r.switches / r.iops }
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.2f | %.1f (%.1f) | %.3f (%.3f) |\n", c.name,
			kilo(medOf(rs["hst"], mpJob.value)), kilo(medOf(rs["fast"], mpJob.value)), kilo(medOf(rs["f1"], mpJob.value)),
			ratioCell(per("hst", "fast")), ratioCell(per("hst", "f1")), pctCell(slow[c.name]),
			medOf(rs["hst"], func(r urun) float64 { return r.cpu }),
			medOf(rs["hst"], usPer), medOf(rs["fast"], usPer), medOf(rs["hst"], swPer), medOf(rs["fast"], swPer))
	}
	fmt.Fprintln(w)
	return nil
}

// pathReads returns the completed reads of f1, s1, s2 and s3 of config c
// (zeros where a stat file cannot be read).
func pathReads(c *config) []uint64 {
	out := make([]uint64, 4)
	for i, p := range []string{"f1", "s1", "s2", "s3"} {
		s, err := os.ReadFile(filepath.Join(c.mnt, "stats", p, "stat"))
		if f := strings.Fields(string(s)); err == nil && len(f) > 0 {
			out[i], _ = strconv.ParseUint(f[0], 10, 64)
		}
	}
	return out
}

// delayRow is one row of the delay suite.
type delayRow struct {
	job   job
	dev   string
	delay time.Duration
	deep  bool // 2 x QD32: the ceiling is 64 / delay
}

var delayRows = []delayRow{
	{job: jobNamed("randread"), dev: "d1", delay: time.Millisecond},
	{job: jobNamed("randwrite"), dev: "d1", delay: time.Millisecond},
	{job: jobNamed("randread"), dev: "d10", delay: 10 * time.Millisecond},
	{job: jobNamed("uring-randwrite"), dev: "d10", delay: 10 * time.Millisecond, deep: true},
}

// delayResult is what one row measured on one daemon in one round.
type delayResult struct {
	run     urun
	idle    urun    // d0 with the delay as think time (QD1 rows)
	ceiling float64 // IOPS
}

// delay runs each delay row on every daemon, each QD1 row right after the
// same job on the zero-delay device d0 with fio idling the row's delay
// between I/Os: the ceiling is 1 / (delay + that run's mean completion
// latency). The deep row's ceiling is 64 / delay.
func (b *ubench) delay(ctx context.Context) error {
	res := map[string][][]delayResult{} // config -> row -> one a round
	for _, c := range b.configs {
		res[c.name] = make([][]delayResult, len(delayRows))
	}
	logf("delay: %d rows x %d daemons x %d rounds, %v (+%v ramp) each, QD1 rows after a run of %v on d0",
		len(delayRows), len(b.configs), b.rounds, b.delayRuntime, b.ramp(b.delayRuntime), b.runtime)
	start := time.Now()
	for r := range b.rounds {
		for i, row := range delayRows {
			for _, c := range rotate(b.configs, r) {
				var d delayResult
				var err error
				if row.deep {
					d.ceiling = 64 / row.delay.Seconds()
				} else {
					think := fmt.Sprintf("--thinktime=%dus", row.delay.Microseconds())
					if d.idle, err = b.fio(ctx, row.job, c, c.dev("d0"), b.runtime, think, "--thinktime_blocks=1"); err != nil {
						return fmt.Errorf("%s with think time on d0 of %s: %w", row.job.name, c.name, err)
					}
					d.ceiling = 1e6 / (float64(row.delay.Microseconds()) + d.idle.clatUs)
				}
				if d.run, err = b.fio(ctx, row.job, c, c.dev(row.dev), b.delayRuntime); err != nil {
					return fmt.Errorf("%s on %s of %s: %w", row.job.name, row.dev, c.name, err)
				}
				res[c.name][i] = append(res[c.name][i], d)
			}
		}
		logf("delay: round %d/%d done (%v)", r+1, b.rounds, time.Since(start).Round(time.Second))
	}

	w := &b.w
	fmt.Fprintf(w, "### Delay\n\nDelay devices over the tmpfs file. A QD1 row's ceiling is 1 / (delay + the mean completion latency of the zero-delay device d0 running the same job with fio's --thinktime equal to the delay), measured on the same daemon right before the row in each round; the 2x32 row's ceiling is 64 / delay. IOPS and ceiling are medians of %d interleaved rounds; share of ceiling the median (min-max) of the per-round shares.\n\n", b.rounds)
	table(w, []string{"job", "delay", "daemon", "IOPS", "ceiling", "share of ceiling", "goal", "d0 after idling (mean clat)", "late (mean clat - delay)", "daemon CPU"})
	for i, row := range delayRows {
		goal := "97%"
		switch {
		case row.deep:
			goal = "95%"
		case row.delay >= 10*time.Millisecond:
			goal = "99%"
		}
		for _, c := range b.configs {
			ds := res[c.name][i]
			var runs, idles []urun
			var ceil, share []float64
			for _, d := range ds {
				runs, idles = append(runs, d.run), append(idles, d.idle)
				ceil = append(ceil, d.ceiling)
				share = append(share, d.run.iops/d.ceiling)
			}
			idle := "-"
			if !row.deep {
				idle = us(medOf(idles, func(r urun) float64 { return r.clatUs }))
			}
			late := us(medOf(runs, func(r urun) float64 { return r.clatUs }) - float64(row.delay.Microseconds()))
			fmt.Fprintf(w, "| %s | %v | %s | %.0f | %.0f | %s | %s | %s | %s | %.2f |\n", row.job.title, row.delay, c.name,
				medOf(runs, func(r urun) float64 { return r.iops }), benchkit.Median(ceil), pctCell(share), goal, idle, late,
				medOf(runs, func(r urun) float64 { return r.cpu }))
		}
	}
	fmt.Fprintln(w)
	return nil
}

// idleCPU measures, for each daemon in turn, a QD1 randread run on its
// linear device (CPU per 1k IOPS) and then its CPU while nothing does I/O
// for b.idle: in the first second and after it, from /proc/PID/stat (10 ms
// ticks) and from the threads' schedstat (nanoseconds, and how often a
// thread ran: the daemon's wake-ups).
func (b *ubench) idleCPU(ctx context.Context) error {
	type idleResult struct {
		load          urun
		first, steady float64 // ms of CPU in the first second; ms/s after it (ticks)
		exact, runs   float64 // ms/s and thread runs a second after it (schedstat)
	}
	var out []idleResult
	logf("idle: %d daemons, %v of QD1 load then %v idle each", len(b.configs), b.runtime, b.idle)
	for _, c := range b.configs {
		var ir idleResult
		var err error
		if ir.load, err = b.fio(ctx, jobNamed("randread"), c, c.dev("linear"), b.runtime); err != nil {
			return fmt.Errorf("QD1 load on %s: %w", c.name, err)
		}
		c0, t0 := benchkit.CPUTime(c.pid), time.Now()
		if err := benchkit.Sleep(ctx, time.Second); err != nil {
			return err
		}
		c1, t1 := benchkit.CPUTime(c.pid), time.Now()
		x1, r1 := benchkit.ThreadCPU(c.pid)
		if err := benchkit.Sleep(ctx, b.idle-time.Since(t0)); err != nil {
			return err
		}
		c2, t2 := benchkit.CPUTime(c.pid), time.Now()
		x2, r2 := benchkit.ThreadCPU(c.pid)
		ir.first = float64((c1 - c0).Microseconds()) / 1e3 / t1.Sub(t0).Seconds()
		ir.steady = float64((c2 - c1).Microseconds()) / 1e3 / t2.Sub(t1).Seconds()
		ir.exact = float64((x2 - x1).Microseconds()) / 1e3 / t2.Sub(t1).Seconds()
		ir.runs = float64(r2-r1) / t2.Sub(t1).Seconds()
		out = append(out, ir)
	}

	w := &b.w
	fmt.Fprintf(w, "### Daemon CPU, idle and at QD1\n\nFor each daemon in turn: %s on its linear device for %v (daemon CPU over the middle of the run), then no I/O for %v: daemon CPU in the first second after the load stopped and over the rest, from utime+stime of /proc/PID/stat (10 ms ticks) and, after the first second, from the threads' /proc/PID/task/TID/schedstat (ns; with how many times a thread was switched to, a second: the daemon's wake-ups).\n\n",
		jobNamed("randread").title, b.runtime, b.idle)
	table(w, []string{"daemon", "QD1 IOPS", "daemon CPU at QD1", "CPU per 1k IOPS", "idle: first second", "idle: after it", "idle: after it (schedstat)", "thread runs / s"})
	for i, c := range b.configs {
		ir := out[i]
		fmt.Fprintf(w, "| %s | %s | %.2f cores | %.1f ms/s | %.0f ms/s | %.1f ms/s | %.2f ms/s | %.1f |\n", c.name, kilo(ir.load.iops), ir.load.cpu,
			ir.load.cpu*1e6/ir.load.iops, ir.first, ir.steady, ir.exact, ir.runs)
	}
	fmt.Fprintln(w)
	return nil
}

// table writes a markdown table head.
func table(w *strings.Builder, head []string) {
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
}
