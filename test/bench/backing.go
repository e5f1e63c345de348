package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// The backing suite measures each daemon's linear device over each kind of
// backing against the kernel's loop device (direct I/O) over the same
// backing and against the daemon's zero device, which does no backing I/O
// (the transport's ceiling), 4k reads and writes at QD1 and 2x32, in
// interleaved rounds. The kinds:
//
//   - tmpfs: the suites' tmpfs file;
//   - ext4: a file in the scratch folder, which must be on ext4, read once
//     before each run so that its pages are cached;
//   - ext4-nocache: the same file, written back and its page cache dropped
//     (posix_fadvise POSIX_FADV_DONTNEED) before each run;
//   - block: a loop device (direct I/O) over a tmpfs file of its own, one
//     per daemon and one under the loop device measured beside them (a
//     block device is held exclusively by whoever maps it).

// backingKind is one kind of backing of the backing suite.
type backingKind struct {
	name  string
	title string
	dev   string            // the linear device's name in each daemon's table
	loop  string            // the loop device over the same backing
	file  string            // the ext4 file: warmed or dropped before each run
	drop  bool              // drop file's page cache before each run, else read it
	block map[string]string // block: config name -> its block device
}

// backingSetup makes the ext4 file and the block devices, before the
// daemons mount (their tables name them).
func (b *ubench) backingSetup(ctx context.Context, tmpfs string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(b.scratch, &fs); err != nil {
		return err
	}
	if fs.Type != unix.EXT4_SUPER_MAGIC {
		return fmt.Errorf("backing: the scratch folder %s is not on ext4 (set TMPDIR to a folder on ext4)", b.scratch)
	}
	e4 := filepath.Join(b.scratch, "ext4.img")
	if err := benchkit.Fill(e4, b.size); err != nil {
		return err
	}
	blockOver := func(name string) (string, error) {
		f := filepath.Join(tmpfs, name+".img")
		if err := benchkit.Fill(f, b.size); err != nil {
			return "", err
		}
		return benchkit.AttachLoop(ctx, &b.undo, f)
	}
	blk := backingKind{name: "block", title: "a loop block device (direct I/O) over a tmpfs file", dev: "lin-block", block: map[string]string{}}
	for _, c := range b.configs {
		d, err := blockOver("block-" + c.name)
		if err != nil {
			return err
		}
		blk.block[c.name] = d
	}
	under, err := blockOver("block-loop")
	if err != nil {
		return err
	}
	if blk.loop, err = benchkit.AttachLoop(ctx, &b.undo, under); err != nil {
		return err
	}
	e4loop, err := benchkit.AttachLoop(ctx, &b.undo, e4)
	if err != nil {
		return err
	}
	all := []backingKind{
		{name: "tmpfs", title: "the tmpfs file", dev: "linear"},
		{name: "ext4", title: "a file on ext4, cached (read whole before each run)", dev: "lin-ext4", loop: e4loop, file: e4},
		{name: "ext4-nocache", title: "the same ext4 file, written back and its page cache dropped before each run", dev: "lin-ext4", loop: e4loop, file: e4, drop: true},
		blk,
	}
	for _, k := range all {
		if slices.Contains(strings.Split(b.kindList, ","), k.name) {
			b.kinds = append(b.kinds, k)
		}
	}
	if len(b.kinds) == 0 {
		return fmt.Errorf("backing: no kind in %q (have tmpfs,ext4,ext4-nocache,block)", b.kindList)
	}
	return nil
}

// backingTable returns the lines of config c's table the backing suite
// adds.
func (b *ubench) backingTable(c *config) []string {
	sec := b.size / 512
	var lines []string
	seen := map[string]bool{"linear": true} // the tmpfs kind's, in every table
	for _, k := range b.kinds {
		backing := k.file
		if k.block != nil {
			backing = k.block[c.name]
		}
		if !seen[k.dev] {
			seen[k.dev] = true
			lines = append(lines, fmt.Sprintf("%s,,,rw,0 %d linear %s 0", k.dev, sec, backing))
		}
	}
	return lines
}

