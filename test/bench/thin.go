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
	"golang.org/x/sys/unix"
)

// The thin suite measures thin provisioning on the first config's daemon,
// with pools over files of a tmpfs of its own, made through the control
// socket as dmsetup would make them:
//
//   - pz: a thin-pool with 64 KiB blocks (error_if_no_space); its thin
//     volume tp of -size, provisioned by writing it once, against lin, a
//     linear device over the first -size of pz's data file (where the
//     prefill put tp's blocks): 4k randread and randwrite, psync QD1 and
//     io_uring 2x32, and randwrite psync QD1 with --fsync=1.
//   - first writes: 4 KiB writes 64 KiB apart (fio rw=write:60k), each the
//     first write of its block, to a new thin volume of pz (the rest of the
//     block zeroed) and of ps (the same pool with skip_block_zeroing); and
//     the same writes to tp after a snapshot of it (suspend, create_snap,
//     resume), each breaking the sharing of a block (a 64 KiB copy). The
//     volumes and snapshots are deleted after their run.
//   - RSS: a pool pb with skip_block_zeroing over a sparse data file of
//     -thin-blocks 64 KiB blocks (one million: 64 GiB) on the tmpfs, a thin
//     volume as large written 4 KiB into every block by io_uring 2x32 (4
//     GiB of tmpfs for a million); the daemon's VmRSS and VmHWM
//     (/proc/PID/status) before and after.
const thinBlock = 64 << 10

// thinJobs are the provisioned jobs, against lin.
var thinJobs = []string{"randread", "randwrite", "uring-randread", "uring-randwrite"}

// thinFsync is the commit-cost job.
var thinFsync = job{name: "fsync-randwrite", title: "4k randwrite psync QD1 --fsync=1", write: true,
	args: []string{"--rw=randwrite", "--bs=4k", "--ioengine=psync", "--iodepth=1", "--numjobs=1", "--fsync=1"}}

// firstDepths are the first-write jobs' engine, depth and job count, and
// the provisioned job each is compared with.
var firstDepths = []struct {
	title, ref string
	args       []string
	jobs       int
}{
	{"psync QD1", "randwrite", []string{"--ioengine=psync", "--iodepth=1"}, 1},
	{"io_uring 2x32", "uring-randwrite", []string{"--ioengine=io_uring", "--iodepth=32"}, 2},
}

// thinCtx is what the thin suite set up.
type thinCtx struct {
	c      *config
	sock   string
	dir    string // its tmpfs
	nextID int
}

func (t *thinCtx) ctl(args ...string) (string, error) { return benchkit.Ctl(t.c.bin, t.sock, args...) }

func (t *thinCtx) msg(pool, m string) error {
	_, err := t.ctl(append([]string{"message", pool, "0"}, strings.Fields(m)...)...)
	return err
}

