// Package test holds dmfuse's end-to-end scenarios: each test starts the real
// dmfuse binary on a FUSE mount and drives it through the file system, loop
// devices, mkfs and fsck.
//
// The tests need root and /dev/fuse. Without them they skip, unless
// DMFUSE_REQUIRE_FUSE=1 is set (as CI does), in which case they fail.
package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/fs/export"
	"golang.org/x/sys/unix"
)

// dmfuseBin is the binary built once for the package's tests.
var dmfuseBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dmfuse-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dmfuseBin = filepath.Join(dir, "dmfuse")
	out, err := exec.Command("go", "build", "-o", dmfuseBin, "../cmd/dmfuse").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building dmfuse: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireFUSE skips (or, with DMFUSE_REQUIRE_FUSE=1, fails) a test that cannot
// mount here.
func requireFUSE(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	}
	if why == "" {
		return
	}
	if os.Getenv("DMFUSE_REQUIRE_FUSE") == "1" {
		t.Fatalf("cannot mount (%s) but DMFUSE_REQUIRE_FUSE=1", why)
	}
	t.Skipf("cannot mount: %s", why)
}

// requireTool skips (or fails under DMFUSE_REQUIRE_FUSE=1) without a program.
func requireTool(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			if os.Getenv("DMFUSE_REQUIRE_FUSE") == "1" {
				t.Fatalf("%s is not installed but DMFUSE_REQUIRE_FUSE=1", n)
			}
			t.Skipf("%s is not installed", n)
		}
	}
}

// daemon is one running `dmfuse mount`.
type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	mnt    string
	stderr daemonLog
	done   chan error
}

// servingLine starts the line the daemon logs once it has mounted and
// serves.
const servingLine = "dmfuse: serving "

// startDaemon mounts dmfuse on a new folder with the given concise config
// (written to a file in dir; "" means the embedded default set) and waits
// until the daemon says it serves and the mount answers. Cleanup stops it
// and unmounts whatever is left.
func startDaemon(t *testing.T, dir, config string, extra ...string) *daemon {
	t.Helper()
	requireFUSE(t)
	mnt := filepath.Join(dir, "mnt")
	args := []string{"mount"}
	if config != "" {
		cfg := filepath.Join(dir, "dmfuse.conf")
		if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", cfg)
	}
	args = append(args, transportArgs(extra)...)
	args = append(args, extra...)
	args = append(args, mnt)
	// Standard error goes straight to a file: what the daemon logged
	// before it served is there once it serves, with no copying goroutine
	// to fall behind.
	logf, err := os.CreateTemp(t.TempDir(), "dmfuse-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	d := &daemon{t: t, mnt: mnt, stderr: daemonLog(logf.Name()), done: make(chan error, 1)}
	d.cmd = exec.Command(dmfuseBin, args...)
	d.cmd.Stderr = logf
	d.cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+filepath.Join(dir, "state"))
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(d.cleanup)
	deadline := time.Now().Add(20 * time.Second)
	for {
		// The mount answers before the daemon is done starting: go-fuse
		// then opens a file on the new mount from the daemon itself
		// (fuse.Server.WaitMount, its poll hack), and a SIGKILL while that
		// file is open leaves the daemon unkillable, its exit waiting for
		// a FLUSH that only it could answer (fs/fuse/file.c: fuse_flush
		// forces the request, so request_wait_answer waits without
		// interruption). So a daemon is ready once it says it serves;
		// reading a file (not only stat, which the kernel may answer from
		// its cache of a dead mount) then proves that it serves the mount.
		if strings.Contains(d.stderr.String(), servingLine) {
			if _, err := os.ReadFile(filepath.Join(mnt, "stats", "diskstats")); err == nil {
				return d
			}
		}
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("dmfuse exited before mounting: %v\n%s", err, d.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dmfuse did not mount within 20s\n%s", d.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// path returns the path of a file inside the mount.
func (d *daemon) path(name ...string) string {
	return filepath.Join(append([]string{d.mnt}, name...)...)
}

// stop sends sig and waits for the daemon to exit (nil if it had exited
// already).
func (d *daemon) stop(sig os.Signal) error {
	// Whether it has exited is asked of d.done: cmd.ProcessState is written
	// by the goroutine that waits for the process.
	select {
	case err := <-d.done:
		d.done <- err
		return nil
	default:
	}
	d.cmd.Process.Signal(sig)
	select {
	case err := <-d.done:
		d.done <- err
		return err
	case <-time.After(20 * time.Second):
		return errors.New("dmfuse did not exit within 20s of " + sig.String())
	}
}

func (d *daemon) cleanup() {
	detachLoops(d.mnt)
	if err := d.stop(syscall.SIGTERM); err != nil {
		d.cmd.Process.Kill()
	}
	if export.Mounted(d.mnt) {
		unix.Unmount(d.mnt, unix.MNT_DETACH)
	}
	if d.t.Failed() {
		d.t.Logf("dmfuse stderr:\n%s", d.stderr)
	}
}

// detachLoops detaches every loop device backed by a file under dir.
func detachLoops(dir string) {
	for _, l := range export.LoopsUnder(dir) {
		exec.Command("losetup", "-d", l.Path).Run()
	}
}

// run runs a command and fails the test with its output on error.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sparseFile creates a sparse file of size bytes.
func sparseFile(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

// transportArgs passes DMFUSE_TRANSPORT (auto, uring or dev) on to the
// daemon unless the test picks a transport itself, so that the whole suite
// can run on each transport.
func transportArgs(extra []string) []string {
	t := os.Getenv("DMFUSE_TRANSPORT")
	if t == "" {
		return nil
	}
	for _, a := range extra {
		if a == "--transport" || strings.HasPrefix(a, "--transport=") {
			return nil
		}
	}
	return []string{"--transport", t}
}

// daemonLog is the file a daemon's standard error is written to.
type daemonLog string

// String returns what the daemon logged so far.
func (l daemonLog) String() string {
	b, err := os.ReadFile(string(l))
	if err != nil {
		return fmt.Sprintf("(reading the daemon's log: %v)", err)
	}
	return string(b)
}
