package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/fs"
	"github.com/dmfuse/dmfuse/fs/export"
	"github.com/dmfuse/dmfuse/thin"
)

// The system instance: the daemon dmsetup starts by itself. It lives in a
// run folder, /run/dmfuse unless DMFUSE_RUN_DIR says otherwise:
//
//	RUN/mnt           the FUSE mount (one file per device)
//	RUN/control.sock  the control socket
//	RUN/daemon.pid    the daemon's pid
//	RUN/daemon.lock   held (flock) by the running daemon
//	RUN/start.lock    taken (flock) by a command that starts or cleans up
//	RUN/daemon.log    the daemon's standard output and error
//	RUN/nodes         the nodes the daemon made in the mapper folder
//
// Its devices are exported as loop devices with nodes in $DM_DEV_DIR/mapper
// (/dev/mapper), as the kernel's device-mapper has them. DMFUSE_TRANSPORT
// (auto, uring or dev) picks the FUSE transport, as dmfuse mount
// --transport does.

// defaultRunDir is the system instance's folder.
const defaultRunDir = "/run/dmfuse"

// startTimeout bounds how long a command waits for a daemon to serve.
var startTimeout = 10 * time.Second

// system is the system instance of one run folder.
type system struct{ dir string }

// systemInstance returns the system instance: DMFUSE_RUN_DIR, else
// /run/dmfuse.
func systemInstance() system {
	if d := os.Getenv("DMFUSE_RUN_DIR"); d != "" {
		if abs, err := filepath.Abs(d); err == nil {
			return system{abs}
		}
	}
	return system{defaultRunDir}
}

func (s system) path(name string) string { return filepath.Join(s.dir, name) }
func (s system) mount() string           { return s.path("mnt") }
func (s system) socket() string          { return s.path("control.sock") }

// mapperDir is where device nodes go: $DM_DEV_DIR/mapper, else /dev/mapper.
func mapperDir() string {
	if d := os.Getenv("DM_DEV_DIR"); d != "" {
		return filepath.Join(d, "mapper")
	}
	return "/dev/mapper"
}

