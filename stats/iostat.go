package stats

import (
	"context"
	"errors"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// IostatRow is the per-device rates between two diskstats samples, computed as
// sysstat's iostat does: rates per second, sizes in kB, times in ms.
type IostatRow struct {
	Device string

	// Basic report (iostat without -x).
	TPS                          float64 // reads + writes + discards per second
	KBReadPS, KBWrtnPS, KBDscdPS float64
	KBRead, KBWrtn, KBDscd       uint64 // kB during the interval

	// Extended report (iostat -x). For each of reads (R), writes (W) and
	// discards (D): I/Os per second, kB per second, merges per second, merges
	// as a percentage of requests, mean time per I/O (ms), mean size (kB).
	RPS, RKBPS, RRqmPS, RRqmPct, RAwait, RAreqSz float64
	WPS, WKBPS, WRqmPS, WRqmPct, WAwait, WAreqSz float64
	DPS, DKBPS, DRqmPS, DRqmPct, DAwait, DAreqSz float64
	FPS, FAwait                                  float64 // flush requests (always 0 for dm)
	AquSz                                        float64 // mean queue size: time_in_queue / interval
	Util                                         float64 // % of the interval with I/O in flight
}

// Fields of DiskstatsLine.Fields, 0-based.
const (
	fRdIOs = iota
	fRdMerges
	fRdSec
	fRdTicks
	fWrIOs
	fWrMerges
	fWrSec
	fWrTicks
	fInFlight
	fIOTicks
	fTimeInQueue
	fDcIOs
	fDcMerges
	fDcSec
	fDcTicks
	fFlIOs
	fFlTicks
)

// is32 tells the fields the kernel prints as 32-bit numbers, whose
// differences are taken modulo 2^32.
var is32 = [17]bool{fRdTicks: true, fWrTicks: true, fInFlight: true, fIOTicks: true,
	fTimeInQueue: true, fDcTicks: true, fFlTicks: true}

func delta(cur, prev *DiskstatsLine, f int) float64 {
	if is32[f] {
		return float64(uint32(cur.Fields[f]) - uint32(prev.Fields[f]))
	}
	return float64(cur.Fields[f] - prev.Fields[f])
}

// restarted reports whether a device's counters went back, as when a device
// is removed and created again under the same name: iostat then takes the
// previous sample as zero.
func restarted(cur, prev *DiskstatsLine) bool {
	ios := func(l *DiskstatsLine) uint64 {
		return l.Fields[fRdIOs] + l.Fields[fWrIOs] + l.Fields[fDcIOs] + l.Fields[fFlIOs]
	}
	back := func(f int) bool { return prev.Fields[f] == 0 || cur.Fields[f] < prev.Fields[f] }
	return ios(cur) < ios(prev) && back(fRdSec) && back(fWrSec) && back(fDcSec)
}

// IostatRates computes the rates of one device over seconds, from prev (nil:
// all zero, the "since boot" report) to cur.
func IostatRates(prev, cur *DiskstatsLine, seconds float64) IostatRow {
	var zero DiskstatsLine
	if prev == nil || restarted(cur, prev) {
		prev = &zero
	}
	d := func(f int) float64 { return delta(cur, prev, f) }
	ps := func(f int) float64 {
		if seconds <= 0 {
			return 0
		}
		return d(f) / seconds
	}
	ratio := func(num, den float64) float64 {
		if den == 0 {
			return 0
		}
		return num / den
	}
	r := IostatRow{Device: cur.Name}

	if seconds > 0 {
		r.TPS = (d(fRdIOs) + d(fWrIOs) + d(fDcIOs)) / seconds
	}
	r.KBReadPS, r.KBWrtnPS, r.KBDscdPS = ps(fRdSec)/2, ps(fWrSec)/2, ps(fDcSec)/2
	r.KBRead = (cur.Fields[fRdSec] - prev.Fields[fRdSec]) / 2
	r.KBWrtn = (cur.Fields[fWrSec] - prev.Fields[fWrSec]) / 2
	r.KBDscd = (cur.Fields[fDcSec] - prev.Fields[fDcSec]) / 2

	group := func(ios, merges, sec, ticks int) (pS, kbps, rqmps, rqmpct, await, areqsz float64) {
		di, dm := d(ios), d(merges)
		return ps(ios), ps(sec) / 2, ps(merges), ratio(dm, dm+di) * 100,
			ratio(d(ticks), di), ratio(d(sec), di) / 2
	}
	r.RPS, r.RKBPS, r.RRqmPS, r.RRqmPct, r.RAwait, r.RAreqSz = group(fRdIOs, fRdMerges, fRdSec, fRdTicks)
	r.WPS, r.WKBPS, r.WRqmPS, r.WRqmPct, r.WAwait, r.WAreqSz = group(fWrIOs, fWrMerges, fWrSec, fWrTicks)
	r.DPS, r.DKBPS, r.DRqmPS, r.DRqmPct, r.DAwait, r.DAreqSz = group(fDcIOs, fDcMerges, fDcSec, fDcTicks)
	r.FPS, r.FAwait = ps(fFlIOs), ratio(d(fFlTicks), d(fFlIOs))
	r.AquSz = ps(fTimeInQueue) / 1000
	if uint32(cur.Fields[fIOTicks]) >= uint32(prev.Fields[fIOTicks]) {
		r.Util = ps(fIOTicks) / 10
	}
	return r
}

// IostatRows computes the rows of one report, in the order of cur. prev may
// be nil (the report since boot); a device missing from prev starts at zero.
func IostatRows(prev, cur []DiskstatsLine, seconds float64) []IostatRow {
	byName := make(map[string]*DiskstatsLine, len(prev))
	for i := range prev {
		byName[prev[i].Name] = &prev[i]
	}
	rows := make([]IostatRow, 0, len(cur))
	for i := range cur {
		rows = append(rows, IostatRates(byName[cur[i].Name], &cur[i], seconds))
	}
	return rows
}

const (
	iostatBasicHeader = "Device             tps    kB_read/s    kB_wrtn/s    kB_dscd/s    kB_read    kB_wrtn    kB_dscd\n"
	iostatExtHeader   = "Device            r/s     rkB/s   rrqm/s  %rrqm r_await rareq-sz" +
		"     w/s     wkB/s   wrqm/s  %wrqm w_await wareq-sz" +
		"     d/s     dkB/s   drqm/s  %drqm d_await dareq-sz" +
		"     f/s f_await  aqu-sz  %util\n"
)

// appendF appends " %*.2f" with the given width.
func appendF(b []byte, v float64, width int) []byte {
	if v == 0 || math.IsNaN(v) { // no "-0.00" and no "NaN"
		v = 0
	}
	var tmp [32]byte
	s := strconv.AppendFloat(tmp[:0], v, 'f', 2, 64)
	b = append(b, ' ')
	for i := len(s); i < width; i++ {
		b = append(b, ' ')
	}
	return append(b, s...)
}

func appendName(b []byte, name string) []byte {
	b = append(b, name...)
	for i := len(name); i < 13; i++ {
		b = append(b, ' ')
	}
	return b
}

// AppendIostat appends one report in the layout of sysstat's "iostat -d"
// (extended: "iostat -d -x"): the header, one line per row, a blank line.
func AppendIostat(b []byte, rows []IostatRow, extended bool) []byte {
	if !extended {
		b = append(b, iostatBasicHeader...)
		for i := range rows {
			r := &rows[i]
			b = appendName(b, r.Device)
			b = appendF(b, r.TPS, 8)
			b = appendF(b, r.KBReadPS, 12)
			b = appendF(b, r.KBWrtnPS, 12)
			b = appendF(b, r.KBDscdPS, 12)
			for _, v := range [...]uint64{r.KBRead, r.KBWrtn, r.KBDscd} {
				b = append(b, ' ')
				b = appendPadded(b, v, 10)
			}
			b = append(b, '\n')
		}
		return append(b, '\n')
	}
	b = append(b, iostatExtHeader...)
	for i := range rows {
		r := &rows[i]
		b = appendName(b, r.Device)
		for _, g := range [...][6]float64{
			{r.RPS, r.RKBPS, r.RRqmPS, r.RRqmPct, r.RAwait, r.RAreqSz},
			{r.WPS, r.WKBPS, r.WRqmPS, r.WRqmPct, r.WAwait, r.WAreqSz},
			{r.DPS, r.DKBPS, r.DRqmPS, r.DRqmPct, r.DAwait, r.DAreqSz},
		} {
			b = appendF(b, g[0], 7)
			b = appendF(b, g[1], 9)
			b = appendF(b, g[2], 8)
			b = appendF(b, g[3], 6)
			b = appendF(b, g[4], 7)
			b = appendF(b, g[5], 8)
		}
		b = appendF(b, r.FPS, 7)
		b = appendF(b, r.FAwait, 7)
		b = appendF(b, r.AquSz, 7)
		b = appendF(b, r.Util, 6)
		b = append(b, '\n')
	}
	return append(b, '\n')
}

// Iostat prints reports of device rates from diskstats samples, as sysstat's
// iostat does: without an interval, one report since boot; with one, a report
// every Interval, Count times (0: until the context ends).
type Iostat struct {
	Extended  bool          // the -x layout
	OmitFirst bool          // -y: do not print the report since boot
	OmitIdle  bool          // -z: leave out devices with no I/O in the interval
	Interval  time.Duration // 0: one report
	Count     int           // reports to print when Interval > 0; 0: no limit

	// Read returns the current diskstats text.
	Read func() ([]byte, error)
	// Uptime returns the interval of the first report (the time since boot, as
	// iostat's first report has it). Nil: the first report is left out.
	Uptime func() (time.Duration, error)
	// Clock measures the time between samples; nil: clock.System.
	Clock clock.Clock
	// Sleep waits for d or until ctx ends; nil: a timer.
	Sleep func(ctx context.Context, d time.Duration) error
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Run prints the reports to w. It returns nil when Count reports are printed
// or the context ends while waiting.
func (c *Iostat) Run(ctx context.Context, w io.Writer) error {
	clk, sleep := c.Clock, c.Sleep
	if clk == nil {
		clk = clock.System
	}
	if sleep == nil {
		sleep = sleepCtx
	}
	sample := func() ([]DiskstatsLine, int64, error) {
		data, err := c.Read()
		if err != nil {
			return nil, 0, err
		}
		t := clk.Nanotime()
		lines, err := ParseDiskstats(data)
		return lines, t, err
	}
	cur, at, err := sample()
	if err != nil {
		return err
	}
	printed := 0
	if !c.OmitFirst && c.Uptime != nil {
		up, err := c.Uptime()
		if err != nil {
			return err
		}
		if err := c.report(w, nil, cur, up.Seconds()); err != nil {
			return err
		}
		printed++
	}
	if c.Interval <= 0 {
		if printed == 0 {
			return errors.New("iostat: no report: give an interval")
		}
		return nil
	}
	next := at
	for c.Count == 0 || printed < c.Count {
		next += int64(c.Interval)
		if d := next - clk.Nanotime(); d > 0 {
			if err := sleep(ctx, time.Duration(d)); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		prev, prevAt := cur, at
		if cur, at, err = sample(); err != nil {
			return err
		}
		if err := c.report(w, prev, cur, float64(at-prevAt)/1e9); err != nil {
			return err
		}
		printed++
	}
	return nil
}

func (c *Iostat) report(w io.Writer, prev, cur []DiskstatsLine, seconds float64) error {
	rows := IostatRows(prev, cur, seconds)
	if c.OmitIdle {
		kept := rows[:0]
		for _, r := range rows {
			if r.RPS != 0 || r.WPS != 0 || r.DPS != 0 || r.FPS != 0 {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	_, err := w.Write(AppendIostat(nil, rows, c.Extended))
	return err
}

// ProcUptime reads the system uptime from /proc/uptime.
func ProcUptime() (time.Duration, error) {
	data, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	return parseUptime(data)
}

func parseUptime(data []byte) (time.Duration, error) {
	i := 0
	for i < len(data) && data[i] != ' ' && data[i] != '\n' {
		i++
	}
	s, err := strconv.ParseFloat(string(data[:i]), 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(s * float64(time.Second)), nil
}
