package benchkit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Undo is a stack of clean-ups, run last first.
type Undo []func()

// Push adds f, to run before everything pushed earlier.
func (u *Undo) Push(f func()) { *u = append(*u, f) }

// Run runs every clean-up, last first, and empties the stack.
func (u *Undo) Run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}

// SignalContext returns a context that is cancelled at the first SIGINT or
// SIGTERM, after saying so on standard error as prog.
func SignalContext(prog string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "\n%s: %v: stopping and cleaning up\n", prog, s)
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}

// Build builds package pkg of the module in dir into the binary out.
func Build(ctx context.Context, dir, out, pkg string) error {
	c := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	c.Dir = dir
	if b, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %v\n%s", pkg, dir, err, b)
	}
	return nil
}

// BuildRev builds package pkg as of git revision rev of the repository in
// modDir into out: the tree from `git archive` is unpacked in src (which
// must not exist) and built with the module cache.
func BuildRev(ctx context.Context, modDir, rev, src, out, pkg string) error {
	if err := os.Mkdir(src, 0o755); err != nil {
		return err
	}
	archive := exec.CommandContext(ctx, "git", "-C", modDir, "archive", "--format=tar", rev)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var aerr, terr bytes.Buffer
	archive.Stderr, untar.Stderr = &aerr, &terr
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return fmt.Errorf("git archive %s: %v\n%s", rev, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("tar: %v\n%s", err, terr.String())
	}
	if err := Build(ctx, src, out, pkg); err != nil {
		return fmt.Errorf("as of %s: %w", rev, err)
	}
	return nil
}

// MountTmpfs creates dir and mounts a private tmpfs of size bytes on it; u
// unmounts it.
func MountTmpfs(u *Undo, dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dk", size>>10)); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	u.Push(func() { Unmount(dir) })
	return nil
}

// AttachLoop attaches a loop device with direct I/O to file and returns its
// path; u detaches it.
func AttachLoop(ctx context.Context, u *Undo, file string) (string, error) {
	out, err := exec.CommandContext(ctx, "losetup", "--direct-io=on", "-f", "--show", file).Output()
	if err != nil {
		return "", fmt.Errorf("losetup %s: %w", file, err)
	}
	loop := strings.TrimSpace(string(out))
	u.Push(func() {
		if err := exec.Command("losetup", "-d", loop).Run(); err != nil {
			fmt.Fprintf(os.Stderr, "losetup -d %s: %v\n", loop, err)
		}
	})
	return loop, nil
}

// URingParam is the fuse module parameter that lets the kernel offer FUSE
// over io_uring to connections made while it is on.
const URingParam = "/sys/module/fuse/parameters/enable_uring"

// EnableURing switches URingParam on and returns what puts the old value
// back (once; later calls do nothing). A connection keeps io_uring once
// negotiated, so a caller puts it back as soon as its mounts answer, and
// other mounts on the machine are not moved to io_uring.
func EnableURing() (func(), error) {
	old, err := os.ReadFile(URingParam)
	if err != nil {
		return nil, fmt.Errorf("io_uring transport: %w (this kernel has no FUSE over io_uring)", err)
	}
	if err := os.WriteFile(URingParam, []byte("Y"), 0); err != nil {
		return nil, fmt.Errorf("switching on %s: %w", URingParam, err)
	}
	done := false
	return func() {
		if !done {
			done = true
			os.WriteFile(URingParam, bytes.TrimSpace(old), 0)
		}
	}, nil
}

// CPUTime returns the user and system CPU time process pid has used
// (utime+stime of /proc/PID/stat), 0 if it cannot be read.
func CPUTime(pid int) time.Duration {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	i := bytes.LastIndexByte(s, ')')
	f := strings.Fields(string(s[i+1:]))
	if len(f) < 13 {
		return 0
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15, in
	// clock ticks of USER_HZ (100 on Linux).
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * (time.Second / 100)
}

// ThreadCPU returns the CPU time of process pid's threads in nanoseconds
// and how many times they were switched to (the first and third fields of
// each /proc/PID/task/TID/schedstat), summed over the threads alive now: a
// thread that ended between two readings takes its share with it.
func ThreadCPU(pid int) (cpu time.Duration, runs int64) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue
		}
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		n, _ := strconv.ParseInt(f[2], 10, 64)
		cpu, runs = cpu+time.Duration(ns), runs+n
	}
	return cpu, runs
}