// running reports whether a daemon holds the run folder's daemon lock.
func (s system) running() bool {
	f, err := os.OpenFile(s.path("daemon.lock"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// lockStart takes the start lock, which serialises starting the daemon and
// cleaning up after a dead one; the caller closes the file to release it.
func (s system) lockStart() (*os.File, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(s.path("start.lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// cleanup clears what a daemon that died left (its mount, loop devices,
// nodes, socket and pid file) and says what it did on w. The caller holds
// the start lock and has seen no daemon running.
func (s system) cleanup(w func(string)) {
	did := export.Cleanup(s.mount(), mapperDir(), s.path("nodes"))
	if export.Mounted(s.path("sys")) && unix.Unmount(s.path("sys"), unix.MNT_DETACH) == nil {
		did = append(did, "detached "+s.path("sys"))
	}
	for _, p := range []string{s.socket(), s.path("daemon.pid")} {
		if err := os.Remove(p); err == nil && len(did) == 0 {
			did = append(did, "removed "+p)
		}
	}
	if len(did) > 0 {
		w(fmt.Sprintf("dmfuse: the daemon of %s died; cleaned up: %s", s.dir, strings.Join(did, ", ")))
	}
}

// connect returns a caller for the system daemon. If none runs, it cleans
// up after a dead one, and with start starts one and waits until it
// serves; without start it returns nil.
func (s system) connect(start bool, warn func(string)) (*socketCaller, error) {
	if s.running() {
		if c, err := s.ready(false); c != nil || err != nil {
			return c, err
		}
		// It stopped while we waited: clean up and start one below.
	}
	if insideExec() {
		// A daemon started here would run in the command's namespace,
		// under the filter whose supervisor has gone with the old one.
		return nil, fmt.Errorf("system instance %s: not running, and a command under dmfuse exec cannot start it (the daemon serving the exec has stopped)", s.dir)
	}
	if _, err := os.Stat(s.dir); errors.Is(err, os.ErrNotExist) && !start {
		return nil, nil
	}
	lock, err := s.lockStart()
	if err != nil {
		return nil, fmt.Errorf("system instance %s: %w", s.dir, err)
	}
	defer lock.Close()
	if s.running() {
		if c, err := s.ready(true); c != nil || err != nil {
			return c, err
		}
	}
	s.cleanup(warn)
	if !start {
		return nil, nil
	}
	if err := s.start(); err != nil {
		return nil, err
	}
	return &socketCaller{s.socket()}, nil
}

// readyFDEnv names the file descriptor on which a daemon started by start
// says that it serves: it writes one byte once its control socket listens.
const readyFDEnv = "DMFUSE_READY_FD"

// start starts the daemon detached from the caller (its own session, stdio
// on the log file) and waits until it serves: the daemon writes a byte on
// an inherited pipe once its socket listens, and the pipe reads EOF if it
// exits before.
func (s system) start() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.OpenFile(s.path("daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	rd, wr, err := os.Pipe()
	if err != nil {
		return err
	}
	defer rd.Close()
	cmd := exec.Command(self, "daemon")
	cmd.Env = append(os.Environ(), "DMFUSE_RUN_DIR="+s.dir, readyFDEnv+"=3")
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, log, log
	cmd.ExtraFiles = []*os.File{wr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	closeInheritedOnExec()
	err = cmd.Start()
	wr.Close()
	if err != nil {
		return fmt.Errorf("starting the dmfuse daemon: %w", err)
	}
	// The daemon outlives this command: it is not waited for, so that it
	// is never left a zombie of a long-lived caller either.
	go cmd.Wait()
	rd.SetReadDeadline(time.Now().Add(startTimeout))
	var b [1]byte
	if n, err := rd.Read(b[:]); n == 1 {
		return nil
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("the dmfuse daemon did not answer within %v; see %s", startTimeout, s.path("daemon.log"))
	}
	return fmt.Errorf("the dmfuse daemon exited before it served; see %s", s.path("daemon.log"))
}

// closeInheritedOnExec marks every file descriptor above standard error
// close-on-exec, so that the daemon, which outlives this command, holds
// nothing the caller left open in it: a lock (flock(1) passes its
// descriptor to the command it runs), a pipe whose reader waits for EOF, a
// make jobserver. This command's own descriptors are close-on-exec already,
// and the daemon's ready pipe is passed as ExtraFiles, which exec keeps.
func closeInheritedOnExec() {
	if unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	// Before Linux 5.11: one by one.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

// ready returns a caller for a running daemon once it answers on its
// socket, nil if the daemon exits meanwhile. One that has just started holds its lock before it listens, and
// the command that started it holds the start lock until it listens: so
// wait for that lock (unless the caller holds it: locked), and poll only
// for a daemon started by hand or one that is stopping.
func (s system) ready(locked bool) (*socketCaller, error) {
	dial := func() bool {
		c, err := net.Dial("unix", s.socket())
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	if dial() {
		return &socketCaller{s.socket()}, nil
	}
	if !locked {
		if lock, err := s.lockStart(); err == nil {
			lock.Close()
			if dial() {
				return &socketCaller{s.socket()}, nil
			}
		}
	}
	deadline := time.Now().Add(startTimeout)
	for wait := time.Millisecond; !dial() && s.running() && time.Now().Before(deadline); wait = min(2*wait, 20*time.Millisecond) {
		time.Sleep(wait)
	}
	if !s.running() {
		return nil, nil // it stopped: the caller may start another
	}
	return &socketCaller{s.socket()}, nil // Call reports why it cannot connect
}

// socketCaller sends requests to a daemon's control socket.
type socketCaller struct{ path string }

// Call sends req (control.Call).
func (c *socketCaller) Call(req *control.Request) (*control.Response, error) {
	return control.Call(c.path, req)
}

// DaemonCmd is `dmfuse daemon`: the system instance, which dmsetup starts.
type DaemonCmd struct{}

// Run serves the system instance until SIGTERM or SIGINT finds no device
// left in use.
func (c *DaemonCmd) Run() error {
	s := systemInstance()
	ready := readyPipe()
	if ready != nil {
		// Closed at exit whatever happens: the starter then reads EOF.
		defer ready.Close()
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(s.path("daemon.lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("%s: another dmfuse daemon runs there", s.dir)
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s dmfuse: %s\n", time.Now().Format(time.RFC3339), fmt.Sprintf(format, a...))
	}
	// Whatever a dead daemon left is cleared by the command that starts
	// this one; a daemon started by hand clears it here.
	s.cleanup(func(msg string) { logf("%s", msg) })
	if err := os.WriteFile(s.path("daemon.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(s.path("daemon.pid"))

	return runDaemon(daemonOptions{
		mount:  s.mount(),
		fs:     fs.Options{Transport: os.Getenv("DMFUSE_TRANSPORT")},
		socket: s.socket(), strict: true,
		thinNoSpaceTimeout: thin.DefaultNoSpaceTimeout,
		export:             &exportOptions{mapper: mapperDir(), state: s.path("nodes"), execNodes: s.path("exec-nodes"), sys: s.path("sys")},
		removeOnStop:       true,
		logf:               logf,
		served: func() {
			if ready != nil {
				ready.Write([]byte{1})
				ready.Close()
			}
		},
	})
}

// readyPipe returns the pipe on which the daemon says that it serves
// (readyFDEnv), nil if it was started without one. Programs the daemon
// runs do not inherit it.
func readyPipe() *os.File {
	fd, err := strconv.Atoi(os.Getenv(readyFDEnv))
	os.Unsetenv(readyFDEnv)
	if err != nil || fd < 3 {
		return nil
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "ready")
}

// StopCmd is `dmfuse stop`: stop the system instance, or with --mount or
// --control the daemon of that mount or socket.
type StopCmd struct {
	Force bool `help:"Stop even while devices are in use: file systems mounted on them are unmounted lazily, their loop devices detached and their nodes removed; also clears what a daemon that died left."`
}

// stopWait bounds how long stop waits for the daemon to exit once it said
// it stops.
const stopWait = 10 * time.Second

// Run asks the system daemon to stop (the control request stop) and waits
// until it has exited. Without --force the daemon stops only once none of
// its devices is in use and its mount can go; otherwise it says why and
// keeps serving. A daemon that does not answer on its socket is sent
// SIGTERM (SIGKILL with --force). With --force, what is left after the
// daemon exits, or after one that died, is cleared as the next command
// would clear it.
func (c *StopCmd) Run(g *Globals) error {
	if g.Mount != "" || g.Control != "" {
		return c.stopDaemon(g)
	}
	s := systemInstance()
	if s.running() {
		if err := c.stop(s); err != nil {
			return err
		}
	}
	if !c.Force {
		return nil
	}
	lock, err := s.lockStart()
	if err != nil {
		return fmt.Errorf("system instance %s: %w", s.dir, err)
	}
	defer lock.Close()
	if !s.running() {
		s.cleanup(func(msg string) { fmt.Fprintln(os.Stderr, msg) })
	}
	return nil
}

// stop stops the running daemon and waits until it exits.
func (c *StopCmd) stop(s system) error {
	b, err := os.ReadFile(s.path("daemon.pid"))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("%s: %v", s.path("daemon.pid"), err)
	}
	resp, err := control.Call(s.socket(), &control.Request{Op: control.OpStop, Force: c.Force})
	switch {
	case err == nil && resp.Error != "" && !c.Force:
		return errors.New(resp.Error)
	case err != nil || resp.Error != "":
		// No answer (a daemon that hangs, or one of a version without the
		// request): signal it.
		sig := unix.SIGTERM
		if c.Force {
			sig = unix.SIGKILL
		}
		if err := unix.Kill(pid, sig); err != nil && s.running() {
			return fmt.Errorf("daemon %d: %w", pid, err)
		}
	}
	for deadline := time.Now().Add(stopWait); s.running(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			if c.Force {
				unix.Kill(pid, unix.SIGKILL)
				deadline = time.Now().Add(stopWait)
				continue
			}
			return fmt.Errorf("the daemon of %s (pid %d) still runs: some device is in use (see %s)", s.dir, pid, s.path("daemon.log"))
		}
	}
	return nil
}

// stopDaemon stops the daemon that --mount or --control names, as the
// request stop does (the devices go with the mount; without --force it is
// refused while one is in use), and waits until its mount is gone (with
// only --control, until its socket stops answering).
func (c *StopCmd) stopDaemon(g *Globals) error {
	path, err := g.controlPath()
	if err != nil {
		return err
	}
	resp, err := control.Call(path, &control.Request{Op: control.OpStop, Force: c.Force})
	if err != nil {
		return err
	}
	if resp.Error != "" {
		return errors.New(resp.Error)
	}
	mnt := ""
	if g.Mount != "" {
		if mnt, err = filepath.Abs(g.Mount); err != nil {
			return err
		}
	}
	for deadline := time.Now().Add(stopWait); ; time.Sleep(10 * time.Millisecond) {
		gone := mnt == "" || !export.Mounted(mnt)
		if gone {
			if conn, err := net.Dial("unix", path); err == nil {
				conn.Close()
				gone = false
			}
		}
		if gone {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon of %s still serves %v after it said it stops", path, stopWait)
		}
	}
}
