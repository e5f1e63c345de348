package test

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// interruptConf is a mount with a device whose I/O waits a minute (delay)
// and a plain one (linear) that tests suspend.
const interruptConf = "slow,,,rw,0 16384 delay ./a.img 0 60000;lin,,,rw,0 16384 linear ./b.img 0;"

// interruptTransports runs f once per transport with the daemon arguments
// it needs: /dev/fuse always, io_uring when the kernel offers it, or, under
// DMFUSE_REQUIRE_FUSE=1, after the daemon switched enable_uring on.
func interruptTransports(t *testing.T, f func(t *testing.T, args []string)) {
	for _, tr := range []string{"dev", "uring"} {
		t.Run(tr, func(t *testing.T) {
			requireFUSE(t)
			args := []string{"--transport", tr}
			if tr == "uring" {
				b, err := os.ReadFile(uringParam)
				switch {
				case err == nil && strings.TrimSpace(string(b)) == "Y":
				case os.Getenv("DMFUSE_REQUIRE_FUSE") == "1":
					args = append(args, "--enable-uring")
				default:
					t.Skipf("FUSE over io_uring is not switched on (%s)", uringParam)
				}
			}
			f(t, args)
		})
	}
}

// startInterruptDaemon mounts interruptConf with its metrics served and the
// given arguments, and returns the daemon and its metrics address.
func startInterruptDaemon(t *testing.T, extra ...string) (*daemon, string) {
	t.Helper()
	// TestInterruptSuspendedRead waits for the hand-off a held read asks
	// for: a watchdog slower than a stalled test machine cannot take the
	// queue first (TestURingWaitingKeepsQueue).
	t.Setenv("DMFUSE_URING_WATCHDOG", "10s")
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	sparseFile(t, filepath.Join(dir, "b.img"), 8<<20)
	d := startDaemon(t, dir, interruptConf, append([]string{"--metrics-addr", "127.0.0.1:0"}, extra...)...)
	if slices.Contains(extra, "uring") {
		mustLog(t, d, "transport io_uring")
	}
	m := regexp.MustCompile(`dmfuse: metrics on (http://\S+/metrics)\n`).FindStringSubmatch(d.stderr.String())
	if m == nil {
		t.Fatalf("no metrics address in the log: %s", d.stderr)
	}
	return d, m[1]
}

// metric returns the value of the metric line that starts with name.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in the metrics", name)
	return 0
}

// readResult is what a held read returned.
type readResult struct {
	n   int
	err error
}

// heldRead starts a 4 KiB O_DIRECT pread(2) of path on a thread of its own
// (the raw system call: os.File would retry on EINTR) and returns the
// thread's id and where the result will come.
func heldRead(t *testing.T, path string) (int, chan readResult) {
	t.Helper()
	f := openDirect(t, path)
	fd := int(f.Fd())
	tid := make(chan int)
	done := make(chan readResult, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		buf := directBuf()
		n, err := syscall.Pread(fd, buf, 0)
		done <- readResult{n, err}
	}()
	return <-tid, done
}

// signalUntilDone sends SIGURG (which the Go runtime handles and otherwise
// ignores) to thread tid until done yields, and returns what it yields. A
// read that no signal ends fails the test after a minute.
func signalUntilDone(t *testing.T, tid int, done chan readResult) readResult {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(time.Minute)
	for {
		select {
		case r := <-done:
			return r
		case <-tick.C:
			unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
		case <-limit:
			t.Fatal("the held read did not end on signals")
		}
	}
}

// waitQueued waits until the delay device slow holds n requests.
func waitQueued(t *testing.T, d *daemon, n int, done chan readResult) {
	t.Helper()
	if r, ended := waitQueuedOrDone(t, d, n, done); ended {
		t.Fatalf("the read ended (%d, %v) before it was seen queued", r.n, r.err)
	}
}

// waitQueuedOrDone waits until the delay device slow holds n requests, or
// until done yields; it reports what done yielded and whether it did.
func waitQueuedOrDone(t *testing.T, d *daemon, n int, done chan readResult) (readResult, bool) {
	t.Helper()
	r, _, ended := waitDelayHeld(t, d, "slow", n, done)
	return r, ended
}

// releaseSlow lets every request the delay device holds go (a suspend
// releases them) and resumes it.
func releaseSlow(t *testing.T, d *daemon) {
	t.Helper()
	for _, c := range []string{"suspend", "resume"} {
		if out, err := d.ctl(c, "slow"); err != nil {
			t.Fatalf("dmfuse %s: %v: %s", c, err, out)
		}
	}
}

// checkSlowWorks reads the delay device once more, releasing the read.
// Under --interruptible a signal the test process did not send (the Go
// runtime's own) can end the read with EINTR before it is seen queued;
// such a read is tried again, a few times at most.
func checkSlowWorks(t *testing.T, d *daemon) {
	t.Helper()
	for try := 1; ; try++ {
		_, done := heldRead(t, d.path("slow"))
		if r, ended := waitQueuedOrDone(t, d, 1, done); ended {
			if r.err == syscall.EINTR && try < 3 {
				t.Logf("read %d ended with EINTR before it was seen queued; trying again", try)
				continue
			}
			t.Fatalf("the read ended (%d, %v) before it was seen queued", r.n, r.err)
		}
		releaseSlow(t, d)
		if r := <-done; r.err != nil || r.n != 4096 {
			t.Fatalf("read after the interrupt: %d, %v", r.n, r.err)
		}
		return
	}
}

