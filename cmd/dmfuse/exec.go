package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/control/dmexec"
)

// ExecCmd is `dmfuse exec [--] COMMAND [ARGS...]`.
type ExecCmd struct {
	Command []string `arg:"" passthrough:"" help:"The command and its arguments."`
}

// execChildArg is the hidden first argument of the process that becomes the
// command; its set-up comes in the environment variable execChildEnv.
const (
	execChildArg = "__exec-child"
	execChildEnv = "DMFUSE_EXEC_CHILD"
)

// Run runs the command with device-mapper as the kernel offers it, served
// by the system instance (started if none runs), and exits with its status.
func (c *ExecCmd) Run() error {
	argv := c.Command
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return errors.New("exec: no command given")
	}
	if insideExec() {
		// A nested exec: the outer filter and namespace serve this one.
		path, err := exec.LookPath(argv[0])
		if err != nil {
			return err
		}
		return syscall.Exec(path, argv, os.Environ())
	}
	if os.Geteuid() != 0 {
		return errors.New("exec: needs root (device-mapper needs CAP_SYS_ADMIN, and the command gets a mount namespace of its own)")
	}
	s := systemInstance()
	caller, err := s.connect(true, func(msg string) { fmt.Fprintln(os.Stderr, "dmfuse: "+msg) })
	if err != nil {
		return err
	}
	resp, err := caller.Call(&control.Request{Op: control.OpReport})
	if err != nil {
		return err
	}
	if resp.Error != "" {
		return errors.New(resp.Error)
	}
	reps, err := control.ParseReport(resp.Output)
	if err != nil {
		return err
	}
	resp, err = caller.Call(&control.Request{Op: control.OpAbout})
	if err != nil {
		return err
	}
	var about control.About
	if err := json.Unmarshal([]byte(resp.Output), &about); err != nil {
		return fmt.Errorf("exec: the daemon's answer: %w", err)
	}
	child := dmexec.Child{Argv: argv, Major: about.Major, DevDir: devDir(), Private: s.path("exec"), Sys: s.path("sys"), Detach: []string{s.mount()}}
	for _, r := range reps {
		child.Devices = append(child.Devices, dmexec.Device{Name: r.Name, Major: r.Major, Minor: r.Minor})
	}
	if err := os.MkdirAll(child.Private, 0o700); err != nil {
		return err
	}
	if st, err := os.Stat(child.Sys); err != nil || !st.IsDir() {
		child.Sys = ""
	}
	setup, err := json.Marshal(child)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, execChildArg)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), execChildEnv+"="+string(setup))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	// The command takes the terminal's signals itself; the wrapper waits.
	signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			os.Exit(128 + int(st.Signal()))
		}
		os.Exit(ee.ExitCode())
	}
	if err != nil {
		return err
	}
	os.Exit(0)
	return nil
}

// runExecChild is the process that becomes the command: its set-up comes
// from `dmfuse exec` in the environment.
func runExecChild() int {
	var child dmexec.Child
	if err := json.Unmarshal([]byte(os.Getenv(execChildEnv)), &child); err != nil {
		fmt.Fprintf(os.Stderr, "dmfuse exec: %v\n", err)
		return 1
	}
	os.Unsetenv(execChildEnv)
	s := systemInstance()
	child.Supervise = func(fd int) error {
		n := int32(fd)
		resp, err := control.Call(s.socket(), &control.Request{Op: control.OpSupervise, FD: &n})
		if err != nil {
			return err
		}
		if resp.Error != "" {
			return errors.New(resp.Error)
		}
		return nil
	}
	err := child.Run()
	fmt.Fprintf(os.Stderr, "dmfuse exec: %v\n", err)
	return 127
}

// insideExec reports whether this process runs under `dmfuse exec`: the
// marker is set and the process is under a seccomp filter.
func insideExec() bool {
	if os.Getenv(dmexec.EnvMarker) == "" {
		return false
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Seccomp_filters:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n > 0
		}
	}
	return false
}

// devDir is $DM_DEV_DIR, else /dev.
func devDir() string {
	if d := os.Getenv("DM_DEV_DIR"); d != "" {
		return d
	}
	return "/dev"
}
