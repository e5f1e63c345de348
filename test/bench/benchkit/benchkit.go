// Package benchkit holds what dmfuse's benchmark commands share: mount
// helpers, backing files, the environment a result was measured in, and
// medians.
package benchkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dmfuse/dmfuse/fs/export"
	"golang.org/x/sys/unix"
)

// Unmount unmounts dir, lazily if a plain unmount fails.
func Unmount(dir string) {
	if err := unix.Unmount(dir, 0); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
}

// IsMount reports whether dir is a mount point of this mount namespace.
func IsMount(dir string) bool { return export.Mounted(dir) }

// Fill writes size bytes of pseudo-random data (the same every time) to a new
// file, so that reads are of real data rather than of a sparse hole.
func Fill(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(buf); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			buf[i+k] = byte(v >> (8 * k))
		}
	}
	for w := int64(0); w < size; w += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-w)]); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// ModuleDir returns the root of the dmfuse module.
func ModuleDir() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run from inside the dmfuse module")
	}
	return filepath.Dir(mod), nil
}

// Kernel returns the running kernel's release.
func Kernel() string {
	var u unix.Utsname
	unix.Uname(&u)
	return unix.ByteSliceToString(u.Release[:])
}

// FioVersion returns fio's version, without the "fio-" prefix.
func FioVersion() string {
	out, _ := exec.Command("fio", "--version").Output()
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "fio-")
}

// Median returns the median of v (0 for none); v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Server is a FUSE server process (dmfuse or a baseline) started by
// StartServer.
type Server struct {
	// Pid is the server's process id.
	Pid int

	name   string
	mnt    string
	cmd    *exec.Cmd
	done   chan struct{}
	mu     sync.Mutex
	stderr bytes.Buffer
}

// StartServer starts argv in its own process group, so that a Ctrl-C reaches
// it only through Stop, with env added to the environment. name is used in
// messages; mnt is the folder it mounts on.
func StartServer(name, mnt string, env []string, argv ...string) (*Server, error) {
	s := &Server{name: name, mnt: mnt, done: make(chan struct{})}
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.stderr.Write(p)
	})
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.cmd.Env = append(os.Environ(), env...)
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	s.Pid = s.cmd.Process.Pid
	go func() { s.cmd.Wait(); close(s.done) }()
	return s, nil
}

// Stderr returns what the server has written to its standard error so far.
func (s *Server) Stderr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// WaitReady waits up to 20 s until ready reports that the mount answers.
func (s *Server) WaitReady(ctx context.Context, ready func() bool) error {
	deadline := time.Now().Add(20 * time.Second)
	for !ready() {
		select {
		case <-s.done:
			return fmt.Errorf("%s exited before mounting:\n%s", s.name, s.Stderr())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not mount within 20s:\n%s", s.name, s.Stderr())
		}
	}
	return nil
}

// WaitServing waits, as WaitReady, until a dmfuse daemon has said that it
// serves. Its device files appear before that: an io_uring daemon registers
// its rings and logs the transport it chose after them.
func (s *Server) WaitServing(ctx context.Context) error {
	return s.WaitReady(ctx, func() bool { return ServerLine(s, "serving ") != "" })
}

// Stop sends SIGTERM and waits up to grace for the server to exit; then it
// unmounts lazily and kills it. A mount left behind is unmounted lazily.
func (s *Server) Stop(grace time.Duration) {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(grace):
		fmt.Fprintf(os.Stderr, "%s did not exit within %v of SIGTERM; unmounting lazily and killing it\n%s",
			s.name, grace, s.Stderr())
		unix.Unmount(s.mnt, unix.MNT_DETACH)
		s.cmd.Process.Kill()
		<-s.done
	}
	if IsMount(s.mnt) {
		unix.Unmount(s.mnt, unix.MNT_DETACH)
	}
}

// FileReady returns a readiness check: path exists and is not empty (a device
// file of a mounted server).
func FileReady(path string) func() bool {
	return func() bool {
		st, err := os.Stat(path)
		return err == nil && st.Size() > 0
	}
}

