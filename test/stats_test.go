package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// diskstatsOf returns the 17 counters of device name from stats/diskstats.
func diskstatsOf(t *testing.T, d *daemon, name string) []uint64 {
	t.Helper()
	b, err := os.ReadFile(d.path("stats", "diskstats"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 20 && f[2] == name {
			out := make([]uint64, 17)
			for i := range out {
				out[i], err = strconv.ParseUint(f[3+i], 10, 64)
				if err != nil {
					t.Fatalf("diskstats field %d of %s: %v", i+1, name, err)
				}
			}
			return out
		}
	}
	t.Fatalf("no diskstats line for %s in:\n%s", name, b)
	return nil
}

// TestStackedCounters checks that a stacked device and the device below it
// each count their own I/O, and that the Prometheus metrics match the files.
func TestStackedCounters(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	// Port 0: the daemon binds a free port, before it says it serves, and
	// logs the address.
	d := startDaemon(t, dir, "base,,,rw,0 16384 linear ./a.img 0;\ntop,,,rw,0 8192 linear base 4096;", "--metrics-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`dmfuse: metrics on (http://\S+/metrics)\n`).FindStringSubmatch(d.stderr.String())
	if m == nil {
		t.Fatalf("no metrics address in the log: %s", d.stderr)
	}
	f, err := os.OpenFile(d.path("top"), os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := 0; i < 10; i++ {
		if _, err := f.ReadAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		if _, err := f.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	for _, name := range []string{"top", "base"} {
		s := diskstatsOf(t, d, name)
		if s[0] != 10 || s[2] != 80 || s[4] != 3 || s[6] != 24 || s[8] != 0 {
			t.Errorf("%s: reads %d sectors %d writes %d sectors %d in flight %d; want 10 80 3 24 0", name, s[0], s[2], s[4], s[6], s[8])
		}
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`dmfuse_reads_completed_total{device="top"} 10`,
		`dmfuse_reads_completed_total{device="base"} 10`,
		`dmfuse_writes_completed_total{device="top"} 3`,
		`dmfuse_read_latency_seconds_count{device="top"} 10`,
		`dmfuse_io_now{device="top"} 0`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestIostatOverBindMount runs sysstat's iostat with stats/diskstats
// bind-mounted over /proc/diskstats in a private mount namespace: it must list
// the devices by name, with reads on the device being read and writes on the
// one being written.
func TestIostatOverBindMount(t *testing.T) {
	requireTool(t, "iostat", "unshare")
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	d := startDaemon(t, dir, "reader,,,rw,0 16384 linear ./a.img 0;\nwriter,,,rw,0 16384 zero;")
	ctx, cancel := context.WithCancel(context.Background())
	var wg, started sync.WaitGroup
	for _, dev := range []string{"reader", "writer"} {
		wg.Add(1)
		started.Add(1)
		go func(dev string) {
			defer wg.Done()
			var once sync.Once
			start := func() { once.Do(started.Done) }
			defer start() // also when it fails
			f, err := os.OpenFile(d.path(dev), os.O_RDWR|syscall.O_DIRECT, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			buf := make([]byte, 4096)
			for i := 0; ctx.Err() == nil; i++ {
				off := int64(i%2048) * 4096
				if dev == "reader" {
					_, err = f.ReadAt(buf, off)
				} else {
					_, err = f.WriteAt(buf, off)
				}
				if err != nil {
					t.Error(err)
					return
				}
				start()
			}
		}(dev)
	}
	// iostat's first report covers the time since boot, its second the
	// second after it: both workers have done I/O before it starts.
	started.Wait()
	script := fmt.Sprintf("mount --bind %s /proc/diskstats && iostat -d -x -p ALL 1 2", d.path("stats", "diskstats"))
	out, err := exec.Command("unshare", "-m", "sh", "-c", script).CombinedOutput()
	cancel()
	wg.Wait()
	if err != nil {
		if strings.Contains(string(out), "Operation not permitted") && os.Getenv("CI") == "" {
			t.Skipf("unshare -m not permitted here: %s", out)
		}
		t.Fatalf("iostat: %v\n%s", err, out)
	}
	// The second report covers the interval in which both workers ran.
	reports := strings.Split(string(out), "Device")
	last := reports[len(reports)-1]
	header := strings.Fields(strings.SplitN(last, "\n", 2)[0])
	col := func(name string) int {
		for i, h := range header {
			if h == name {
				return i + 1 // rows start with the device name
			}
		}
		t.Fatalf("iostat has no %s column: %s", name, out)
		return 0
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(last, "\n")[1:] {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	num := func(dev, c string) float64 {
		f, ok := rows[dev]
		if !ok {
			t.Fatalf("iostat does not list %s:\n%s", dev, out)
		}
		v, err := strconv.ParseFloat(f[col(c)], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if r, w := num("reader", "r/s"), num("reader", "w/s"); r <= 0 || w != 0 {
		t.Errorf("reader: r/s %v w/s %v; want reads only\n%s", r, w, out)
	}
	if r, w := num("writer", "r/s"), num("writer", "w/s"); w <= 0 || r != 0 {
		t.Errorf("writer: r/s %v w/s %v; want writes only\n%s", r, w, out)
	}
}

// TestDmfuseIostat runs `dmfuse iostat` against a mount under load.
func TestDmfuseIostat(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "z,,,rw,0 16384 zero;")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan struct{})
	started := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.OpenFile(d.path("z"), os.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			t.Error(err)
			close(started)
			return
		}
		defer f.Close()
		buf := make([]byte, 4096)
		for i := 0; ctx.Err() == nil; i++ {
			_, err := f.ReadAt(buf, 0)
			if i == 0 {
				close(started)
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	<-started // the reader is busy before iostat's first sample
	out, err := exec.CommandContext(ctx, dmfuseBin, "iostat", "--mount", d.mnt, "-x", "1", "2").CombinedOutput()
	cancel()
	<-done
	if err != nil {
		t.Fatalf("dmfuse iostat: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^z\s+([0-9.]+)`).FindAllStringSubmatch(string(out), -1)
	if len(m) == 0 {
		t.Fatalf("dmfuse iostat does not list z:\n%s", out)
	}
	if v, _ := strconv.ParseFloat(m[len(m)-1][1], 64); v <= 0 {
		t.Errorf("r/s of z under a read load is %v:\n%s", v, out)
	}
}
