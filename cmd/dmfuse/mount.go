package main

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/fs"
	"github.com/dmfuse/dmfuse/fs/export"
	"github.com/dmfuse/dmfuse/stack"
)

//go:embed default.conf
var defaultConfig string

// defaultImageSize is the size of the default set's backing file.
const defaultImageSize = 1 << 30

// MountCmd is `dmfuse mount`.
type MountCmd struct {
	Config      string `help:"Devices to create at start, in the dmsetup create --concise format (default: the embedded default set)." type:"path" placeholder:"FILE"`
	MetricsAddr string `help:"Serve Prometheus metrics on http://HOST:PORT/metrics (port 0: a free port, which the log names): the devices' counters and the daemon's memory, goroutines and threads." placeholder:"HOST:PORT"`
	MemoryLimit string `name:"memory-limit" help:"Memory the daemon stays under (Go's soft limit); half of it bounds the request buffers, and requests beyond wait in the kernel. Default: GOMEMLIMIT if set, else 64MiB; off for none." placeholder:"SIZE"`
	Pprof       string `help:"Serve go tool pprof's profiles on http://HOST:PORT/debug/pprof/ (loopback addresses only)." placeholder:"HOST:PORT"`
	AllowOther  bool   `help:"Let other users use the device files."`
	Debug       bool   `help:"Log every FUSE request." hidden:""`

	Transport     string `help:"How requests reach the daemon: auto (io_uring when the kernel offers it, else /dev/fuse), uring or dev." enum:"auto,uring,dev" default:"auto"`
	EnableURing   bool   `name:"enable-uring" help:"Switch on the fuse module parameter enable_uring (root) so that the kernel offers io_uring."`
	Poll          string `help:"How each io_uring queue waits for its next request: auto polls up to 50us when a queue runs dry while the daemon's requests come in quick succession, on any queue, and the CPU is not contended (sparse I/O and an idle daemon burn no CPU); 0 never polls; a duration (50us) polls up to that long every time the CPU is not contended." default:"auto" placeholder:"auto|0|DURATION"`
	Interruptible bool   `help:"Let a signal end I/O a device holds (suspended, delayed, queued without a path) with EINTR; by default held I/O waits through signals, as on a dm device."`
	URingDepth    int    `name:"uring-depth" help:"io_uring entries per queue (per CPU); each holds a buffer of the largest request size (0: as many as half of --memory-limit holds, at most 64)." default:"0"`

	ThinNoSpaceTimeout time.Duration `name:"thin-no-space-timeout" help:"How long I/O that needs a new block of a thin pool out of data space waits before it fails with ENOSPC (dm_thin_pool's no_space_timeout); 0 waits for ever." default:"60s"`

	Mountpoint string `arg:"" help:"Folder to mount on (created if missing)." type:"path"`
}

// parsePoll reads --poll: auto (fs.Options.Poll 0), 0 (fs.PollOff) or a
// positive duration.
func parsePoll(v string) (time.Duration, error) {
	if v == "auto" || v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if v == "0" {
		d, err = 0, nil
	}
	switch {
	case err != nil:
		return 0, fmt.Errorf("--poll %s: want auto, 0 or a duration such as 50us", v)
	case d < 0:
		return 0, fmt.Errorf("--poll %s: negative", v)
	case d == 0:
		return fs.PollOff, nil
	}
	return d, nil
}

// Run mounts, serves until a signal or an external unmount, and exits 0.
func (c *MountCmd) Run(g *Globals) error {
	poll, err := parsePoll(c.Poll)
	if err != nil {
		return err
	}
	limit, metricsLn, pprofLn, ferr := c.memoryAndDebug()
	if ferr != nil {
		return ferr
	}
	if metricsLn != nil {
		defer metricsLn.Close()
	}
	if pprofLn != nil {
		defer pprofLn.Close()
	}
	dir := c.Mountpoint
	if err := clearStale(dir); err != nil {
		return err
	}
	text, base, src := defaultConfig, "", "default set"
	if c.Config != "" {
		b, err := os.ReadFile(c.Config)
		if err != nil {
			return err
		}
		text, base, src = string(b), filepath.Dir(c.Config), c.Config
	} else {
		state, unlock, err := openState()
		if err != nil {
			return err
		}
		defer unlock()
		base = state
	}
	sock, strict := g.Control, false
	if sock == "" {
		if sock, err = control.DefaultPath(dir); err != nil {
			return err
		}
		strict = true
	}
	return runDaemon(daemonOptions{
		mount: dir,
		fs: fs.Options{AllowOther: c.AllowOther, Debug: c.Debug,
			Transport: c.Transport, EnableURing: c.EnableURing, Poll: poll, URingDepth: c.URingDepth, Interruptible: c.Interruptible,
			MemoryLimit: limit, ReleaseAfter: releaseAfter},
		socket: sock, strict: strict,
		thinNoSpaceTimeout: c.ThinNoSpaceTimeout,
		devices: func(mgr *stack.Manager) error {
			if err := createAll(mgr, text, base); err != nil {
				return fmt.Errorf("%s: %w", src, err)
			}
			return nil
		},
		metrics: metricsLn, pprof: pprofLn,
		logf: func(format string, a ...any) { fmt.Fprintf(os.Stderr, "dmfuse: "+format+"\n", a...) },
	})
}

