package dmsetup

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/stack"
)

// harness runs the command line against an in-process daemon (a
// control.Server over a stack.Manager), started by the first command that
// starts one, as the system daemon is.
type harness struct {
	t       *testing.T
	dir     string
	devDir  string
	mgr     *stack.Manager
	srv     *control.Server
	offline *control.Server
	running bool
	starts  int
	slept   time.Duration
	env     map[string]string
}

func registry(t *testing.T) *stack.Registry {
	reg, err := stack.NewRegistry(stack.Linear, stack.Striped, stack.Zero, stack.Error, stack.Flakey, stack.Dust)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, devDir: filepath.Join(dir, "dev"), env: map[string]string{}}
	if err := os.MkdirAll(filepath.Join(h.devDir, "mapper"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a.img", "b.img"} {
		if err := os.WriteFile(filepath.Join(dir, n), make([]byte, 8192*stack.SectorSize), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The vectors were recorded on a kernel whose device-mapper major is
	// 253; the harness's devices report that major.
	h.mgr = stack.NewManager(stack.ManagerOptions{Registry: registry(t), Context: ctx, CoreMessage: stack.DMStatsMessage, Major: 253})
	h.srv = control.NewServer(ctx, h.mgr)
	off := stack.NewManager(stack.ManagerOptions{Registry: registry(t), Context: ctx, Major: 253})
	h.offline = control.NewServer(ctx, off)
	h.env["DM_DEV_DIR"] = h.devDir
	t.Cleanup(func() { h.srv.Close(); h.offline.Close(); h.mgr.Close(); off.Close(); cancel() })
	return h
}

// caller answers like a daemon over its socket.
func caller(s *control.Server) Caller {
	return CallerFunc(func(req *control.Request) (*control.Response, error) {
		return s.Handle(context.Background(), req), nil
	})
}

// run runs one command line and returns stdout, stderr and the exit status.
func (h *harness) run(stdin string, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	env := &Env{
		Prog: "dmsetup", Args: args, Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return h.env[k] },
		Dir:    h.dir,
		Connect: func(start bool) (Caller, error) {
			if !h.running && start {
				h.running = true
				h.starts++
			}
			if !h.running {
				return nil, nil
			}
			return caller(h.srv), nil
		},
		Offline: caller(h.offline),
		Sleep:   func(d time.Duration) { h.slept += d },
		Root:    true,
	}
	code := Run(env)
	return out.String(), errb.String(), code
}

// transcript runs command lines and records them as a shell session would
// show them: the command, stdin after "< ", stdout as is, stderr lines
// after "stderr: ", and a non-zero exit status.
type transcript struct {
	h *harness
	b strings.Builder
}

func (tr *transcript) step(stdin string, args ...string) {
	out, errs, code := tr.h.run(stdin, args...)
	tr.b.WriteString("$ dmsetup")
	for _, a := range args {
		tr.b.WriteByte(' ')
		tr.b.WriteString(shellQuote(a))
	}
	tr.b.WriteByte('\n')
	if stdin != "" {
		tr.b.WriteString("< " + shellQuote(stdin) + "\n")
	}
	tr.b.WriteString(out)
	for _, l := range strings.SplitAfter(errs, "\n") {
		if l != "" {
			tr.b.WriteString("stderr: " + l)
		}
	}
	if code != 0 {
		tr.b.WriteString("exit " + string(rune('0'+code)) + "\n")
	}
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n\"'\\$;&|<>*?()#") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`).Replace(s) + `"`
}
