package main

import (
	"bytes"
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"github.com/dmfuse/dmfuse/fs"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		err  string
	}{
		{"off", 0, ""}, {"OFF", 0, ""}, {"0", 0, ""},
		{"67108864", 64 << 20, ""}, {"64MiB", 64 << 20, ""}, {"64M", 64 << 20, ""}, {"64mib", 64 << 20, ""},
		{"512KiB", 512 << 10, ""}, {"1GiB", 1 << 30, ""}, {"2T", 2 << 40, ""}, {"100B", 100, ""},
		{"", 0, "not a size"}, {"MiB", 0, "not a size"}, {"-5MiB", 0, "not a size"}, {"1.5GiB", 0, "unknown unit"},
		{"64MB", 0, "unknown unit"}, {"64 MiB", 64 << 20, ""}, {"9999999TiB", 0, "too large"},
	} {
		got, err := parseSize(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("parseSize(%q) = %d, %v; want an error saying %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
}

func TestMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })

	t.Setenv("GOMEMLIMIT", "")
	if got, err := memoryLimit(""); err != nil || got != fs.DefaultMemoryLimit || debug.SetMemoryLimit(-1) != fs.DefaultMemoryLimit {
		t.Errorf("no flag, no GOMEMLIMIT: %d, %v, runtime limit %d; want the default %d", got, err, debug.SetMemoryLimit(-1), fs.DefaultMemoryLimit)
	}
	if got, err := memoryLimit("100MiB"); err != nil || got != 100<<20 || debug.SetMemoryLimit(-1) != 100<<20 {
		t.Errorf("--memory-limit=100MiB: %d, %v, runtime limit %d", got, err, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(math.MaxInt64)
	if got, err := memoryLimit("off"); err != nil || got >= 0 || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("--memory-limit=off: %d, %v, runtime limit %d; want no limit", got, err, debug.SetMemoryLimit(-1))
	}
	if _, err := memoryLimit("lots"); err == nil || !strings.Contains(err.Error(), `"lots"`) {
		t.Errorf("--memory-limit=lots: %v, want an error naming the argument", err)
	}

	// GOMEMLIMIT has been read by the runtime at start; the daemon takes
	// its value from there.
	t.Setenv("GOMEMLIMIT", "200MiB")
	debug.SetMemoryLimit(200 << 20)
	if got, err := memoryLimit(""); err != nil || got != 200<<20 {
		t.Errorf("GOMEMLIMIT=200MiB: %d, %v", got, err)
	}
	if got, err := memoryLimit("32MiB"); err != nil || got != 32<<20 || debug.SetMemoryLimit(-1) != 32<<20 {
		t.Errorf("--memory-limit=32MiB over GOMEMLIMIT: %d, %v, runtime limit %d", got, err, debug.SetMemoryLimit(-1))
	}
	t.Setenv("GOMEMLIMIT", "off")
	debug.SetMemoryLimit(math.MaxInt64)
	if got, err := memoryLimit(""); err != nil || got >= 0 {
		t.Errorf("GOMEMLIMIT=off: %d, %v; want no limit", got, err)
	}
}

func TestListenLoopback(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "127.0.0.2:0"} {
		ln, err := listenLoopback(addr)
		if err != nil {
			t.Errorf("%s: %v", addr, err)
			continue
		}
		ln.Close()
	}
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0", "192.0.2.1:0", "example.com:0", "127.0.0.1"} {
		if ln, err := listenLoopback(addr); err == nil {
			ln.Close()
			t.Errorf("%s: listening, want a refusal", addr)
		}
	}
}

// TestReserveMemory: the Manager's Memory hook raises the runtime's soft
// memory limit, when one is set, by what targets account and lowers it
// when they give it back; without a limit it changes nothing.
func TestReserveMemory(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	debug.SetMemoryLimit(64 << 20)
	reserveMemory(64 << 20)
	reserveMemory(2 << 20)
	if got := debug.SetMemoryLimit(-1); got != 130<<20 {
		t.Errorf("limit of 64 MiB with 64 and 2 MiB accounted: %d, want %d", got, 130<<20)
	}
	reserveMemory(-64 << 20)
	reserveMemory(-2 << 20)
	if got := debug.SetMemoryLimit(-1); got != 64<<20 {
		t.Errorf("limit after both were given back: %d, want %d", got, 64<<20)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	reserveMemory(64 << 20)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("no memory limit became %d", got)
	}
}

// TestWriteCounters: the daemon's _total series are Prometheus counters,
// one TYPE line per family, each series with its value.
func TestWriteCounters(t *testing.T) {
	metrics.ExposeMetadata(true)
	defer metrics.ExposeMetadata(false)
	var b bytes.Buffer
	writeCounters(&b, []counterValue{
		{`dmfuse_uring_handoffs_total{cause="waiting"}`, 3},
		{`dmfuse_uring_handoffs_total{cause="watchdog"}`, 0},
		{"dmfuse_memory_releases_total", 7},
	})
	got := b.String()
	for _, want := range []string{
		"# TYPE dmfuse_uring_handoffs_total counter\n",
		"dmfuse_uring_handoffs_total{cause=\"waiting\"} 3\n",
		"dmfuse_uring_handoffs_total{cause=\"watchdog\"} 0\n",
		"# TYPE dmfuse_memory_releases_total counter\n",
		"dmfuse_memory_releases_total 7\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("%q missing from:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "# TYPE dmfuse_uring_handoffs_total "); n != 1 {
		t.Errorf("%d TYPE lines for dmfuse_uring_handoffs_total:\n%s", n, got)
	}
	if strings.Contains(got, " gauge\n") {
		t.Errorf("a gauge among the counters:\n%s", got)
	}
}
