package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/stats"
)

// IostatCmd is `dmfuse iostat [-x] [-y] [-z] [INTERVAL [COUNT]]`: per-device
// rates from MOUNT/stats/diskstats in the layout of sysstat's `iostat -d`
// (with -x, `iostat -d -x`). As with iostat, the first report covers the time
// since boot (the totals divided by the system uptime) unless -y is given, and
// with an INTERVAL a report follows every INTERVAL seconds, COUNT times or
// until interrupted.
type IostatCmd struct {
	X bool `short:"x" name:"extended" help:"Extended statistics: r/s rkB/s ... r_await ... aqu-sz %util, as iostat -x."`
	Y bool `short:"y" name:"omit-first" help:"Omit the first report (statistics since boot)."`
	Z bool `short:"z" name:"omit-idle" help:"Omit devices that did no I/O during the interval."`

	Interval float64 `arg:"" optional:"" help:"Seconds between reports (default: one report since boot)."`
	Count    int     `arg:"" optional:"" help:"Number of reports (default: until interrupted)."`
}

// Run prints the reports on stdout. The mount point comes from the global
// --mount flag, else DMFUSE_MOUNT.
func (c *IostatCmd) Run(g *Globals) error {
	mount := g.Mount
	if mount == "" {
		mount = os.Getenv("DMFUSE_MOUNT")
	}
	if mount == "" {
		return errors.New("iostat: no mount point: give --mount MOUNTPOINT or set DMFUSE_MOUNT")
	}
	if c.Interval < 0 || c.Count < 0 {
		return errors.New("iostat: interval and count must not be negative")
	}
	if c.Interval == 0 && c.Y {
		return errors.New("iostat: -y needs an interval")
	}
	path := filepath.Join(mount, "stats", "diskstats")
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("iostat: %s is not a dmfuse mount: %w", mount, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := stats.Iostat{
		Extended:  c.X,
		OmitFirst: c.Y,
		OmitIdle:  c.Z,
		Interval:  time.Duration(c.Interval * float64(time.Second)),
		Count:     c.Count,
		Read:      func() ([]byte, error) { return os.ReadFile(path) },
		Uptime:    stats.ProcUptime,
	}
	return run.Run(ctx, os.Stdout)
}