// prepare puts k's backing in the state its runs measure.
func (k backingKind) prepare() error {
	if k.file == "" {
		return nil
	}
	f, err := os.OpenFile(k.file, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if k.drop {
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return err
		}
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
	_, err = io.Copy(io.Discard, f)
	return err
}

// backing runs the 4k jobs of -jobs on each daemon's zero device, then per
// kind on each daemon's linear device and the loop device, in interleaved
// rounds.
func (b *ubench) backing(ctx context.Context) error {
	for i := range b.kinds {
		if b.kinds[i].name == "tmpfs" {
			b.kinds[i].loop = b.loop // attached with the other suites' loop device
		}
	}
	var jobs []job
	for _, j := range b.jobs {
		if !j.bw {
			jobs = append(jobs, j)
		}
	}
	// res[job][kind][target]: one run a round; kind "" holds the zero
	// devices, target a config's name or "loop".
	res := map[string]map[string]map[string][]urun{}
	for _, j := range jobs {
		res[j.name] = map[string]map[string][]urun{"": {}}
		for _, k := range b.kinds {
			res[j.name][k.name] = map[string][]urun{}
		}
	}
	per := len(b.configs) + len(b.kinds)*(len(b.configs)+1) // runs a job a round
	logf("backing: %d fio runs of %v (+%v ramp)", b.rounds*len(jobs)*per, b.runtime, b.ramp(b.runtime))
	start := time.Now()
	for r := range b.rounds {
		for _, j := range jobs {
			for _, c := range rotate(b.configs, r) {
				run, err := b.fio(ctx, j, c, c.dev("zero"), b.runtime)
				if err != nil {
					return fmt.Errorf("%s on zero of %s: %w", j.name, c.name, err)
				}
				res[j.name][""][c.name] = append(res[j.name][""][c.name], run)
			}
			for _, k := range rotate(b.kinds, r) {
				ts := []target{{name: "loop", dev: k.loop}}
				for _, c := range b.configs {
					ts = append(ts, target{c.name, c, c.dev(k.dev)})
				}
				for _, t := range rotate(ts, r) {
					if err := k.prepare(); err != nil {
						return fmt.Errorf("backing %s: %w", k.name, err)
					}
					run, err := b.fio(ctx, j, t.c, t.dev, b.runtime)
					if err != nil {
						return fmt.Errorf("%s on %s over %s: %w", j.name, t.name, k.name, err)
					}
					res[j.name][k.name][t.name] = append(res[j.name][k.name][t.name], run)
				}
			}
		}
		logf("backing: round %d/%d done (%v)", r+1, b.rounds, time.Since(start).Round(time.Second))
	}

	w := &b.w
	ref := b.configs[0].name
	fmt.Fprintf(w, "### Backing kinds\n\nEach daemon's linear device over each kind of backing, the loop device (direct I/O) over the same backing, and the daemon's zero device (no backing I/O: the transport's ceiling); IOPS medians of %d interleaved rounds, ratios the median (min-max) of the per-round ratios; CPU/IO is the daemon's CPU time per I/O on the linear device (utime+stime over the middle 80%% of the run), in us. The kinds: ", b.rounds)
	var titles []string
	for _, k := range b.kinds {
		titles = append(titles, fmt.Sprintf("%s, %s", k.name, k.title))
	}
	fmt.Fprintf(w, "%s.\n\n", strings.Join(titles, "; "))
	head := []string{"backing", "job", "loop"}
	for _, c := range b.configs {
		head = append(head, c.name, c.name+" zero", c.name+" / zero", c.name+" / loop", c.name+" CPU/IO")
	}
	for _, c := range b.configs[1:] {
		head = append(head, c.name+" / "+ref)
	}
	table(w, head)
	cpuPer := func(r urun) float64 { return r.cpu * 1e6 / r.iops }
	for _, k := range b.kinds {
		for _, j := range jobs {
			rs := res[j.name][k.name]
			row := []string{k.name, j.title, kilo(medOf(rs["loop"], j.value))}
			for _, c := range b.configs {
				zero := res[j.name][""][c.name]
				row = append(row, kilo(medOf(rs[c.name], j.value)), kilo(medOf(zero, j.value)),
					ratioCell(perRound(rs[c.name], zero, j.value)), ratioCell(perRound(rs[c.name], rs["loop"], j.value)),
					fmt.Sprintf("%.1f", medOf(rs[c.name], cpuPer)))
			}
			for _, c := range b.configs[1:] {
				row = append(row, ratioCell(perRound(rs[c.name], rs[ref], j.value)))
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}
	fmt.Fprintln(w)
	return nil
}
