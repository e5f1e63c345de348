// Command fault measures the fault target with fio:
//
//	go run ./test/bench/fault [-rounds N] [-out FILE] [-svg FILE]
//
// It needs root, /dev/fuse, fio and go; it installs nothing. It builds
// dmfuse, mounts a private tmpfs with the backing files and mounts dmfuse
// over them, then:
//
//   - overhead: linear against a fault device whose three rules never match
//     (a discard rule, a read rule for 1 MiB and larger, a write rule in a
//     window that has not begun), fio 4 KiB random reads and writes at QD1
//     (psync) and 2 jobs x QD32 (libaio), the device that goes first
//     alternating in each of N interleaved rounds; medians and the median
//     (min-max) of the per-round ratios;
//   - presets: each preset's fio p50, p99 and p99.9 at QD1 and IOPS at QD32
//     (after a 2 s ramp that spends the bucket's first second), beside the
//     figures the preset is built from;
//   - constant delays of 1 ms and 80 us at QD1 as the delay target and the
//     fault target serve them (the fault target waits on delay's
//     scheduler);
//   - shape: 10 000 reads at QD1 from a device with read=lognormal(1ms,5ms),
//     their latencies as fio logged them against the requested
//     distribution: the Kolmogorov-Smirnov distance (the critical distance
//     at 1% for 10 000 samples is 0.0163);
//   - gp2: the gp2 preset (100 GiB: 300 IOPS base, 3000 burst) with a bucket
//     of 54 000 credits instead of 5.4 M, which a QD16 reader spends in
//     54000/(3000-300) = 20 s: fio's IOPS per second over 40 s, as a table
//     and as an SVG plot (-svg).
//
// Everything it set up is torn down on exit, on error and on SIGINT or
// SIGTERM.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds of the overhead jobs")
	out := flag.String("out", "", "also write the tables to this file")
	svg := flag.String("svg", "", "write the gp2 plot to this file")
	flag.Parse()
	benchkit.Main("fault", *out, func(w io.Writer) error { return run(w, *rounds, *svg) })
}

const devSize = 256 << 20

// presets measured, with the figures they are built from.
var presets = []struct{ name, spec, published string }{
	{"gp3", "preset=gp3", "3000 IOPS; latency lognormal p50 600 us, p99 3 ms"},
	{"io2", "preset=io2:iops=16000", "16000 IOPS; p50 300 us, p99 800 us"},
	{"azure-p10", "preset=azure-p10", "500 IOPS, burst 3500 (bucket full at start); p50 1 ms, p99 5 ms"},
	// The model's disk is the device's size, so that random reads seek
	// over the whole stroke.
	{"hdd7200", "preset=hdd7200:size=0.25", "seek 1-16 ms + rotation 0-8.3 ms: about 75-110 random 4K IOPS at QD1"},
	{"consumer-ssd", "preset=consumer-ssd", "reads p50 80 us, p99 500 us; 4 units"},
	{"cloud-nvme", "preset=cloud-nvme", "reads p50 90 us, p99 200 us, 1% held 3 ms; 275000 IOPS"},
}

