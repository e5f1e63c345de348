package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// The peers suite answers what a user asks first: how dmfuse compares with
// what they would use instead to get a block device's file out of a
// userspace process. Over the one tmpfs file every config's devices use:
//
//   - qsd: qemu-storage-daemon's FUSE export of the file (file driver,
//     cache.direct=off as tmpfs takes no O_DIRECT; raw format; writable);
//   - nbdkit: nbdkit's file plugin over the file, served on a Unix socket,
//     mounted as a file by nbdfuse (libnbd);
//   - loop: the kernel's loop device with direct I/O.
//
// and for 1 ms of latency, each config's delay device d1 (linear + 1 ms on
// every read and write) against nbdkit's delay filter (rdelay=1ms
// wdelay=1ms) over the same plugin, through nbdfuse.

// peerPackages are the Debian packages of the peers, by the program the
// suite runs.
var peerPackages = [][2]string{
	{"qemu-storage-daemon", "qemu-system-common"},
	{"nbdkit", "nbdkit"},
	{"nbdfuse", "libnbd-bin"},
}

// installPeers installs the peers' Debian packages that are missing.
func installPeers(ctx context.Context) error {
	var missing []string
	for _, p := range peerPackages {
		if _, err := exec.LookPath(p[0]); err != nil {
			missing = append(missing, p[1])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	logf("peers: installing %s", strings.Join(missing, " "))
	for _, argv := range [][]string{{"apt-get", "update", "-qq"}, append([]string{"apt-get", "install", "-y", "-qq", "--no-install-recommends"}, missing...)} {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, out)
		}
	}
	return nil
}

// peer is one program the peers suite measures beside dmfuse: the file it
// serves and its process, whose CPU is measured.
type peer struct {
	name string
	file string
	pid  int
}

// startPeers starts qsd, nbdkit with nbdfuse, and nbdkit's delay filter
// with nbdfuse, over the tmpfs file.
func (b *ubench) startPeers(ctx context.Context) error {
	if err := installPeers(ctx); err != nil {
		return err
	}
	dir := filepath.Join(b.scratch, "peers")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// qemu-storage-daemon exports onto an existing regular file.
	qsdFile := filepath.Join(dir, "qsd.img")
	if err := os.WriteFile(qsdFile, nil, 0o644); err != nil {
		return err
	}
	qsd, err := benchkit.StartMounted(ctx, &b.undo, "qemu-storage-daemon", qsdFile, benchkit.FileReady(qsdFile), nil,
		"qemu-storage-daemon",
		"--blockdev", "node-name=file0,driver=file,filename="+b.lin+",cache.direct=off",
		"--blockdev", "node-name=fmt0,driver=raw,file=file0",
		"--export", "type=fuse,id=exp0,node-name=fmt0,mountpoint="+qsdFile+",writable=on")
	if err != nil {
		return err
	}
	b.peers = append(b.peers, &peer{name: "qsd", file: qsdFile, pid: qsd.Pid})
	for _, p := range []struct {
		name   string
		filter []string
	}{
		{"nbdkit", nil},
		{"nbdkit-delay", []string{"--filter=delay"}},
	} {
		sock := filepath.Join(dir, p.name+".sock")
		argv := append([]string{"nbdkit", "-f", "-U", sock}, p.filter...)
		argv = append(argv, "file", b.lin)
		if p.filter != nil {
			argv = append(argv, "rdelay=1ms", "wdelay=1ms")
		}
		srv, err := benchkit.StartMounted(ctx, &b.undo, p.name, "", func() bool { _, err := os.Stat(sock); return err == nil }, nil, argv...)
		if err != nil {
			return err
		}
		mnt := filepath.Join(dir, p.name)
		if err := os.MkdirAll(mnt, 0o755); err != nil {
			return err
		}
		file := filepath.Join(mnt, "disk")
		// nbdfuse serves in the foreground until it is unmounted or
		// signalled; its Stop runs before nbdkit's.
		if _, err := benchkit.StartMounted(ctx, &b.undo, "nbdfuse "+p.name, mnt, benchkit.FileReady(file), nil,
			"nbdfuse", file, "--unix", sock); err != nil {
			return err
		}
		b.peers = append(b.peers, &peer{name: p.name, file: file, pid: srv.Pid})
	}
	for _, p := range b.peers {
		logf("peers: %s serves %s (pid %d)", p.name, p.file, p.pid)
	}
	return nil
}

// peerNamed returns the peer called name.
func (b *ubench) peerNamed(name string) *peer {
	for _, p := range b.peers {
		if p.name == name {
			return p
		}
	}
	return nil
}

