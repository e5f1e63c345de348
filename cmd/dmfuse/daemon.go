package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/control/dmexec"
	"github.com/dmfuse/dmfuse/control/dmioctl"
	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/fs"
	"github.com/dmfuse/dmfuse/fs/export"
	"github.com/dmfuse/dmfuse/fs/sysfs"
	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stats"
	"github.com/dmfuse/dmfuse/targets"
	"github.com/dmfuse/dmfuse/thin"
)

// daemonOptions is what differs between the two daemons dmfuse runs:
// `dmfuse mount` (mount.go) and the system instance that dmsetup starts
// (system.go). Both are runDaemon.
type daemonOptions struct {
	// mount is the folder the devices' files are served on (created if
	// missing); fs are the mount's options.
	mount string
	fs    fs.Options
	// socket is the control socket; strict is control.Listen's.
	socket string
	strict bool
	// thinNoSpaceTimeout is the thin pools' no_space_timeout (0 waits for
	// ever): --thin-no-space-timeout of dmfuse mount, the kernel's 60 s
	// (thin.DefaultNoSpaceTimeout) for the system instance.
	thinNoSpaceTimeout time.Duration
	// devices, if set, creates the devices served from the start; on an
	// error nothing is mounted.
	devices func(*stack.Manager) error
	// export, if set, exports every device as a block device (a loop
	// device and a node in the mapper folder), as the system instance does.
	export *exportOptions
	// metrics and pprof, if set, serve Prometheus metrics and go tool
	// pprof's profiles.
	metrics, pprof net.Listener
	// removeOnStop makes a stop remove every device first and refuse while
	// one is in use (the system instance's devices are the machine's, not
	// the daemon's); without it the devices go with the mount.
	removeOnStop bool
	// logf says what the daemon does.
	logf func(format string, a ...any)
	// served, if set, is called once requests are served.
	served func()
}

// exportOptions says where exported devices' nodes go.
type exportOptions struct {
	// mapper is the folder of the nodes, state the file listing them.
	mapper, state string
	// execNodes is the folder of the nodes the supervisor of `dmfuse exec`
	// hands out devices through, sys where the daemon's view of sysfs is
	// mounted for the commands it runs.
	execNodes, sys string
}

// forceWait bounds how long a forced stop waits for the kernel to let go of
// the mount before the daemon exits anyway.
const forceWait = 2 * time.Second

// daemon is one running daemon.
type daemon struct {
	o     daemonOptions
	mgr   *stack.Manager
	srv   *fs.Server
	loops *export.Loops      // nil unless exporting
	sup   *dmexec.Supervisor // nil unless serving dmfuse exec

	mu       sync.Mutex
	stopping bool
	// forced is closed by a forced stop.
	forced chan struct{}
}

// runDaemon serves devices until a stop succeeds (stop), or until the mount
// goes away by itself (umount). Signals (SIGINT, SIGTERM) and the control
// request stop (`dmfuse stop`) stop it the same way; the control socket
// answers until the daemon exits.
func runDaemon(o daemonOptions) error {
	if err := unix.Prctl(unix.PR_SET_IO_FLUSHER, 1, 0, 0, 0); err != nil {
		o.logf("warning: PR_SET_IO_FLUSHER: %v (serving loop devices may deadlock under memory pressure)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr := stack.NewManager(stack.ManagerOptions{Registry: targets.Registry(), Context: ctx, Clock: clock.System, Major: export.FreeMajor(),
		CoreMessage: stack.DMStatsMessage, Memory: reserveMemory})
	dmstats := stack.RegionHistograms(mgr)
	metrics.RegisterSet(dmstats)
	defer metrics.UnregisterSet(dmstats, true)
	defer mgr.Close()
	if err := thin.SetNoSpaceTimeout(mgr.Shared(), o.thinNoSpaceTimeout); err != nil {
		return err
	}
	if o.devices != nil {
		if err := o.devices(mgr); err != nil {
			return err
		}
	}

	// Signals are caught before the mount answers: a SIGTERM sent as soon
	// as the mount works must stop the daemon, not kill it.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	if err := os.MkdirAll(o.mount, 0o755); err != nil {
		return err
	}
	// The socket exists before the mount answers, so that a client that
	// waits for the mount finds it; a client that connects early waits
	// until requests are served, once the mount and the exporter follow the
	// manager. It is closed last, when the daemon really exits.
	ln, err := control.Listen(o.socket, o.strict)
	if err != nil {
		return err
	}
	defer ln.Close()
	srv, err := fs.Mount(o.mount, mgr, o.fs)
	if err != nil {
		return fmt.Errorf("mount %s: %w", o.mount, err)
	}
	raiseProcs(delay.SchedulerProcs + srv.Procs())
	d := &daemon{o: o, mgr: mgr, srv: srv, forced: make(chan struct{})}
	if o.export != nil {
		if d.loops, err = export.New(mgr, o.mount, o.export.mapper, o.export.state, o.logf); err != nil {
			srv.Unmount()
			return err
		}
		// After the fs layer's: a loop device follows its device's file.
		mgr.Subscribe(d.loops.Listener())
		mgr.SetExporter(d.loops)
	}
	ctl := control.NewServer(ctx, mgr)
	ctl.OnStop(d.stop)
	if o.export != nil {
		// The system instance serves the programs `dmfuse exec` runs.
		dm := dmioctl.NewServer(mgr, kernelLog(o.logf))
		sup, err := dmexec.NewSupervisor(ctx, mgr, dm, o.export.execNodes, o.logf)
		if err != nil {
			srv.Unmount()
			return err
		}
		export.SetNodeDir(o.export.execNodes)
		sysv, err := sysfs.Mount(o.export.sys, mgr)
		if err != nil {
			srv.Unmount()
			return fmt.Errorf("sysfs view: %w", err)
		}
		defer func() {
			if err := sysv.Unmount(); err != nil {
				o.logf("%v", err)
			}
		}()
		ctl.OnSupervise(sup.Supervise)
		d.sup = sup
	}
	go func() {
		if err := ctl.Serve(ln); err != nil {
			o.logf("%v", err)
		}
	}()
	defer ctl.Close()
	if o.metrics != nil {
		exp := stats.NewExporter(func() []stats.Named {
			var out []stats.Named
			for _, d := range mgr.Devices() {
				if d.Live() != nil {
					out = append(out, stats.Named{Name: d.Name(), Disk: d.Disk()})
				}
			}
			return out
		})
		defer metrics.UnregisterSet(memoryMetrics(srv), true)
		mux := http.NewServeMux()
		mux.Handle("/metrics", exp)
		defer serveHTTP("metrics", o.metrics, mux)()
		o.logf("metrics on http://%s/metrics", o.metrics.Addr())
	}
	if o.pprof != nil {
		defer serveHTTP("pprof", o.pprof, pprofMux())()
		o.logf("pprof on http://%s/debug/pprof/", o.pprof.Addr())
	}
	p := srv.Memory()
	o.logf("memory limit %s: requests up to %d KiB, %d in flight, request buffers at most %.1f MiB",
		limitString(p.Limit), p.MaxWrite>>10, p.MaxBackground, float64(p.Bound)/(1<<20))
	if o.export != nil {
		o.logf("serving %d device(s) on %s; control socket %s; nodes in %s", len(mgr.Devices()), o.mount, o.socket, o.export.mapper)
	} else {
		o.logf("serving %d device(s) on %s; control socket %s", len(mgr.Devices()), o.mount, o.socket)
	}
	if o.served != nil {
		o.served()
	}

	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	for {
		select {
		case <-done:
			return nil
		case <-d.forced:
			select {
			case <-done:
			case <-time.After(forceWait):
				o.logf("the kernel still holds %s; exiting ends its connection", o.mount)
			}
			return nil
		case s := <-sigs:
			if err := d.stop(false); err != nil {
				o.logf("%v: %v", s, err)
				continue
			}
			ctl.StopAccepting()
			o.logf("%v: stopped", s)
		}
	}
}

