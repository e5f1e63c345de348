// Command snapshot measures the snapshot targets against linear over the
// same kind of backing file, with fio, in interleaved rounds:
//
//	go run ./test/bench/snapshot [-rounds N] [-region MIB] [-out FILE]
//
// It needs root, /dev/fuse, fio and go; it installs nothing. It builds
// dmfuse, mounts a private tmpfs with the backing files (origins of rounds
// x region MiB, filled; COW devices zeroed), and mounts dmfuse with:
//
//	lin   linear over a file
//	o1    snapshot-origin of r1 (linear over a file), with one snapshot s1
//	o4    snapshot-origin of r4, with four snapshots s4a..s4d
//
// all snapshots P with 4 KiB chunks (lvm's default). Each round takes a
// region of its own, so that its first writes are first writes to their
// chunks; in it, each job runs on lin and on the snapshot device, the one
// that goes first alternating:
//
//   - first write: 4 KiB sequential writes at QD1 over the region, each the
//     first to its chunk: on o1 one copy-out, on o4 four;
//   - copied: the same writes again, the chunks copied already;
//   - snapshot read: 4 KiB random reads at QD1 over the region of s1, whose
//     chunks the writes copied to its COW.
//
// The table gives median IOPS, the median (min-max) of the per-round ratios
// to linear and the medians of mean latency. Everything it set up is torn
// down on exit, on error and on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds, each on a region of its own")
	region := flag.Int64("region", 48, "MiB each round writes")
	out := flag.String("out", "", "also write the table to this file")
	flag.Parse()
	benchkit.Main("snapshot", *out, func(w io.Writer) error { return run(w, *rounds, *region<<20) })
}

type job struct {
	name, dev, rw string
	write         bool
}

func run(w io.Writer, rounds int, region int64) error {
	ctx, cancel := benchkit.SignalContext("snapshot")
	defer cancel()
	var u benchkit.Undo
	defer u.Run()
	work, bin, err := benchkit.BuildScratch(ctx, &u, "dmfuse-snapshot-bench")
	if err != nil {
		return err
	}
	size := region * int64(rounds)
	files := []string{"lin", "r1", "r4", "c1", "c4a", "c4b", "c4c", "c4d"}
	tmpfs := filepath.Join(work, "tmpfs")
	if err := benchkit.MountTmpfs(&u, tmpfs, int64(len(files))*(size+(16<<20))); err != nil {
		return err
	}
	cowSize := size + size/256 + (8 << 20) // the chunks, their areas and room
	var conf strings.Builder
	for _, f := range files {
		n := size
		if f[0] == 'c' {
			n = cowSize
		}
		p := filepath.Join(tmpfs, f+".img")
		if f[0] == 'c' {
			// A COW starts zeroed: a new store.
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
			if err := os.Truncate(p, n); err != nil {
				return err
			}
			continue
		}
		if err := benchkit.Fill(p, n); err != nil {
			return err
		}
	}
	sec := size / 512
	img := func(f string) string { return filepath.Join(tmpfs, f+".img") }
	fmt.Fprintf(&conf, "lin,,,rw,0 %d linear %s 0;\n", sec, img("lin"))
	for _, o := range []struct{ r string }{{"r1"}, {"r4"}} {
		fmt.Fprintf(&conf, "%s,,,rw,0 %d linear %s 0;\n", o.r, sec, img(o.r))
	}
	fmt.Fprintf(&conf, "s1,,,rw,0 %d snapshot r1 %s P 8;\n", sec, img("c1"))
	for _, c := range []string{"a", "b", "c", "d"} {
		fmt.Fprintf(&conf, "s4%s,,,rw,0 %d snapshot r4 %s P 8;\n", c, sec, img("c4"+c))
	}
	fmt.Fprintf(&conf, "o1,,,rw,0 %d snapshot-origin r1;\no4,,,rw,0 %d snapshot-origin r4;\n", sec, sec)
	cfg := filepath.Join(work, "bench.conf")
	if err := os.WriteFile(cfg, []byte(conf.String()), 0o644); err != nil {
		return err
	}
	mnt := filepath.Join(work, "mnt")
	srv, err := benchkit.StartMounted(ctx, &u, "dmfuse", mnt, benchkit.FileReady(filepath.Join(mnt, "o4")), nil,
		bin, "mount", "--config", cfg, "--control", filepath.Join(work, "ctl.sock"), mnt)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Machine: %d CPUs, kernel %s, fio %s, %s; %s; load average at the start: %s.\n",
		runtime.NumCPU(), benchkit.Kernel(), benchkit.FioVersion(), runtime.Version(), benchkit.ServerLine(srv, "transport "), benchkit.Loadavg())
	fmt.Fprintf(w, "Devices over tmpfs files; snapshots P with 4 KiB chunks; %d rounds, each on %d MiB of its own; fio 4 KiB O_DIRECT psync QD1.\n\n", rounds, region>>20)

	jobs := []job{
		{"first write, 1 snapshot", "o1", "write", true},
		{"first write, 4 snapshots", "o4", "write", true},
		{"copied, 1 snapshot", "o1", "write", true},
		{"copied, 4 snapshots", "o4", "write", true},
		{"snapshot read", "s1", "randread", false},
	}
	iops := map[string][]float64{}
	lat := map[string][]float64{}
	ratios := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		off := int64(r) * region
		for _, j := range jobs {
			var got [2]float64
			for k := 0; k < 2; k++ {
				i := (k + r) % 2
				dev := "lin"
				if i == 1 {
					dev = j.dev
				}
				args := []string{"--name=b", "--filename=" + filepath.Join(mnt, dev), "--direct=1", "--thread",
					"--bs=4k", "--ioengine=psync", "--iodepth=1", "--rw=" + j.rw, fmt.Sprintf("--offset=%d", off),
					fmt.Sprintf("--size=%d", region), "--output-format=json", "--randrepeat=0"}
				if !j.write {
					args = append(args, "--time_based", "--runtime=4s")
				}
				res, err := benchkit.RunFio(ctx, work, args...)
				if err != nil {
					return err
				}
				d := res.Write
				if !j.write {
					d = res.Read
				}
				key := j.name + "|" + map[bool]string{false: "linear", true: j.dev}[i == 1]
				iops[key] = append(iops[key], d.IOPS)
				lat[key] = append(lat[key], d.Lat.Mean/1000)
				got[i] = d.IOPS
			}
			ratios[j.name] = append(ratios[j.name], got[1]/got[0])
			fmt.Fprintf(os.Stderr, "round %d %s: linear %.0f, %s %.0f IOPS\n", r+1, j.name, got[0], j.dev, got[1])
		}
		if err := benchkit.Sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "| job | device | IOPS | mean latency | ratio to linear |\n|---|---|---|---|---|\n")
	for _, j := range jobs {
		lk, dk := j.name+"|linear", j.name+"|"+j.dev
		rs := ratios[j.name]
		fmt.Fprintf(w, "| %s | linear | %.0f | %.1f us | |\n", j.name, benchkit.Median(iops[lk]), benchkit.Median(lat[lk]))
		fmt.Fprintf(w, "| %s | %s | %.0f | %.1f us | %.2fx (%.2f-%.2f) |\n", j.name, j.dev, benchkit.Median(iops[dk]), benchkit.Median(lat[dk]),
			benchkit.Median(rs), slices.Min(rs), slices.Max(rs))
	}
	st, err := benchkit.Ctl(bin, filepath.Join(work, "ctl.sock"), "status", "s1")
	if err == nil {
		fmt.Fprintf(w, "\ns1 at the end: %s", st)
	}
	return nil
}
