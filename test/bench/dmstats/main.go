// Command dmstats measures what dm-stats regions cost on the I/O path, with
// fio, side by side in one run.
//
//	go run ./test/bench/dmstats [-pairs N] [-runtime D] [-size MIB] [-transport T]
//
// It needs root, /dev/fuse and fio; it installs nothing. It builds dmfuse,
// mounts a private tmpfs holding the backing file, mounts dmfuse on a linear
// device over that file (`lin`, -size MiB) and runs one fio job, 2 jobs x
// QD32 4 KiB O_DIRECT randread (libaio), in three region setups:
//
//	none    no region
//	whole   one region covering the device in one area:  @stats_create - /1
//	areas   one region of 1000 areas with a 10-boundary histogram:
//	        @stats_create - /1000 1 histogram:1,2,5,10,20,50,100,200,500,1000
//
// The setups run in interleaved rounds (none, whole, areas, in an order that
// rotates every round), so that a noisy machine slows them alike. It prints
// the median IOPS and mean latency of each setup and the median over the
// rounds of the per-round ratio setup/none. Everything it set up is torn down
// on exit, on error and on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"

	"golang.org/x/sys/unix"
)

type setup struct {
	name  string
	words []string // @stats_create words; nil: no region
}

var setups = []setup{
	{"none", nil},
	{"whole", []string{"@stats_create", "-", "/1"}},
	{"areas", []string{"@stats_create", "-", "/1000", "1", "histogram:1,2,5,10,20,50,100,200,500,1000"}},
}

func main() {
	pairs := flag.Int("pairs", 7, "interleaved rounds")
	runtime := flag.Duration("runtime", 10*time.Second, "fio runtime of each run")
	size := flag.Int("size", 256, "device size in MiB")
	transport := flag.String("transport", "dev", "dmfuse --transport")
	flag.Parse()
	if err := run(*pairs, *runtime, *size, *transport); err != nil {
		fmt.Fprintln(os.Stderr, "dmstats bench:", err)
		os.Exit(1)
	}
}

func run(pairs int, rt time.Duration, sizeMiB int, transport string) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	work, err := os.MkdirTemp("", "dmfuse-dmstats-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "dmfuse")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/dmfuse").CombinedOutput(); err != nil {
		return fmt.Errorf("go build (run from the repository root): %v\n%s", err, out)
	}
	tmpfs := filepath.Join(work, "tmpfs")
	mnt := filepath.Join(work, "mnt")
	os.Mkdir(tmpfs, 0o755)
	if err := unix.Mount("tmpfs", tmpfs, "tmpfs", 0, fmt.Sprintf("size=%dm", sizeMiB+16)); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	defer unix.Unmount(tmpfs, unix.MNT_DETACH)
	img := filepath.Join(tmpfs, "lin.img")
	sectors := int64(sizeMiB) << 11
	// Fill the file, so that reads hit pages rather than holes.
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+img, "bs=1M", fmt.Sprint("count=", sizeMiB)).CombinedOutput(); err != nil {
		return fmt.Errorf("dd: %v\n%s", err, out)
	}
	cfg := filepath.Join(work, "bench.conf")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "lin,,,rw,0 %d linear %s 0;\n", sectors, img), 0o644); err != nil {
		return err
	}
	sock := filepath.Join(work, "ctl.sock")
	daemon := exec.Command(bin, "mount", "--config", cfg, "--control", sock, "--transport", transport, mnt)
	daemon.Stderr = os.Stderr
	if err := daemon.Start(); err != nil {
		return err
	}
	defer func() {
		daemon.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { daemon.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			daemon.Process.Kill()
			<-done
		}
		unix.Unmount(mnt, unix.MNT_DETACH)
	}()
	dev := filepath.Join(mnt, "lin")
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, err := os.ReadFile(filepath.Join(mnt, "stats", "diskstats")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dmfuse did not mount")
		}
		time.Sleep(20 * time.Millisecond)
	}
	message := func(words ...string) (string, error) {
		out, err := exec.Command(bin, append([]string{"--control", sock, "message", "lin", "0"}, words...)...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("message %s: %v: %s", strings.Join(words, " "), err, out)
		}
		return strings.TrimSpace(string(out)), nil
	}

	iops := make(map[string][]float64)
	lat := make(map[string][]float64)
	ratios := make(map[string][]float64)
	for round := range pairs {
		got := map[string]float64{}
		for k := range setups {
			s := setups[(k+round)%len(setups)]
			id := ""
			if s.words != nil {
				if id, err = message(s.words...); err != nil {
					return err
				}
			}
			r, l, err := fio(ctx, dev, rt)
			if err != nil {
				return err
			}
			if id != "" {
				if _, err := message("@stats_delete", id); err != nil {
					return err
				}
			}
			got[s.name] = r
			iops[s.name] = append(iops[s.name], r)
			lat[s.name] = append(lat[s.name], l)
			fmt.Fprintf(os.Stderr, "round %d %-6s %9.0f IOPS  %7.1f µs\n", round+1, s.name, r, l)
		}
		for _, s := range setups {
			ratios[s.name] = append(ratios[s.name], got[s.name]/got["none"])
		}
	}
	fmt.Printf("fio randread 4 KiB, 2 jobs x QD32, libaio, O_DIRECT, %d MiB linear over tmpfs, %d rounds x %v, transport %s\n\n",
		sizeMiB, pairs, rt, transport)
	fmt.Println("| regions | median IOPS | median mean latency (µs) | median ratio to none |")
	fmt.Println("|---|---:|---:|---:|")
	for _, s := range setups {
		fmt.Printf("| %s | %.0f | %.1f | %.3f |\n", s.name, benchkit.Median(iops[s.name]), benchkit.Median(lat[s.name]), benchkit.Median(ratios[s.name]))
	}
	return nil
}

// fio runs the job once and returns its IOPS and mean latency in µs.
func fio(ctx context.Context, dev string, rt time.Duration) (float64, float64, error) {
	cmd := exec.CommandContext(ctx, "fio", "--name=randread", "--filename="+dev, "--rw=randread", "--bs=4k",
		"--direct=1", "--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--group_reporting",
		"--time_based", fmt.Sprintf("--runtime=%ds", int(rt.Seconds())), "--output-format=json")
	out, err := cmd.Output()
	if err != nil {
		return 0, 0, fmt.Errorf("fio: %v", err)
	}
	j, err := benchkit.ParseFio(out)
	if err != nil {
		return 0, 0, err
	}
	return j.Read.IOPS, j.Read.Lat.Mean / 1e3, nil
}