func run(w io.Writer, rounds int, svgPath string) error {
	ctx, cancel := benchkit.SignalContext("fault")
	defer cancel()
	var u benchkit.Undo
	defer u.Run()
	work, bin, err := benchkit.BuildScratch(ctx, &u, "dmfuse-fault-bench")
	if err != nil {
		return err
	}
	tmpfs := filepath.Join(work, "tmpfs")
	devs := []struct{ name, spec string }{
		{"lin", ""},
		{"nomatch", "rule name=a op=discard error rule name=b op=read size=1M- error rule name=c op=write window=10000s- drop"},
		{"shape", "seed=1 read=lognormal(1ms,5ms)"},
		{"const", "read=1ms"},
		{"dly", ""},
		{"const80", "read=80us"},
		{"dly80", ""},
		{"gp2", "preset=gp2:size=100,credits=54000"},
	}
	for _, p := range presets {
		devs = append(devs, struct{ name, spec string }{p.name, p.spec})
	}
	if err := benchkit.MountTmpfs(&u, tmpfs, int64(len(devs))*devSize+(16<<20)); err != nil {
		return err
	}
	var conf strings.Builder
	for _, d := range devs {
		img := filepath.Join(tmpfs, d.name+".img")
		if err := benchkit.Fill(img, devSize); err != nil {
			return err
		}
		switch d.name {
		case "lin":
			fmt.Fprintf(&conf, "lin,,,rw,0 %d linear %s 0;\n", devSize/512, img)
			continue
		case "dly", "dly80":
			fmt.Fprintf(&conf, "%s,,,rw,0 %d delay %s 0 %s;\n", d.name, devSize/512, img, map[string]string{"dly": "1", "dly80": "0.08"}[d.name])
			continue
		}
		// The config's fields are comma-separated: a comma of the table is escaped.
		fmt.Fprintf(&conf, "%s,,,rw,0 %d fault %s 0 %s;\n", d.name, devSize/512, img, strings.ReplaceAll(d.spec, ",", `\,`))
	}
	cfg := filepath.Join(work, "bench.conf")
	if err := os.WriteFile(cfg, []byte(conf.String()), 0o644); err != nil {
		return err
	}
	mnt := filepath.Join(work, "mnt")
	sock := filepath.Join(work, "ctl.sock")
	last := devs[len(devs)-1].name
	srv, err := benchkit.StartMounted(ctx, &u, "dmfuse", mnt, benchkit.FileReady(filepath.Join(mnt, last)), nil,
		bin, "mount", "--config", cfg, "--control", sock, mnt)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Machine: %d CPUs, kernel %s, fio %s, %s; %s; load average at the start: %s.\n",
		runtime.NumCPU(), benchkit.Kernel(), benchkit.FioVersion(), runtime.Version(), benchkit.ServerLine(srv, "transport "), benchkit.Loadavg())
	fmt.Fprintf(w, "Devices over %d MiB tmpfs files; fio 4 KiB O_DIRECT.\n\n", devSize>>20)
	fio := func(dev string, extra ...string) (*benchkit.FioJob, error) {
		args := append([]string{"--name=b", "--filename=" + filepath.Join(mnt, dev), "--direct=1", "--bs=4k",
			"--group_reporting", "--output-format=json", "--randrepeat=0", fmt.Sprintf("--size=%d", devSize)}, extra...)
		return benchkit.RunFio(ctx, work, args...)
	}
	if err := overhead(ctx, w, fio, rounds); err != nil {
		return err
	}
	if err := presetTable(w, fio); err != nil {
		return err
	}
	if err := shape(ctx, w, work, mnt, fio); err != nil {
		return err
	}
	st, err := benchkit.Ctl(bin, sock, "status", "nomatch")
	if err == nil {
		fmt.Fprintf(w, "\nnomatch at the end (state, I/Os, events, latent, stalled, rules, name:matched:fired): %s", st)
	}
	return gp2(ctx, w, work, mnt, svgPath)
}

type fioFunc func(dev string, extra ...string) (*benchkit.FioJob, error)

func overhead(ctx context.Context, w io.Writer, fio fioFunc, rounds int) error {
	jobs := []struct {
		title string
		rw    string
		args  []string
	}{
		{"randread psync QD1", "randread", []string{"--ioengine=psync", "--iodepth=1", "--numjobs=1"}},
		{"randwrite psync QD1", "randwrite", []string{"--ioengine=psync", "--iodepth=1", "--numjobs=1"}},
		{"randread libaio 2x32", "randread", []string{"--ioengine=libaio", "--iodepth=32", "--numjobs=2"}},
		{"randwrite libaio 2x32", "randwrite", []string{"--ioengine=libaio", "--iodepth=32", "--numjobs=2"}},
	}
	iops := map[string][]float64{}
	ratios := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for _, j := range jobs {
			var got [2]float64
			for k := 0; k < 2; k++ {
				i := (k + r) % 2
				dev := []string{"lin", "nomatch"}[i]
				res, err := fio(dev, append([]string{"--rw=" + j.rw, "--time_based", "--runtime=3s"}, j.args...)...)
				if err != nil {
					return err
				}
				got[i] = res.Read.IOPS + res.Write.IOPS
				iops[j.title+"|"+dev] = append(iops[j.title+"|"+dev], got[i])
			}
			ratios[j.title] = append(ratios[j.title], got[1]/got[0])
			fmt.Fprintf(os.Stderr, "round %d %s: linear %.0f, fault %.0f IOPS\n", r+1, j.title, got[0], got[1])
		}
		if err := benchkit.Sleep(ctx, 0); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "No rule matching, %d interleaved rounds of 3 s:\n\n| job | linear IOPS | fault IOPS | fault/linear |\n|---|---|---|---|\n", rounds)
	for _, j := range jobs {
		rs := ratios[j.title]
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.3fx (%.3f-%.3f) |\n", j.title, benchkit.Median(iops[j.title+"|lin"]),
			benchkit.Median(iops[j.title+"|nomatch"]), benchkit.Median(rs), slices.Min(rs), slices.Max(rs))
	}
	return nil
}

