package test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/fs/export"
)

// stopCmd runs `dmfuse stop` with args against the test's system instance
// and returns its combined output and exit status.
func (e *dmsetupEnv) stopCmd(args ...string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, dmfuseBin, append([]string{"stop"}, args...)...)
	cmd.Env = e.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("dmfuse stop: %v", err)
	}
	return out.String(), 0
}

// TestStopWhileMounted: `dmfuse stop` while a file system is mounted on a
// device answers at once that it cannot, naming the device and the mount,
// changes nothing, and leaves a daemon whose socket answers; once the file
// system is unmounted, stop stops it.
func TestStopWhileMounted(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("base", 64<<20)
	lin := e.name("lin")
	e.must("create", lin, "--table", "0 131072 linear "+dev+" 0")
	run(t, "mkfs.ext4", "-q", "/dev/mapper/"+lin)
	mnt := e.mountDev("/dev/mapper/"+lin, "m")
	writeFile(t, filepath.Join(mnt, "f"), "kept", true)
	pid := e.pid()

	start := time.Now()
	out, code := e.stopCmd()
	if code == 0 || !strings.Contains(out, "still in use") || !strings.Contains(out, lin) || !strings.Contains(out, mnt) {
		t.Errorf("stop while %s is mounted: exit %d, %q", mnt, code, out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refusal took %v", d)
	}
	if e.pid() != pid || !alive(pid) {
		t.Fatalf("the daemon is gone (pid %d, before %d)", e.pid(), pid)
	}
	if _, err := os.Stat(filepath.Join(e.run, "control.sock")); err != nil {
		t.Errorf("control socket: %v", err)
	}
	// The daemon still answers, its device still works.
	if got := e.must("ls"); !strings.Contains(got, lin) {
		t.Errorf("ls after a refused stop: %q", got)
	}
	writeFile(t, filepath.Join(mnt, "g"), "more", true)
	if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(b) != "kept" {
		t.Errorf("file after a refused stop: %q, %v", b, err)
	}
	e.must("create", e.name("z"), "--table", "0 8 zero")
	e.must("remove", e.name("z"))

	run(t, "umount", mnt)
	if out, code := e.stopCmd(); code != 0 {
		t.Fatalf("stop after the unmount: exit %d, %s", code, out)
	}
	if alive(pid) || export.Mounted(filepath.Join(e.run, "mnt")) {
		t.Error("the daemon or its mount is still there after stop")
	}
	if _, err := os.Lstat("/dev/mapper/" + lin); err == nil {
		t.Error("the node is left after stop")
	}
}

// TestStopForce: `dmfuse stop --force` while a file system is mounted on a
// device tears down the mount, the loop devices and the nodes; the next
// create starts a new daemon over the same disk, and the file system on it
// mounts, keeps what was synced and takes writes.
func TestStopForce(t *testing.T) {
	e := newDmsetupEnv(t)
	dev := e.loop("base", 64<<20)
	lin := e.name("lin")
	table := "0 131072 linear " + dev + " 0"
	e.must("create", lin, "--table", table)
	run(t, "mkfs.ext4", "-q", "/dev/mapper/"+lin)
	mnt := e.mountDev("/dev/mapper/"+lin, "m")
	writeFile(t, filepath.Join(mnt, "f"), "synced", true)
	run(t, "sync")
	pid := e.pid()
	runMnt := filepath.Join(e.run, "mnt")

	if out, code := e.stopCmd("--force"); code != 0 {
		t.Fatalf("stop --force: exit %d, %s", code, out)
	}
	if alive(pid) {
		t.Fatalf("daemon %d still runs after stop --force", pid)
	}
	if export.Mounted(mnt) {
		t.Errorf("%s is still mounted", mnt)
	}
	if export.Mounted(runMnt) {
		t.Errorf("%s is still mounted", runMnt)
	}
	for deadline := time.Now().Add(5 * time.Second); len(loopsOf(runMnt)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices left: %v", loopsOf(runMnt))
		}
	}
	if _, err := os.Lstat("/dev/mapper/" + lin); err == nil {
		t.Error("the node is left after stop --force")
	}

	// Everything works again: a new daemon, the same disk, the same file
	// system.
	e.must("create", lin, "--table", table)
	if e.pid() == 0 || e.pid() == pid {
		t.Fatalf("no new daemon (pid %d, before %d)", e.pid(), pid)
	}
	run(t, "mount", "/dev/mapper/"+lin, mnt)
	if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(b) != "synced" {
		t.Errorf("file after stop --force and a new create: %q, %v", b, err)
	}
	writeFile(t, filepath.Join(mnt, "g"), "new", true)
	run(t, "umount", mnt)
	e.must("remove", lin)
	if out, code := e.stopCmd(); code != 0 {
		t.Fatalf("stop: exit %d, %s", code, out)
	}
	// A forced stop with no daemon running does nothing and succeeds.
	if out, code := e.stopCmd("--force"); code != 0 || out != "" {
		t.Errorf("stop --force without a daemon: exit %d, %q", code, out)
	}
}

// TestStopMountDaemon: `dmfuse stop --mount MNT` stops the daemon of that
// mount (not the system instance): refused, with the daemon still serving,
// while a device file is open; once it is closed, the daemon unmounts and
// exits before stop returns.
func TestStopMountDaemon(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "z,,,rw,0 2048 zero\n")
	f, err := os.Open(d.path("z"))
	if err != nil {
		t.Fatal(err)
	}
	stop := func() (string, error) {
		out, err := exec.Command(dmfuseBin, "stop", "--mount", d.mnt).CombinedOutput()
		return string(out), err
	}
	if out, err := stop(); err == nil || !strings.Contains(out, "still serving") {
		t.Errorf("stop while z is open: %v, %q", err, out)
	}
	if _, err := os.ReadFile(d.path("stats", "diskstats")); err != nil {
		t.Fatalf("the mount after a refused stop: %v", err)
	}
	f.Close()
	if out, err := stop(); err != nil {
		t.Fatalf("stop: %v, %s", err, out)
	}
	if export.Mounted(d.mnt) {
		t.Error("still mounted after stop returned")
	}
	select {
	case err := <-d.done:
		d.done <- err
	case <-time.After(10 * time.Second):
		t.Error("the daemon still runs 10s after stop returned")
	}
}