// Loadavg returns the 1, 5 and 15 minute load averages ("?" if unknown).
func Loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// RunFio runs fio with args in folder dir ("": the current one) in a process
// group of its own, killed with ctx, and returns its first job from
// --output-format=json (which args must ask for).
func RunFio(ctx context.Context, dir string, args ...string) (*FioJob, error) {
	c := exec.CommandContext(ctx, "fio", args...)
	c.Dir = dir
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return nil, fmt.Errorf("fio %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return ParseFio(out)
}

// FioArgs returns the arguments every timed fio run here shares: one job
// name on file, O_DIRECT, threads, runtime after a ramp of ramp, over the
// first size bytes, one group, JSON output.
func FioArgs(name, file string, runtime, ramp time.Duration, size int64) []string {
	return []string{
		"--name=" + name, "--filename=" + file, "--direct=1", "--thread",
		"--time_based", fmt.Sprintf("--runtime=%dms", runtime.Milliseconds()),
		fmt.Sprintf("--ramp_time=%dms", ramp.Milliseconds()),
		fmt.Sprintf("--size=%d", size), "--group_reporting", "--randrepeat=0",
		"--output-format=json",
	}
}

// ServerLine returns the first line of s's standard error that contains
// substr, without the "dmfuse: " prefix ("" if none).
func ServerLine(s *Server, substr string) string {
	for _, l := range strings.Split(s.Stderr(), "\n") {
		if strings.Contains(l, substr) {
			return strings.TrimPrefix(l, "dmfuse: ")
		}
	}
	return ""
}

// TempDir makes a scratch folder named after prog; u removes it.
func TempDir(u *Undo, prog string) (string, error) {
	d, err := os.MkdirTemp("", prog+"-")
	if err != nil {
		return "", err
	}
	u.Push(func() { os.RemoveAll(d) })
	return filepath.Clean(d), nil
}

// BuildScratch makes a scratch folder named after prog (u removes it) and
// builds dmfuse from the module in the working directory into it; it
// returns the folder and the binary.
func BuildScratch(ctx context.Context, u *Undo, prog string) (work, bin string, err error) {
	if work, err = TempDir(u, prog); err != nil {
		return "", "", err
	}
	bin = filepath.Join(work, "dmfuse")
	return work, bin, Build(ctx, ".", bin, "./cmd/dmfuse")
}

// machineStat returns the CPU time the whole machine spent busy (all CPUs,
// not idle nor waiting for I/O) and the context switches it made, since
// boot (/proc/stat).
func machineStat() (busy time.Duration, switches uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 9 && f[0] == "cpu":
			var n int64
			// user nice system idle iowait irq softirq steal
			for i, v := range f[1:9] {
				if i == 3 || i == 4 {
					continue
				}
				x, _ := strconv.ParseInt(v, 10, 64)
				n += x
			}
			busy = time.Duration(n) * (time.Second / 100)
		case len(f) == 2 && f[0] == "ctxt":
			switches, _ = strconv.ParseUint(f[1], 10, 64)
		}
	}
	return busy, switches
}

// Usage is what CPUWindow measured: the CPU of a process and of the whole
// machine in cores (CPU seconds per second), and the machine's context
// switches per second.
type Usage struct {
	Proc, Machine, Switches float64
}

// CPUWindow measures the CPU used during a window from offset from to offset
// to after now: by process pid (0: none) and by the whole machine, and the
// machine's context switches. The returned function waits for the end of
// the window; with ctx cancelled it returns zeros at once.
func CPUWindow(ctx context.Context, pid int, from, to time.Duration) func() Usage {
	ch := make(chan Usage, 1)
	start := time.Now()
	go func() {
		sleep := func(until time.Duration) bool { return Sleep(ctx, time.Until(start.Add(until))) == nil }
		if !sleep(from) {
			ch <- Usage{}
			return
		}
		p0, t0 := CPUTime(pid), time.Now()
		m0, s0 := machineStat()
		if !sleep(to) {
			ch <- Usage{}
			return
		}
		p1, d := CPUTime(pid), time.Since(t0)
		m1, s1 := machineStat()
		r := Usage{Machine: (m1 - m0).Seconds() / d.Seconds(), Switches: float64(s1-s0) / d.Seconds()}
		if pid != 0 {
			r.Proc = (p1 - p0).Seconds() / d.Seconds()
		}
		ch <- r
	}()
	return func() Usage { return <-ch }
}

// Sleep waits for d, or until ctx is done and then returns its error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Scratch returns the root of the dmfuse module (see ModuleDir) and a new
// scratch folder named after prog, which u removes.
func Scratch(u *Undo, prog string) (dir, modDir string, err error) {
	if modDir, err = ModuleDir(); err != nil {
		return "", "", err
	}
	dir, err = TempDir(u, prog)
	return dir, modDir, err
}