func presetTable(w io.Writer, fio fioFunc) error {
	fmt.Fprintf(w, "\nPresets: 4 KiB random reads, QD1 for 5 s (percentiles of completion latency), then libaio QD32 for 5 s after a 2 s ramp (IOPS):\n\n")
	fmt.Fprintf(w, "| preset | p50 | p99 | p99.9 | QD1 IOPS | QD32 IOPS | built from |\n|---|---|---|---|---|---|---|\n")
	for _, p := range presets {
		qd1, err := fio(p.name, "--rw=randread", "--ioengine=psync", "--time_based", "--runtime=5s")
		if err != nil {
			return err
		}
		qd32, err := fio(p.name, "--rw=randread", "--ioengine=libaio", "--iodepth=32", "--ramp_time=2s", "--time_based", "--runtime=5s")
		if err != nil {
			return err
		}
		pc := qd1.Read.Clat.Percentile
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.0f | %.0f | %s |\n", p.name, us(pc["50.000000"]), us(pc["99.000000"]), us(pc["99.900000"]),
			qd1.Read.IOPS, qd32.Read.IOPS, p.published)
	}
	return nil
}

func us(ns float64) string {
	if ns >= 1e6 {
		return fmt.Sprintf("%.2f ms", ns/1e6)
	}
	return fmt.Sprintf("%.0f us", ns/1e3)
}

// readLog reads a fio log (time ms, value, direction, size, ...) and
// returns its times and values.
func readLog(path string) (ts, vs []float64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Split(sc.Text(), ",")
		if len(p) < 2 {
			continue
		}
		t, e1 := strconv.ParseFloat(strings.TrimSpace(p[0]), 64)
		v, e2 := strconv.ParseFloat(strings.TrimSpace(p[1]), 64)
		if e1 == nil && e2 == nil {
			ts, vs = append(ts, t), append(vs, v)
		}
	}
	return ts, vs, sc.Err()
}