// pool creates a thin-pool NAME over a new zeroed metadata file and a data
// file of dataSize (preallocated unless sparse).
func (t *thinCtx) pool(name string, metaSize, dataSize int64, sparse bool, features ...string) error {
	meta, data := filepath.Join(t.dir, name+".meta"), filepath.Join(t.dir, name+".data")
	if err := os.WriteFile(meta, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(meta, metaSize); err != nil {
		return err
	}
	f, err := os.Create(data)
	if err != nil {
		return err
	}
	if sparse {
		err = f.Truncate(dataSize)
	} else {
		err = fallocate(f, dataSize)
	}
	f.Close()
	if err != nil {
		return err
	}
	table := fmt.Sprintf("0 %d thin-pool %s %s %d 0 %d %s", dataSize/512, meta, data, thinBlock/512, len(features), strings.Join(features, " "))
	_, err = t.ctl("create", name, "--table", strings.TrimSpace(table))
	return err
}

// volume creates a new thin device of pool and activates it as name.
func (t *thinCtx) volume(pool, name string, size int64) (id int, err error) {
	id = t.nextID
	t.nextID++
	if err = t.msg(pool, "create_thin "+strconv.Itoa(id)); err != nil {
		return
	}
	_, err = t.ctl("create", name, "--table", fmt.Sprintf("0 %d thin %s %d", size/512, pool, id))
	return
}

// drop removes device name and deletes thin id of pool.
func (t *thinCtx) drop(pool, name string, id int) error {
	if name != "" {
		if _, err := t.ctl("remove", name); err != nil {
			return err
		}
	}
	return t.msg(pool, "delete "+strconv.Itoa(id))
}

// firstWrites writes 4 KiB at the start of every 64 KiB block of dev (size
// bytes), split between the jobs, and returns the write IOPS.
func (b *ubench) firstWrites(ctx context.Context, dev string, size int64, jobs int, engine []string) (float64, error) {
	part := size / int64(jobs)
	args := []string{"--name=first", "--filename=" + dev, "--direct=1", "--thread", "--rw=write:60k", "--bs=4k",
		fmt.Sprintf("--size=%d", part), fmt.Sprintf("--offset_increment=%d", part), fmt.Sprintf("--numjobs=%d", jobs),
		"--group_reporting", "--output-format=json"}
	r, err := benchkit.RunFio(ctx, b.scratch, append(args, engine...)...)
	if err != nil {
		return 0, err
	}
	return r.Write.IOPS, nil
}

// thin runs the thin suite on the first config.
func (b *ubench) thin(ctx context.Context) error {
	t := &thinCtx{c: b.configs[0], sock: filepath.Join(b.scratch, b.configs[0].name+".sock"), dir: filepath.Join(b.scratch, "thin")}
	size := b.size
	dataZ := size + 4*size // tp, and a margin for the first writes and broken shares of a round
	// The pools' data, or the RSS pool's 4 KiB a block, and metadata.
	if err := benchkit.MountTmpfs(&b.undo, t.dir, max(dataZ+2*size, b.thinBlocks*4096)+1<<30); err != nil {
		return err
	}
	var undo benchkit.Undo
	defer undo.Run()
	if err := t.pool("pz", 64<<20, dataZ, false, "error_if_no_space"); err != nil {
		return err
	}
	undo.Push(func() { t.ctl("remove", "pz") })
	if err := t.pool("ps", 64<<20, 2*size, false, "skip_block_zeroing", "error_if_no_space"); err != nil {
		return err
	}
	undo.Push(func() { t.ctl("remove", "ps") })
	tpID, err := t.volume("pz", "tp", size)
	if err != nil {
		return err
	}
	undo.Push(func() { t.ctl("remove", "tp") })
	if _, err := t.ctl("create", "lin", "--table", fmt.Sprintf("0 %d linear %s 0", size/512, filepath.Join(t.dir, "pz.data"))); err != nil {
		return err
	}
	undo.Push(func() { t.ctl("remove", "lin") })
	logf("thin: prefilling tp (%d MiB)", size>>20)
	if _, err := benchkit.RunFio(ctx, b.scratch, "--name=prefill", "--filename="+t.c.dev("tp"), "--direct=1", "--rw=write",
		"--bs=1M", "--ioengine=io_uring", "--iodepth=4", fmt.Sprintf("--size=%d", size), "--output-format=json"); err != nil {
		return fmt.Errorf("prefilling tp: %w", err)
	}

	prov := map[string]map[string][]urun{} // job -> device -> one a round
	var fsync = map[string][]urun{}
	first := map[string][][]float64{} // variant -> depth -> IOPS a round
	variants := []string{"zeroing", "skip_block_zeroing", "breaking sharing"}
	for _, v := range variants {
		first[v] = make([][]float64, len(firstDepths))
	}
	devs := []string{"tp", "lin"}
	logf("thin: %d rounds", b.rounds)
	start := time.Now()
	for r := range b.rounds {
		for _, jn := range thinJobs {
			j := jobNamed(jn)
			if prov[jn] == nil {
				prov[jn] = map[string][]urun{}
			}
			for _, d := range rotate(devs, r) {
				run, err := b.fio(ctx, j, t.c, t.c.dev(d), b.runtime)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", jn, d, err)
				}
				prov[jn][d] = append(prov[jn][d], run)
			}
		}
		for _, d := range rotate(devs, r) {
			run, err := b.fio(ctx, thinFsync, t.c, t.c.dev(d), b.runtime)
			if err != nil {
				return fmt.Errorf("fsync randwrite on %s: %w", d, err)
			}
			fsync[d] = append(fsync[d], run)
		}
		for i, fd := range firstDepths {
			for _, v := range rotate(variants, r) {
				var iops float64
				var err error
				switch v {
				case "breaking sharing":
					id := t.nextID
					t.nextID++
					if _, err = t.ctl("suspend", "tp"); err == nil {
						err = t.msg("pz", fmt.Sprintf("create_snap %d %d", id, tpID))
						if _, rerr := t.ctl("resume", "tp"); err == nil {
							err = rerr
						}
					}
					if err == nil {
						iops, err = b.firstWrites(ctx, t.c.dev("tp"), size, fd.jobs, fd.args)
					}
					if err == nil {
						err = t.drop("pz", "", id)
					}
				default:
					pool := "pz"
					if v == "skip_block_zeroing" {
						pool = "ps"
					}
					var id int
					if id, err = t.volume(pool, "tnew", size); err == nil {
						iops, err = b.firstWrites(ctx, t.c.dev("tnew"), size, fd.jobs, fd.args)
						if derr := t.drop(pool, "tnew", id); err == nil {
							err = derr
						}
					}
				}
				if err != nil {
					return fmt.Errorf("first writes, %s, %s: %w", v, fd.title, err)
				}
				first[v][i] = append(first[v][i], iops)
			}
		}
		logf("thin: round %d/%d done (%v)", r+1, b.rounds, time.Since(start).Round(time.Second))
	}
	// The RSS pool's data takes tmpfs pages: free those of the others.
	undo.Run()
	for _, f := range []string{"pz.meta", "pz.data", "ps.meta", "ps.data"} {
		os.Remove(filepath.Join(t.dir, f))
	}
	rss, err := b.thinRSS(ctx, t)
	if err != nil {
		return err
	}

	w := &b.w
	fmt.Fprintf(w, "### Thin provisioning\n\nDaemon %s. tp: a thin volume of %d MiB of a pool with 64 KiB blocks over files of a tmpfs, provisioned by writing it once; lin: a linear device over the first %d MiB of the pool's data file (tp's blocks). IOPS medians of %d interleaved rounds, %v per run (+%v ramp); ratios the median (min-max) of the per-round ratios. Goal of thin / linear: 0.85.\n\n",
		t.c.name, size>>20, size>>20, b.rounds, b.runtime, b.ramp(b.runtime))
	table(w, []string{"job", "thin (tp)", "linear", "thin / linear"})
	for _, jn := range thinJobs {
		j := jobNamed(jn)
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", j.title, kilo(medOf(prov[jn]["tp"], j.value)), kilo(medOf(prov[jn]["lin"], j.value)),
			ratioCell(perRound(prov[jn]["tp"], prov[jn]["lin"], j.value)))
	}
	fmt.Fprintf(w, "| %s (commit cost) | %s | %s | %s |\n", thinFsync.title, kilo(medOf(fsync["tp"], thinFsync.value)), kilo(medOf(fsync["lin"], thinFsync.value)),
		ratioCell(perRound(fsync["tp"], fsync["lin"], thinFsync.value)))
	fmt.Fprintf(w, "\nFirst writes: 4 KiB at the start of each 64 KiB block of a %d MiB volume (fio rw=write:60k, %d writes, split between the jobs), each provisioning its block: on a new volume (the other 60 KiB zeroed), on a new volume of a pool with skip_block_zeroing, and on tp after a snapshot of it (suspend, create_snap, resume), each write copying its shared block first. Ratio: per round, to the provisioned randwrite of the same depth on tp.\n\n",
		size>>20, size/thinBlock)
	table(w, []string{"writes", "depth", "IOPS", "/ provisioned randwrite"})
	for _, v := range variants {
		for i, fd := range firstDepths {
			ref := prov[fd.ref]["tp"]
			var rs []float64
			for k, x := range first[v][i] {
				rs = append(rs, x/ref[k].iops)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", v, fd.title, kilo(benchkit.Median(first[v][i])), ratioCell(rs))
		}
	}
	fmt.Fprintf(w, "\n%s\n\n", rss)
	return nil
}

