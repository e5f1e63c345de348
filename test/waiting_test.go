package test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// waitKind is one way for a device to hold a request: how to set it up,
// make the read of device "slow" wait, see that it waits, and release it.
type waitKind struct {
	name string
	// config is the devices besides "fast" (a linear device over b.img);
	// "slow" is the one read.
	config string
	// hold runs before the read; release lets it complete.
	hold, release func(t *testing.T, d *daemon)
	// delayed names the delay device that holds the read, if one does:
	// its status shows the read held.
	delayed string
}

var waitKinds = []waitKind{
	{
		name:    "delay",
		config:  "slow,,,rw,0 16384 delay ./a.img 0 60000;",
		release: suspendResume("slow"),
		delayed: "slow",
	},
	{
		// A multipath device whose one path is slow: the read waits in
		// the delay device under it.
		name:    "multipath-slow-path",
		config:  "s1,,,rw,0 16384 delay ./a.img 0 60000;slow,,,rw,0 16384 multipath 0 0 1 1 round-robin 0 1 1 s1 1;",
		release: suspendResume("s1"),
		delayed: "s1",
	},
	{
		name:    "suspended",
		config:  "slow,,,rw,0 16384 linear ./a.img 0;",
		hold:    func(t *testing.T, d *daemon) { mustCtl(t, d, "suspend", "slow") },
		release: func(t *testing.T, d *daemon) { mustCtl(t, d, "resume", "slow") },
	},
	{
		name:    "queue_if_no_path",
		config:  "p1,,,rw,0 16384 linear ./a.img 0;slow,,,rw,0 16384 multipath 1 queue_if_no_path 0 1 1 round-robin 0 1 1 p1 1;",
		hold:    func(t *testing.T, d *daemon) { mustCtl(t, d, "message", "slow", "0", "fail_path", "p1") },
		release: func(t *testing.T, d *daemon) { mustCtl(t, d, "message", "slow", "0", "reinstate_path", "p1") },
	},
}

// suspendResume returns a release that suspends device dev, which releases
// the requests a delay device holds at once, and resumes it.
func suspendResume(dev string) func(t *testing.T, d *daemon) {
	return func(t *testing.T, d *daemon) {
		mustCtl(t, d, "suspend", dev)
		mustCtl(t, d, "resume", dev)
	}
}

func mustCtl(t *testing.T, d *daemon, args ...string) {
	t.Helper()
	if out, err := d.ctl(args...); err != nil {
		t.Fatalf("dmfuse %v: %v: %s", args, err, out)
	}
}

// TestWaitingKeepsOthers: for every way a device holds a request (a delay,
// multipath over a slow path, a suspended device, multipath queueing
// without a path), on both transports: while a read of the held device
// waits, reads of a linear device in the same mount, issued behind it from
// the same CPU (so, on io_uring, to the same queue), all complete; the held
// read completes once released. On io_uring the held read handed its
// queue over because it said it waits. The watchdog waits 10 s instead of
// 1 ms, so that a stall of the test machine before the read says it waits
// (seen under -race on two busy CPUs) cannot hand the queue over first.
func TestWaitingKeepsOthers(t *testing.T) {
	requireFUSE(t)
	t.Setenv("DMFUSE_URING_WATCHDOG", "10s")
	for _, transport := range []string{"dev", "uring"} {
		for _, k := range waitKinds {
			t.Run(transport+"/"+k.name, func(t *testing.T) {
				if transport == "uring" {
					requireURing(t)
				}
				waitingKeepsOthers(t, transport, k)
			})
		}
	}
}

func waitingKeepsOthers(t *testing.T, transport string, k waitKind) {
	const fastReads = 200
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	sparseFile(t, filepath.Join(dir, "b.img"), 8<<20)
	d := startDaemon(t, dir, k.config+"fast,,,rw,0 16384 linear ./b.img 0;",
		"--transport", transport, "--metrics-addr", "127.0.0.1:0")
	if transport == "uring" {
		mustLog(t, d, "transport io_uring")
	}
	slow, fast := openDirect(t, d.path("slow")), openDirect(t, d.path("fast"))
	if k.hold != nil {
		k.hold(t, d)
	}
	slowDone := make(chan error, 1)
	go onCPU0(func() {
		_, err := slow.ReadAt(directBuf(), 0)
		slowDone <- err
	})
	// Wait until the read is held.
	switch {
	case k.delayed != "":
		if err, _, ended := waitDelayHeld(t, d, k.delayed, 1, slowDone); ended {
			t.Fatalf("the held read ended (%v) before it was seen queued", err)
		}
	case transport == "uring":
		// It says it waits before it blocks.
		deadline := time.Now().Add(10 * time.Second)
		for handoffs(t, d) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no hand-off within 10 s of the read")
			}
			time.Sleep(10 * time.Millisecond)
		}
	default:
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the read of the held device ended (%v) before its release", err)
	default:
	}
	fastDone := make(chan error, 1)
	go onCPU0(func() {
		buf := directBuf()
		for n := range fastReads {
			if _, err := fast.ReadAt(buf, int64(n%2048)*4096); err != nil {
				fastDone <- fmt.Errorf("fast read %d: %w", n, err)
				return
			}
		}
		fastDone <- nil
	})
	select {
	case err := <-fastDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		// Release the held read so that cleanup can unmount.
		k.release(t, d)
		t.Fatalf("%d reads of the fast device did not complete within 30 s behind a held read", fastReads)
	}
	if transport == "uring" && handoffs(t, d) == 0 {
		t.Errorf("no hand-off on waiting in the metrics:\n%s", regexp.MustCompile(`(?m)^dmfuse_uring.*$`).FindAll(scrape(t, d), -1))
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the read of the held device ended (%v) before its release", err)
	default:
	}
	k.release(t, d)
	select {
	case err := <-slowDone:
		if err != nil {
			t.Fatalf("the released read: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the released read did not complete within 30 s")
	}
}

// handoffs returns the hand-offs on waiting in d's metrics.
func handoffs(t *testing.T, d *daemon) int {
	t.Helper()
	return scraped(t, scrape(t, d), `dmfuse_uring_handoffs_total{cause="waiting"}`)
}

// scraped returns the value of the series named name in a scrape (0 if it
// is missing, which fails the test).
func scraped(t *testing.T, body []byte, name string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\d+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in the metrics", name)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