// createAll builds the devices of a concise config in order; on any failure it
// removes what it built, so that a bad config creates nothing.
func createAll(mgr *stack.Manager, text, base string) error {
	devs, err := stack.ParseConcise(text)
	if err != nil {
		return err
	}
	for _, d := range devs {
		_, err := mgr.Create(stack.CreateOptions{Name: d.Name, UUID: d.UUID, Minor: d.Minor, ReadOnly: d.ReadOnly, Table: d.Table, Dir: base})
		if err != nil {
			mgr.Close()
			return fmt.Errorf("line %d: %w", d.Line, err)
		}
	}
	return nil
}

// stateDir is where the default set keeps its backing file.
func stateDir() (string, error) {
	if s := os.Getenv("XDG_STATE_HOME"); s != "" {
		return filepath.Join(s, "dmfuse"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".local", "state", "dmfuse"), nil
}

// openState creates the state folder and the default backing file, and locks
// the folder so that two daemons cannot share it.
func openState() (string, func(), error) {
	dir, err := stateDir()
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return "", nil, fmt.Errorf("state folder %s is in use by another dmfuse daemon (%v)", dir, err)
	}
	img := filepath.Join(dir, "disk.img")
	f, err := os.OpenFile(img, os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		var st os.FileInfo
		if st, err = f.Stat(); err == nil && st.Size() < defaultImageSize {
			err = f.Truncate(defaultImageSize)
		}
		f.Close()
	}
	if err != nil {
		lock.Close()
		return "", nil, fmt.Errorf("default backing file %s: %w", img, err)
	}
	return dir, func() { lock.Close() }, nil
}

// clearStale lazily unmounts a mount on dir whose daemon is gone ("Transport
// endpoint is not connected"), and refuses a live mount.
func clearStale(dir string) error {
	err := statSettled(dir)
	switch {
	case errors.Is(err, unix.ENOTCONN):
		// Look for loop devices first: once the mount is detached, their
		// backing file reads as a path relative to the detached tree.
		loops := export.LoopsUnder(dir)
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("%s: stale mount of a dead daemon, and unmounting it failed: %w", dir, err)
		}
		fmt.Fprintf(os.Stderr, "dmfuse: cleared a stale mount on %s left by a daemon that died; "+
			"a loop device that was attached to it stays broken until `losetup -d`\n", dir)
		for _, l := range loops {
			fmt.Fprintf(os.Stderr, "dmfuse: %s still points at the dead mount: detach it with `losetup -d %s`\n", l.Path, l.Path)
		}
		return nil
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return fmt.Errorf("%s: %w", dir, err)
	}
	if export.Mounted(dir) {
		return fmt.Errorf("%s is already a mount point", dir)
	}
	return nil
}

// teardownTimeout bounds how long statSettled asks again while a dead
// daemon's connection is being torn down.
const teardownTimeout = 10 * time.Second

// statSettled stats dir, and asks again while the answer comes from a
// connection whose daemon has died but which the kernel has not finished
// tearing down. On the io_uring transport the kernel drops a daemon's rings
// after the process is gone: a request that reaches a ring meanwhile ends
// with ECANCELED (fs/fuse/dev_uring.c: fuse_uring_send_in_task, when the
// ring's task is dead), and one still queued when the last reference to the
// daemon's /dev/fuse file goes ends with ECONNABORTED (fs/fuse/dev.c:
// fuse_abort_conn, end_requests). After that abort every new request fails
// with ENOTCONN, the answer of a dead mount.
func statSettled(dir string) error {
	deadline := time.Now().Add(teardownTimeout)
	for {
		var st unix.Stat_t
		err := unix.Stat(dir, &st)
		if !errors.Is(err, unix.ECANCELED) && !errors.Is(err, unix.ECONNABORTED) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