// thinRSS fills a pool of one million 64 KiB blocks and reports the
// daemon's memory before and after.
func (b *ubench) thinRSS(ctx context.Context, t *thinCtx) (string, error) {
	size := b.thinBlocks * thinBlock
	if err := t.pool("pb", 512<<20, size, true, "skip_block_zeroing", "error_if_no_space"); err != nil {
		return "", err
	}
	defer func() {
		t.ctl("remove", "pb")
		os.Remove(filepath.Join(t.dir, "pb.data"))
		os.Remove(filepath.Join(t.dir, "pb.meta"))
	}()
	id, err := t.volume("pb", "big", size)
	if err != nil {
		return "", err
	}
	defer t.drop("pb", "big", id)
	before := procStatus(t.c.pid)
	logf("thin: writing 4 KiB into each of %d blocks", b.thinBlocks)
	start := time.Now()
	iops, err := b.firstWrites(ctx, t.c.dev("big"), size, 2, []string{"--ioengine=io_uring", "--iodepth=32"})
	if err != nil {
		return "", fmt.Errorf("filling the volume of the RSS pool: %w", err)
	}
	took := time.Since(start)
	after := procStatus(t.c.pid)
	st, _ := t.ctl("status", "pb")
	return fmt.Sprintf("Daemon memory with %d mapped blocks: a pool with skip_block_zeroing over a sparse data file of %d MiB on the tmpfs, a thin volume as large written 4 KiB into each of its %d blocks (io_uring 2x32, %s IOPS, %v). VmRSS before %s, after %s; VmHWM after %s. Pool status after: `%s`.",
		b.thinBlocks, size>>20, b.thinBlocks, kilo(iops), took.Round(time.Second), before["VmRSS"], after["VmRSS"], after["VmHWM"], strings.TrimSpace(st)), nil
}

// procStatus returns the fields of /proc/PID/status.
func procStatus(pid int) map[string]string {
	out := map[string]string{}
	s, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(s), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// fallocate allocates size bytes of f.
func fallocate(f *os.File, size int64) error { return unix.Fallocate(int(f.Fd()), 0, 0, size) }