func shape(ctx context.Context, w io.Writer, work, mnt string, fio fioFunc) error {
	// The time a read takes without a delay, and a constant 1 ms as the
	// delay target and as the fault target serve it.
	p50 := map[string]float64{}
	for _, dev := range []string{"lin", "dly", "const", "dly80", "const80"} {
		r, err := fio(dev, "--rw=randread", "--ioengine=psync", "--time_based", "--runtime=5s")
		if err != nil {
			return err
		}
		p50[dev] = r.Read.Clat.Percentile["50.000000"]
	}
	fmt.Fprintf(w, "\nA constant delay at QD1, p50 of 5 s of reads: 1 ms: delay target %s, fault target read=1ms %s; 80 us: delay target %s, fault target %s; linear alone %s.\n",
		us(p50["dly"]), us(p50["const"]), us(p50["dly80"]), us(p50["const80"]), us(p50["lin"]))
	prefix := filepath.Join(work, "shape")
	if _, err := benchkit.RunFio(ctx, work, "--name=s", "--filename="+filepath.Join(mnt, "shape"), "--direct=1", "--bs=4k",
		"--rw=randread", "--ioengine=psync", "--number_ios=10000", fmt.Sprintf("--size=%d", devSize), "--output-format=json",
		"--write_lat_log="+prefix, "--log_avg_msec=0"); err != nil {
		return err
	}
	_, vs, err := readLog(prefix + "_clat.1.log")
	if err != nil {
		return err
	}
	slices.Sort(vs)
	// fio logs nanoseconds (3.x); a requested 1 ms median tells.
	scale := 1.0
	if vs[len(vs)/2] < 1e5 {
		scale = 1e3
	}
	mu, sig := math.Log(1e6), math.Log(5)/2.326347874
	cdf := func(x float64) float64 { return 0.5 * math.Erfc(-(math.Log(x)-mu)/sig/math.Sqrt2) }
	n := float64(len(vs))
	ks := func(shift, factor float64) float64 {
		d := 0.0
		for i, v := range vs {
			c := cdf(max((v*scale-shift)*factor, 1))
			d = max(d, math.Abs(float64(i+1)/n-c), math.Abs(c-float64(i)/n))
		}
		return d
	}
	q := func(p float64) float64 { return vs[int(p*n)] * scale }
	// What the delay target adds to 1 ms beyond it is the transport's part
	// of every delayed read.
	over := p50["dly"] - 1e6
	fmt.Fprintf(w, "Shape: %d reads at QD1 from read=lognormal(1ms,5ms): fio's p50 %s (asked 1 ms), p90 %s (asked %s), p99 %s (asked 5 ms); KS distance to the requested distribution %.4f as fio saw them, %.4f less the %s the delay target's 1 ms reads took beyond 1 ms, %.4f scaled by 1 ms over them (critical at 1%%: %.4f).\n",
		len(vs), us(q(0.5)), us(q(0.9)), us(math.Exp(mu+sig*1.281551566)), us(q(0.99)), ks(0, 1), ks(over, 1), us(over), ks(0, 1e6/p50["dly"]), 1.63/math.Sqrt(n))
	return nil
}

func gp2(ctx context.Context, w io.Writer, work, mnt, svgPath string) error {
	prefix := filepath.Join(work, "gp2")
	if _, err := benchkit.RunFio(ctx, work, "--name=g", "--filename="+filepath.Join(mnt, "gp2"), "--direct=1", "--bs=4k",
		"--rw=randread", "--ioengine=libaio", "--iodepth=16", "--time_based", "--runtime=40s", fmt.Sprintf("--size=%d", devSize),
		"--output-format=json", "--write_iops_log="+prefix, "--log_avg_msec=1000"); err != nil {
		return err
	}
	ts, vs, err := readLog(prefix + "_iops.1.log")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\ngp2 (100 GiB: base 300, burst 3000) with 54 000 credits, fio randread QD16, IOPS per second:\n\n| second | IOPS |\n|---|---|\n")
	for i := range ts {
		if i%2 == 0 || i == len(ts)-1 {
			fmt.Fprintf(w, "| %.0f | %.0f |\n", ts[i]/1000, vs[i])
		}
	}
	if svgPath == "" {
		return nil
	}
	return os.WriteFile(svgPath, []byte(plot(ts, vs)), 0o644)
}

// plot draws IOPS over time as an SVG line chart with axes.
func plot(ts, vs []float64) string {
	const W, H, L, B = 640, 320, 60, 40
	xmax := ts[len(ts)-1] / 1000
	ymax := 3500.0
	x := func(t float64) float64 { return L + t/1000/xmax*(W-L-20) }
	y := func(v float64) float64 { return H - B - v/ymax*(H-B-20) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="14">gp2 preset, 100 GiB, 54 000 credits: fio 4 KiB randread QD16, IOPS per second</text>`+"\n", L)
	for _, v := range []float64{0, 300, 1000, 2000, 3000} {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n",
			L, W-20, y(v), y(v), L-6, y(v)+4, v)
	}
	for t := 0.0; t <= xmax; t += 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%.0f s</text>`+"\n",
			x(t*1000), x(t*1000), 20, H-B, x(t*1000), H-B+16, t)
	}
	var pts []string
	for i := range ts {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(ts[i]), y(vs[i])))
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="%s"/>`+"\n", strings.Join(pts, " "))
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#888">credits run out: 54000/(3000-300) = 20 s</text>`+"\n", x(20500), y(2000))
	b.WriteString("</svg>\n")
	return b.String()
}
