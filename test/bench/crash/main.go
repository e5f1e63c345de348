// Command crash measures `dmfuse crash`:
//
//	go run ./test/bench/crash [-states N] [-rounds N] [-out FILE]
//
// It needs root, /dev/fuse, mkfs.ext4, e2fsck and go; it installs nothing.
// On a private tmpfs it formats a 256 MiB ext4 image and writes a log of the
// log-writes target's format by hand: 64 writes of 4 KiB to free blocks of
// the file system (random data at random free blocks) and a flush after
// them. The cut before the flush has 2^64 states, of which -states are
// sampled.
//
//   - states per second, e2fsck -fn on each state: through dmfuse crash
//     (each state an overlay on one base copy, served by FUSE), with 1 and 2
//     checks at a time, against a full copy per state (the state written out
//     to a file on the tmpfs with Overlay, then e2fsck -fn on the file), the
//     same states in the same order; the setups alternate for -rounds
//     rounds, the table gives the medians;
//   - shrinking: a check that runs e2fsck -fn and fails when two chosen
//     writes are both lost; dmfuse crash finds a failing state among the
//     samples and shrinks it, the table gives the time with and without
//     shrinking, the checks the shrink ran and the writes it kept.
//
// Everything it set up is torn down on exit, on error and on SIGINT or
// SIGTERM.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/crash"
	"github.com/dmfuse/dmfuse/logwrites"
	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

const (
	devSize = 256 << 20
	writes  = 64
	unit    = 512
)

func main() {
	states := flag.Int("states", 64, "states sampled at the cut")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	out := flag.String("out", "", "also write the tables to this file")
	flag.Parse()
	benchkit.Main("crash", *out, func(w io.Writer) error { return run(w, *states, *rounds) })
}

func run(w io.Writer, states, rounds int) error {
	ctx, cancel := benchkit.SignalContext("crash")
	defer cancel()
	var u benchkit.Undo
	defer u.Run()
	work, bin, err := benchkit.BuildScratch(ctx, &u, "dmfuse-crash-bench")
	if err != nil {
		return err
	}
	tmpfs := filepath.Join(work, "tmpfs")
	if err := benchkit.MountTmpfs(&u, tmpfs, 6*devSize); err != nil {
		return err
	}
	img := filepath.Join(tmpfs, "ext4.img")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(img, devSize); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-b", "4096", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	blocks, err := freeBlocks(ctx, img)
	if err != nil {
		return err
	}
	logPath := filepath.Join(tmpfs, "log.img")
	picked, err := writeLog(logPath, blocks)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Machine: %d CPUs, kernel %s, %s; load average %s at the start.\n\n", runtime.NumCPU(), benchkit.Kernel(), runtime.Version(), benchkit.Loadavg())
	fmt.Fprintf(w, "A 256 MiB ext4 image on tmpfs; a log of %d writes of 4 KiB to free blocks and a flush; %d states sampled at the cut before the flush (seed 1), each checked with e2fsck -fn.\n\n", writes, states)

	fsck := `e2fsck -fn "$DMFUSE_CRASH_DEV" >/dev/null`
	overlay := func(jobs int) (float64, error) {
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, bin, "crash", "--log", logPath, "--image", img, "--at", "flush", "--states", strconv.Itoa(states),
			"--jobs", strconv.Itoa(jobs), "--workdir", tmpfs, "--check", fsck).CombinedOutput()
		if err != nil || !strings.Contains(string(out), fmt.Sprintf("all %d states at 1 cuts pass", states)) {
			return 0, fmt.Errorf("dmfuse crash: %v: %s", err, out)
		}
		return float64(states) / time.Since(t0).Seconds(), nil
	}
	copyEach := func() (float64, error) { return fullCopies(ctx, logPath, img, tmpfs, states) }
	var ov1, ov2, cp []float64
	for r := 0; r < rounds; r++ {
		for _, f := range []func() error{
			func() error { v, err := overlay(1); ov1 = append(ov1, v); return err },
			func() error { v, err := overlay(2); ov2 = append(ov2, v); return err },
			func() error { v, err := copyEach(); cp = append(cp, v); return err },
		} {
			if err := f(); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(w, "| setup | states/s (median of %d) | runs |\n|---|---:|---|\n", rounds)
	row := func(name string, v []float64) {
		fmt.Fprintf(w, "| %s | %.1f | %s |\n", name, benchkit.Median(v), fmts(v))
	}
	row("dmfuse crash, overlay, 1 check at a time", ov1)
	row("dmfuse crash, overlay, 2 at a time", ov2)
	row("full copy per state, 1 at a time", cp)
	fmt.Fprintf(w, "\nOverlay against full copy, 1 at a time: %.2fx.\n\n", benchkit.Median(ov1)/benchkit.Median(cp))

	// Shrinking: fail when the blocks of writes a and b both read as zeros
	// (free blocks of a fresh file system hold zeros).
	a, b := picked[5], picked[40]
	check := fmt.Sprintf(`%s || exit 2
z() { [ "$(dd if="$DMFUSE_CRASH_DEV" bs=4096 skip=$1 count=1 status=none | tr -d '\000' | wc -c)" = 0 ]; }
! { z %d && z %d; }`, fsck, a, b)
	shrink := func(extra ...string) (time.Duration, string, error) {
		t0 := time.Now()
		args := append([]string{"crash", "--log", logPath, "--image", img, "--at", "flush", "--states", "16", "--jobs", "2", "--workdir", tmpfs, "--check", check}, extra...)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			return 0, "", fmt.Errorf("dmfuse crash (shrink): %v: %s", err, out)
		}
		return time.Since(t0), string(out), nil
	}
	var with, without []float64
	var last string
	for r := 0; r < rounds; r++ {
		d1, out, err := shrink()
		if err != nil {
			return err
		}
		d0, _, err := shrink("--no-shrink")
		if err != nil {
			return err
		}
		with, without, last = append(with, d1.Seconds()), append(without, d0.Seconds()), out
	}
	m := regexp.MustCompile(`minimal failing state: (\S+)\n((?:    .*\n)+)`).FindStringSubmatch(last)
	if m == nil {
		return fmt.Errorf("no minimal state in:\n%s", last)
	}
	fmt.Fprintf(w, "Shrinking: the check fails when the writes to blocks %d and %d are both lost; 16 states sampled, 2 checks at a time.\n\n", a, b)
	fmt.Fprintf(w, "| run | seconds (median of %d) | runs |\n|---|---:|---|\n", rounds)
	fmt.Fprintf(w, "| find the failures, no shrinking | %.2f | %s |\n", benchkit.Median(without), fmts(without))
	fmt.Fprintf(w, "| find and shrink the first | %.2f | %s |\n", benchkit.Median(with), fmts(with))
	fmt.Fprintf(w, "\nShrinking took %.2f s; the minimal state: `%s`\n\n```\n%s```\n", benchkit.Median(with)-benchkit.Median(without), m[1], m[2])
	return nil
}

