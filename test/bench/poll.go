package main

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"time"
)

// The poll suite measures what the io_uring transport's polling costs and
// whether it lets others run: sparse QD1 I/O (fio --rate_iops), where a
// daemon should spend no more CPU than one that never polls, and I/O on
// CPUs that CPU-bound processes keep busy, where a polling daemon must not
// take CPU time from the application. The configs named pollDefault and
// pollNever, if present, are compared against the goals.
const (
	pollDefault = "uring"
	pollNever   = "uring-0"
)

// sparseRates are the sparse rows' rates, requests a second.
var sparseRates = []int{1000, 5000, 20000}

// contendedJobs are the jobs run while every CPU is kept busy.
var contendedJobs = []string{"randread", "uring-randread"}

// poll runs the sparse rows and the contended rows on each config's linear
// device, in interleaved rounds.
func (b *ubench) poll(ctx context.Context) error {
	sparse := map[string][][]urun{} // config -> rate -> one run a round
	for _, c := range b.configs {
		sparse[c.name] = make([][]urun, len(sparseRates))
	}
	logf("poll: %d sparse runs of %v (+%v ramp)", b.rounds*len(sparseRates)*len(b.configs), b.runtime, b.ramp(b.runtime))
	start := time.Now()
	for r := range b.rounds {
		for i, rate := range sparseRates {
			for _, c := range rotate(b.configs, r) {
				run, err := b.fio(ctx, jobNamed("randread"), c, c.dev("linear"), b.runtime, "--rate_iops="+strconv.Itoa(rate))
				if err != nil {
					return fmt.Errorf("randread at %d/s on %s: %w", rate, c.name, err)
				}
				sparse[c.name][i] = append(sparse[c.name][i], run)
			}
		}
		logf("poll: sparse round %d/%d done (%v)", r+1, b.rounds, time.Since(start).Round(time.Second))
	}

	contended := map[string][][]urun{} // config -> job -> one run a round
	for _, c := range b.configs {
		contended[c.name] = make([][]urun, len(contendedJobs))
	}
	stop, err := hogs(ctx, runtime.NumCPU())
	if err != nil {
		return err
	}
	b.undo.Push(stop)
	logf("poll: %d contended runs of %v (+%v ramp), %d CPU-bound processes", b.rounds*len(contendedJobs)*len(b.configs), b.runtime, b.ramp(b.runtime), runtime.NumCPU())
	start = time.Now()
	for r := range b.rounds {
		for i, jn := range contendedJobs {
			for _, c := range rotate(b.configs, r) {
				run, err := b.fio(ctx, jobNamed(jn), c, c.dev("linear"), b.runtime)
				if err != nil {
					stop()
					return fmt.Errorf("%s contended on %s: %w", jn, c.name, err)
				}
				contended[c.name][i] = append(contended[c.name][i], run)
			}
		}
		logf("poll: contended round %d/%d done (%v)", r+1, b.rounds, time.Since(start).Round(time.Second))
	}
	stop()

	w := &b.w
	fmt.Fprintf(w, "### Polling\n\nSparse: %s on each daemon's linear device limited to a rate (fio --rate_iops), medians of %d interleaved rounds; daemon CPU (utime+stime over the middle of the run) in ms per second; latency is fio's submission to completion. Goal: %s's CPU at most 1.2 x %s's + 5 ms/s.\n\n",
		jobNamed("randread").title, b.rounds, pollDefault, pollNever)
	table(w, []string{"rate", "daemon", "IOPS", "daemon CPU", "p50 lat", "p99 lat", "goal"})
	for i, rate := range sparseRates {
		for _, c := range b.configs {
			rs := sparse[c.name][i]
			goal := ""
			if never, ok := sparse[pollNever]; ok && c.name == pollDefault {
				lim := 1.2*medOf(never[i], cpuMs) + 5
				goal = fmt.Sprintf("at most %.0f ms/s: %s", lim, yes(medOf(rs, cpuMs) <= lim))
			}
			fmt.Fprintf(w, "| %s/s | %s | %s | %.0f ms/s | %s | %s | %s |\n", kilo(float64(rate)), c.name, kilo(medOf(rs, func(r urun) float64 { return r.iops })),
				medOf(rs, cpuMs), us(medOf(rs, func(r urun) float64 { return r.p50Us })), us(medOf(rs, func(r urun) float64 { return r.p99Us })), goal)
		}
	}
	fmt.Fprintf(w, "\nContended: the same jobs while %d CPU-bound processes (one bound to each CPU) run; IOPS medians of %d interleaved rounds, ratios the median (min-max) of the per-round ratios to %s. Goal: %s at least 0.95 x %s.\n\n",
		runtime.NumCPU(), b.rounds, pollNever, pollDefault, pollNever)
	table(w, []string{"job", "daemon", "IOPS", "/ " + pollNever, "daemon CPU", "machine busy"})
	for i, jn := range contendedJobs {
		j := jobNamed(jn)
		for _, c := range b.configs {
			rs := contended[c.name][i]
			ratio := "-"
			if never, ok := contended[pollNever]; ok {
				ratio = ratioCell(perRound(rs, never[i], j.value))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %.2f | %.2f |\n", j.title, c.name, kilo(medOf(rs, j.value)), ratio,
				medOf(rs, func(r urun) float64 { return r.cpu }), medOf(rs, func(r urun) float64 { return r.machine }))
		}
	}
	fmt.Fprintln(w)
	return nil
}

func cpuMs(r urun) float64 { return r.cpu * 1e3 }

func yes(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// hogs starts n CPU-bound processes, the i-th bound to CPU i, and returns
// a function that stops them.
func hogs(ctx context.Context, n int) (func(), error) {
	var cmds []*exec.Cmd
	stop := func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
		cmds = nil
	}
	for i := range n {
		c := exec.CommandContext(ctx, "taskset", "-c", strconv.Itoa(i), "sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("starting a CPU-bound process: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}