// stop is the one way a daemon stops, for a signal and for the control
// request stop alike. Without force, the system instance first removes its
// devices, and refuses while one is in use; then the mount is unmounted,
// which fails while something holds a device file. A refusal changes
// nothing more and says why: the daemon keeps serving, its socket still
// answers. With force, what a daemon that died would leave is torn down
// now, while the daemon still serves the I/O that needs: file systems on
// its block devices are unmounted lazily, the loop devices detached (at
// their last close, if still open), the nodes removed, and the mount
// detached; the daemon then exits whatever still holds it. On success the
// daemon exits; the control socket goes last.
func (d *daemon) stop(force bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return nil
	}
	if force {
		d.terminateExec()
		var did []string
		if d.o.export != nil {
			did = export.Cleanup(d.o.mount, d.o.export.mapper, d.o.export.state)
		} else if err := d.srv.Unmount(); err != nil && unix.Unmount(d.o.mount, unix.MNT_DETACH) == nil {
			did = append(did, "detached "+d.o.mount)
		}
		if len(did) > 0 {
			d.o.logf("forced stop: %s", strings.Join(did, ", "))
		}
		d.stopping = true
		close(d.forced)
		return nil
	}
	if d.o.removeOnStop {
		if left := d.mgr.RemoveAll(stack.Flags{}); len(left) > 0 {
			return &stack.ArgError{Errno: unix.EBUSY,
				Reason: fmt.Sprintf("devices still in use, still serving: %s (`dmfuse stop --force` tears them down)", d.inUse(left))}
		}
	}
	d.terminateExec()
	if err := d.srv.Unmount(); err != nil {
		return &stack.ArgError{Errno: unix.EBUSY,
			Reason: fmt.Sprintf("cannot unmount %s: %v; still serving%s", d.o.mount, err, d.holders())}
	}
	d.stopping = true
	return nil
}

// terminateExec ends what still runs under `dmfuse exec` (dmeventd, a
// shell): without this daemon its trapped calls would fail.
func (d *daemon) terminateExec() {
	if d.sup == nil {
		return
	}
	if pids := d.sup.Terminate(2 * time.Second); len(pids) > 0 {
		d.o.logf("stopped %d process(es) left running under dmfuse exec: %v", len(pids), pids)
	}
}

// inUse says who uses each device named: a file system mounted on its
// block device, or what the manager says.
func (d *daemon) inUse(names []string) string {
	var out []string
	for _, name := range names {
		dev := d.mgr.Lookup(name)
		if dev == nil {
			continue
		}
		why := d.mgr.Busy(dev)
		if d.loops != nil {
			if blk := d.loops.BlockDevice(dev); blk != "" {
				if m := export.MountsOfPath(blk); len(m) > 0 {
					why = blk + " is mounted on " + strings.Join(m, ", ")
				}
			}
		}
		if why == "" {
			why = "in use"
		}
		out = append(out, name+": "+why)
	}
	return strings.Join(out, "; ")
}

// holders says what keeps the mount busy and how to release it.
func (d *daemon) holders() string {
	var b strings.Builder
	for _, l := range export.LoopsUnder(d.o.mount) {
		fmt.Fprintf(&b, "; %s is attached to a device file: release it with `losetup -d %s`", l.Path, l.Path)
	}
	for _, dev := range d.mgr.Devices() {
		if n := dev.OpenCount(); n > 0 {
			fmt.Fprintf(&b, "; device %s is held open (%d)", dev.Name(), n)
		}
	}
	return b.String()
}