// StartMounted starts a server as StartServer does, pushes its Stop (with
// a grace of 20 s) on u, and waits until ready reports that it answers.
func StartMounted(ctx context.Context, u *Undo, name, mnt string, ready func() bool, env []string, argv ...string) (*Server, error) {
	srv, err := StartServer(name, mnt, env, argv...)
	if err != nil {
		return nil, err
	}
	u.Push(func() { srv.Stop(20 * time.Second) })
	if err := srv.WaitReady(ctx, ready); err != nil {
		return nil, err
	}
	return srv, nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// FioJob is the first (with --group_reporting, the only) job of fio's JSON
// output.
type FioJob struct {
	Read  FioDir `json:"read"`
	Write FioDir `json:"write"`
}

// FioDir is one direction of a fio job.
type FioDir struct {
	IOPS    float64 `json:"iops"`
	BWBytes float64 `json:"bw_bytes"`
	Lat     FioLat  `json:"lat_ns"`  // submission to completion
	Clat    FioLat  `json:"clat_ns"` // completion latency
}

// FioLat is a latency summary in nanoseconds; Percentile is keyed like
// "99.000000".
type FioLat struct {
	Mean       float64            `json:"mean"`
	Percentile map[string]float64 `json:"percentile"`
}

// ParseFio reads fio's --output-format=json output, skipping any notes fio
// printed before the document, and returns its first job.
func ParseFio(out []byte) (*FioJob, error) {
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var r struct {
		Jobs []FioJob `json:"jobs"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("cannot parse fio output: %w", err)
	}
	if len(r.Jobs) == 0 {
		return nil, errors.New("cannot parse fio output: no jobs")
	}
	return &r.Jobs[0], nil
}

// CPUTicks returns the utime+stime of process pid in clock ticks of
// USER_HZ (CPUTime in TicksPerSec units), or 0 when it cannot be read.
func CPUTicks(pid int) int64 {
	return int64(CPUTime(pid) / (time.Second / TicksPerSec))
}

// TicksPerSec is USER_HZ, the unit of CPUTicks.
const TicksPerSec = 100

// FioRandWrite runs fio 4 KiB random writes with O_DIRECT on dev for rt,
// with extra arguments (engine, depth, jobs, fsync), and returns the write
// IOPS.
func FioRandWrite(ctx context.Context, dev string, rt time.Duration, extra ...string) (float64, error) {
	args := append([]string{"--name=randwrite", "--filename=" + dev, "--rw=randwrite", "--bs=4k", "--direct=1",
		"--group_reporting", "--time_based", fmt.Sprintf("--runtime=%ds", int(rt.Seconds())), "--output-format=json"}, extra...)
	out, err := exec.CommandContext(ctx, "fio", args...).Output()
	if err != nil {
		return 0, fmt.Errorf("fio %s: %v", strings.Join(extra, " "), err)
	}
	j, err := ParseFio(out)
	if err != nil {
		return 0, err
	}
	return j.Write.IOPS, nil
}

// Ctl runs `bin --control sock args...` (a dmfuse control command) and
// returns its output.
func Ctl(bin, sock string, args ...string) (string, error) {
	out, err := exec.Command(bin, append([]string{"--control", sock}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("dmfuse %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Job is one fio job of a table: its title and the arguments it adds.
type Job struct {
	Title string
	Args  []string
}

// RandWriteJobs are the write jobs that measure what a target costs against
// the same stack without it, for FioRandWrite: psync QD1 and libaio 2 jobs
// x QD32, each without flushes and with an fsync every 32 writes.
var RandWriteJobs = []Job{
	{"randwrite psync QD1", []string{"--ioengine=psync", "--iodepth=1", "--numjobs=1"}},
	{"randwrite psync QD1, fsync/32", []string{"--ioengine=psync", "--iodepth=1", "--numjobs=1", "--fsync=32"}},
	{"randwrite libaio 2x32", []string{"--ioengine=libaio", "--iodepth=32", "--numjobs=2"}},
	{"randwrite libaio 2x32, fsync/32", []string{"--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--fsync=32"}},
}

// Main runs run, which writes its tables to w, printing them and, when out
// is not empty, writing them to the file out too; on an error it prints
// "NAME bench: ERROR" and exits with status 1.
func Main(name, out string, run func(w io.Writer) error) {
	var res bytes.Buffer
	if err := run(io.MultiWriter(os.Stdout, &res)); err != nil {
		fmt.Fprintf(os.Stderr, "%s bench: %v\n", name, err)
		os.Exit(1)
	}
	if out != "" {
		if err := os.WriteFile(out, res.Bytes(), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
