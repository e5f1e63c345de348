// Command acct measures what I/O accounting costs: it runs fio 4k randread,
// 2 jobs x QD32 (io_uring engine), on a linear device over a tmpfs file, on a
// normal dmfuse build and on one built with the noaccounting tag (every
// counter update compiled out), in interleaved pairs, and prints each pair's
// IOPS and the median cost.
//
//	go run ./test/bench/acct [-pairs 10] [-runtime 5s] [-transport dev]
//
// It needs root, /dev/fuse and fio, installs nothing, and removes its mounts,
// daemons and scratch folder on exit or Ctrl-C.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

func main() {
	pairs := flag.Int("pairs", 10, "interleaved on/off pairs")
	runtime := flag.Duration("runtime", 5*time.Second, "fio runtime of each run")
	transport := flag.String("transport", "dev", "dmfuse --transport")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *pairs, *runtime, *transport); err != nil {
		fmt.Fprintln(os.Stderr, "acct:", err)
		os.Exit(1)
	}
}

type daemon struct {
	cmd  *exec.Cmd
	mnt  string
	errb bytes.Buffer
}

func run(ctx context.Context, pairs int, runtime time.Duration, transport string) error {
	if _, err := exec.LookPath("fio"); err != nil {
		return errors.New("needs fio (apt-get install fio)")
	}
	dir, err := os.MkdirTemp("", "dmfuse-acct-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	shm := filepath.Join(dir, "tmpfs")
	os.Mkdir(shm, 0o700)
	if err := syscall.Mount("tmpfs", shm, "tmpfs", 0, "size=1g"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	defer syscall.Unmount(shm, syscall.MNT_DETACH)

	builds := map[string][]string{"on": nil, "off": {"-tags", "noaccounting"}}
	daemons := map[string]*daemon{}
	defer func() {
		for _, d := range daemons {
			d.cmd.Process.Signal(syscall.SIGTERM)
			d.cmd.Wait()
			syscall.Unmount(d.mnt, syscall.MNT_DETACH)
		}
	}()
	for _, leg := range []string{"on", "off"} {
		bin := filepath.Join(dir, "dmfuse-"+leg)
		args := append([]string{"build", "-o", bin}, builds[leg]...)
		if out, err := exec.Command("go", append(args, "./cmd/dmfuse")...).CombinedOutput(); err != nil {
			return fmt.Errorf("go build (%s): %v\n%s", leg, err, out)
		}
		img := filepath.Join(shm, leg+".img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			return err
		}
		if err := os.Truncate(img, 256<<20); err != nil {
			return err
		}
		cfg := filepath.Join(dir, leg+".conf")
		os.WriteFile(cfg, []byte("lin,,,rw,0 524288 linear "+img+" 0;"), 0o600)
		d := &daemon{mnt: filepath.Join(dir, "mnt-"+leg)}
		d.cmd = exec.Command(bin, "mount", "--transport", transport, "--config", cfg, d.mnt)
		d.cmd.Stderr = &d.errb
		if err := d.cmd.Start(); err != nil {
			return err
		}
		daemons[leg] = d
		if err := waitMount(d); err != nil {
			return err
		}
	}
	var ratios []float64
	fmt.Printf("| pair | accounting on IOPS | off IOPS | on/off |\n|---|---|---|---|\n")
	for i := 0; i < pairs; i++ {
		order := []string{"on", "off"}
		if i%2 == 1 {
			order = []string{"off", "on"}
		}
		iops := map[string]float64{}
		for _, leg := range order {
			v, err := fio(ctx, filepath.Join(daemons[leg].mnt, "lin"), runtime)
			if err != nil {
				return err
			}
			iops[leg] = v
		}
		r := iops["on"] / iops["off"]
		ratios = append(ratios, r)
		fmt.Printf("| %d | %.0f | %.0f | %.3f |\n", i+1, iops["on"], iops["off"], r)
	}
	med := benchkit.Median(ratios)
	fmt.Printf("\nmedian on/off %.3f: accounting costs %.1f%% of IOPS (pairs range %.3f-%.3f)\n",
		med, 100*(1-med), slices.Min(ratios), slices.Max(ratios))
	return nil
}

func waitMount(d *daemon) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.ReadFile(filepath.Join(d.mnt, "stats", "diskstats")); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dmfuse did not mount %s:\n%s", d.mnt, d.errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fio runs the 4k randread 2x32 job once and returns its IOPS.
func fio(ctx context.Context, file string, runtime time.Duration) (float64, error) {
	c := exec.CommandContext(ctx, "fio", "--name=acct", "--filename="+file, "--direct=1", "--rw=randread",
		"--bs=4k", "--ioengine=io_uring", "--iodepth=32", "--numjobs=2", "--thread", "--group_reporting",
		"--time_based", fmt.Sprintf("--runtime=%dms", runtime.Milliseconds()), "--ramp_time=1s",
		"--size=256m", "--randrepeat=0", "--output-format=json")
	out, err := c.Output()
	if err != nil {
		return 0, fmt.Errorf("fio: %v", err)
	}
	j, err := benchkit.ParseFio(out)
	if err != nil {
		return 0, err
	}
	return j.Read.IOPS, nil
}