func fmts(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, ", ")
}

// freeBlocks lists free 4 KiB blocks of the image, past the first half (so
// that no metadata is near), as dumpe2fs reports them.
func freeBlocks(ctx context.Context, img string) ([]int64, error) {
	out, err := exec.CommandContext(ctx, "dumpe2fs", img).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("dumpe2fs: %v", err)
	}
	var free []int64
	for _, m := range regexp.MustCompile(`(?m)^\s+Free blocks: (.*)$`).FindAllStringSubmatch(string(out), -1) {
		for _, r := range strings.Split(m[1], ", ") {
			lo, hi, isRange := strings.Cut(strings.TrimSpace(r), "-")
			a, err1 := strconv.ParseInt(lo, 10, 64)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.ParseInt(hi, 10, 64)
			}
			if err1 != nil || err2 != nil {
				continue
			}
			for x := max(a, devSize/4096/2); x <= b; x++ {
				free = append(free, x)
			}
		}
	}
	if len(free) < writes {
		return nil, fmt.Errorf("only %d free blocks in the second half", len(free))
	}
	return free, nil
}

// writeLog writes the log: a write of random data to each of 64 random
// free blocks, then a flush. It returns the blocks in log order.
func writeLog(path string, free []int64) ([]int64, error) {
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	picked := free[:writes]
	var b bytes.Buffer
	u := make([]byte, unit)
	logwrites.PutSuper(u, logwrites.Super{Magic: logwrites.Magic, Version: logwrites.Version, NrEntries: writes + 1, SectorSize: unit})
	b.Write(u)
	data := make([]byte, 4096)
	for _, blk := range picked {
		logwrites.PutHeader(u, logwrites.Header{Sector: uint64(blk * 8), NrSectors: 8}, "")
		b.Write(u)
		for i := 0; i < len(data); i += 8 {
			binary.LittleEndian.PutUint64(data[i:], r.Uint64()|1)
		}
		b.Write(data)
	}
	logwrites.PutHeader(u, logwrites.Header{Flags: logwrites.FlagFlush}, "")
	b.Write(u)
	return picked, os.WriteFile(path, b.Bytes(), 0o644)
}

// fullCopies checks the same states as dmfuse crash, each written out to a
// file of its own first, one at a time, and returns the states per second.
func fullCopies(ctx context.Context, logPath, img, dir string, states int) (float64, error) {
	lf, err := os.Open(logPath)
	if err != nil {
		return 0, err
	}
	defer lf.Close()
	rec, err := crash.Scan(lf, logwrites.Size(lf))
	if err != nil {
		return 0, err
	}
	cut := rec.Writes[len(rec.Writes)-1].Entry
	sts, _ := rec.States(cut, crash.Options{Mode: crash.Subset, Limit: states, Seed: 1})
	t0 := time.Now()
	base, err := os.Open(img)
	if err != nil {
		return 0, err
	}
	defer base.Close()
	for _, s := range sts {
		o := crash.NewOverlay(rec, s, base, lf, devSize)
		p := filepath.Join(dir, "state.img")
		f, err := os.Create(p)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(f, io.NewSectionReader(o, 0, devSize))
		f.Close()
		if err != nil {
			return 0, err
		}
		if out, err := exec.CommandContext(ctx, "e2fsck", "-fn", p).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("e2fsck on a copy: %v: %s", err, out)
		}
		os.Remove(p)
	}
	return float64(len(sts)) / time.Since(t0).Seconds(), nil
}