// TestInterruptDelayedRead: with --interruptible, a signal to a thread
// whose read waits in a delay device ends the read with EINTR and takes
// the request out of the delay queue; the daemon and the device work on.
// The same on both transports.
func TestInterruptDelayedRead(t *testing.T) {
	interruptTransports(t, func(t *testing.T, args []string) {
		tr := args[1]
		d, url := startInterruptDaemon(t, append(args, "--interruptible")...)
		tid, done := heldRead(t, d.path("slow"))
		waitQueued(t, d, 1, done)
		if r := signalUntilDone(t, tid, done); r.err != syscall.EINTR {
			t.Fatalf("interrupted read: %d, %v; want EINTR", r.n, r.err)
		}
		waitQueued(t, d, 0, nil)
		if tr == "uring" && metric(t, url, "dmfuse_uring_interrupts_total") < 1 {
			t.Error("no interrupt counted")
		}
		checkIO(t, d.path("lin"))
		checkSlowWorks(t, d)
	})
}

// TestInterruptSuspendedRead: with --interruptible, a signal ends a read
// that a suspended device holds with EINTR; after resume the device
// serves. On io_uring the test signals only once the daemon holds the
// request (the queue handed itself over because the request waits): the
// kernel drops an interrupt that comes before it sent the request to a
// ring.
func TestInterruptSuspendedRead(t *testing.T) {
	interruptTransports(t, func(t *testing.T, args []string) {
		tr := args[1]
		d, url := startInterruptDaemon(t, append(args, "--interruptible")...)
		held := func() float64 {
			return metric(t, url, `dmfuse_uring_handoffs_total{cause="waiting"}`)
		}
		before := held()
		d.must("suspend", "lin")
		tid, done := heldRead(t, d.path("lin"))
		for tr == "uring" && held() == before {
			select {
			case r := <-done:
				t.Fatalf("the read of a suspended device ended: %d, %v", r.n, r.err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		if r := signalUntilDone(t, tid, done); r.err != syscall.EINTR {
			t.Fatalf("interrupted read: %d, %v; want EINTR", r.n, r.err)
		}
		if got := d.must("info", "lin"); !strings.Contains(got, "State:             SUSPENDED\n") {
			t.Errorf("info after the interrupt:\n%s", got)
		}
		d.must("resume", "lin")
		checkIO(t, d.path("lin"))
	})
}

// TestHeldReadWaitsThroughSignals: without --interruptible (the default)
// a read held in a delay device waits through signals, as on a dm device,
// and returns its data once released. On io_uring the interrupt is seen
// reaching the request first.
func TestHeldReadWaitsThroughSignals(t *testing.T) {
	interruptTransports(t, func(t *testing.T, args []string) {
		tr := args[1]
		d, url := startInterruptDaemon(t, args...)
		tid, done := heldRead(t, d.path("slow"))
		waitQueued(t, d, 1, done)
		for i := 0; tr == "uring" && metric(t, url, "dmfuse_uring_interrupts_total") == 0; i++ {
			if i%10 == 0 {
				unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
			}
			select {
			case r := <-done:
				t.Fatalf("the read ended (%d, %v) before an interrupt reached it", r.n, r.err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		for range 3 {
			unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
		}
		waitQueued(t, d, 1, done)
		releaseSlow(t, d)
		if r := <-done; r.err != nil || r.n != 4096 {
			t.Fatalf("released read: %d, %v", r.n, r.err)
		}
	})
}

// TestKillHeldReader: a process killed while its read waits in a delay
// device leaves nothing behind. With --interruptible it exits at once and
// its request leaves the delay queue; by default it exits once the request
// is released, as a process whose I/O a dm device holds. Either way the
// device and the daemon serve on.
func TestKillHeldReader(t *testing.T) {
	requireTool(t, "dd")
	for _, intr := range []bool{true, false} {
		name := "default"
		var extra []string
		if intr {
			name, extra = "interruptible", []string{"--interruptible"}
		}
		t.Run(name, func(t *testing.T) {
			interruptTransports(t, func(t *testing.T, args []string) {
				d, _ := startInterruptDaemon(t, append(args, extra...)...)
				dd := exec.Command("dd", "if="+d.path("slow"), "of=/dev/null", "bs=4096", "count=1", "iflag=direct")
				if err := dd.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan struct{})
				go func() { dd.Wait(); close(exited) }()
				t.Cleanup(func() { dd.Process.Kill(); releaseSlow(t, d); <-exited })
				waitQueued(t, d, 1, nil)
				dd.Process.Kill()
				if intr {
					select {
					case <-exited:
					case <-time.After(time.Minute):
						t.Fatal("the killed reader did not exit")
					}
					waitQueued(t, d, 0, nil)
				} else {
					waitQueued(t, d, 1, nil)
					select {
					case <-exited:
						t.Fatal("the killed reader exited while its read was held")
					default:
					}
					releaseSlow(t, d)
					<-exited
				}
				checkIO(t, d.path("lin"))
				checkSlowWorks(t, d)
			})
		})
	}
}