// peerJobs are the jobs of the peers suite: 4k QD1 and 2x32, reads and
// writes.
var peerJobs = []string{"randread", "randwrite", "uring-randread", "uring-randwrite"}

// peersSuite runs each job on every config's linear device, qsd, nbdkit
// and the loop device, then 4k QD1 reads and writes on every config's 1 ms
// delay device and on nbdkit's delay filter, in interleaved rounds.
func (b *ubench) peersSuite(ctx context.Context) error {
	type tgt struct {
		name string
		dev  string
		pid  int
	}
	var fast, slow []tgt
	for _, c := range b.configs {
		fast = append(fast, tgt{c.name, c.dev("linear"), c.pid})
		slow = append(slow, tgt{c.name, c.dev("d1"), c.pid})
	}
	for _, n := range []string{"qsd", "nbdkit"} {
		p := b.peerNamed(n)
		fast = append(fast, tgt{p.name, p.file, p.pid})
	}
	fast = append(fast, tgt{name: "loop", dev: b.loop})
	nd := b.peerNamed("nbdkit-delay")
	slow = append(slow, tgt{nd.name, nd.file, nd.pid})

	type row struct {
		j    job
		ts   []tgt
		rt   time.Duration
		runs map[string][]urun
	}
	var rows []*row
	for _, n := range peerJobs {
		rows = append(rows, &row{j: jobNamed(n), ts: fast, rt: b.runtime, runs: map[string][]urun{}})
	}
	for _, n := range []string{"randread", "randwrite"} {
		rows = append(rows, &row{j: jobNamed(n), ts: slow, rt: b.delayRuntime, runs: map[string][]urun{}})
	}
	n := 0
	for _, r := range rows {
		n += len(r.ts)
	}
	logf("peers: %d fio runs a round, %d rounds", n, b.rounds)
	start := time.Now()
	for rd := range b.rounds {
		for _, r := range rows {
			for _, t := range rotate(r.ts, rd) {
				run, err := b.fioPid(ctx, r.j, t.pid, t.dev, r.rt)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", r.j.name, t.name, err)
				}
				r.runs[t.name] = append(r.runs[t.name], run)
			}
		}
		logf("peers: round %d/%d done (%v)", rd+1, b.rounds, time.Since(start).Round(time.Second))
	}

	w := &b.w
	fmt.Fprintf(w, "### Peers\n\nOver one tmpfs file: each daemon's linear device, qemu-storage-daemon's FUSE export (qsd), nbdkit's file plugin through nbdfuse (nbdkit) and the loop device with direct I/O (loop); then each daemon's 1 ms delay device against nbdkit's delay filter (rdelay=1ms wdelay=1ms) through nbdfuse. fio with --direct=1; IOPS medians of %d interleaved rounds; a ratio is the median (min-max) of the per-round ratios of a daemon to the peer.\n\n", b.rounds)
	for _, r := range rows {
		delay := r.ts[len(r.ts)-1].name == "nbdkit-delay"
		title := r.j.title
		if delay {
			title += ", 1 ms delay"
		}
		fmt.Fprintf(w, "| %s | IOPS | daemon CPU per 1k IOPS |", title)
		var peers []string
		for _, t := range r.ts[len(b.configs):] {
			peers = append(peers, t.name)
		}
		for _, p := range peers {
			fmt.Fprintf(w, " / %s |", p)
		}
		fmt.Fprintf(w, "\n|---|---|---|%s\n", strings.Repeat("---|", len(peers)))
		for _, t := range r.ts {
			rs := r.runs[t.name]
			per := "-"
			if t.pid != 0 {
				per = fmt.Sprintf("%.1f ms/s", medOf(rs, func(u urun) float64 { return u.cpu * 1e6 / u.iops }))
			}
			fmt.Fprintf(w, "| %s | %s | %s |", t.name, kilo(medOf(rs, r.j.value)), per)
			for _, p := range peers {
				cell := "-"
				if !slices.Contains(peers, t.name) {
					cell = ratioCell(perRound(rs, r.runs[p], r.j.value))
				}
				fmt.Fprintf(w, " %s |", cell)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Daemon CPU is utime+stime of the serving process (for nbdkit the server, not nbdfuse) over the middle 80%% of each run, in ms per second per thousand IOPS (= us per I/O).\n\n")
	return nil
}

// peerVersion returns the first line a peer prints of its version.
func peerVersion(prog, flag string) string {
	out, err := exec.Command(prog, flag).Output()
	if err != nil {
		return prog + " (version unknown)"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
