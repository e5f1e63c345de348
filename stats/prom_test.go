package stats

import (
	"bufio"
	"bytes"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/ioop"

	"github.com/VictoriaMetrics/metrics"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// promFixture returns two devices with known I/O on a fake clock.
func promFixture() (*clock.Manual, []Named) {
	c := new(clock.Manual)
	a, b := NewDisk(c), NewDisk(c)
	// a: TestWorkedExample's workload A plus a write, a discard and an empty
	// flush.
	for _, t0 := range []int64{100, 105, 110, 115} {
		doIO(c, a, ioop.Read, 8, t0, t0+3)
	}
	c.Set(int64(200 * time.Millisecond))
	a.Start(ioop.Write, c.Nanotime())
	c.Set(int64(200*time.Millisecond + 40*time.Microsecond))
	a.Done(ioop.Write, 16, msNs(200))
	doIO(c, a, ioop.Discard, 2048, 300, 320)
	doIO(c, a, ioop.Flush, 0, 400, 401)
	// One read still in flight on a.
	c.Set(msNs(500))
	a.Start(ioop.Read, msNs(500))
	c.Set(msNs(502))
	// b: a device with a quote and a backslash in its name, one slow read.
	doIO(c, b, ioop.Read, 1, 0, 0)
	c.Set(msNs(502))
	b.Start(ioop.Read, msNs(490))
	b.Done(ioop.Read, 8, msNs(490))
	return c, []Named{{`b"\x`, b}, {"a", a}}
}

func TestPrometheusText(t *testing.T) {
	_, devs := promFixture()
	e := NewExporter(func() []Named { return devs })
	var buf bytes.Buffer
	e.WritePrometheus(&buf)
	golden(t, "metrics.golden", buf.Bytes())
}

func TestPrometheusMetadata(t *testing.T) {
	_, devs := promFixture()
	metrics.ExposeMetadata(true)
	defer metrics.ExposeMetadata(false)
	var buf bytes.Buffer
	NewExporter(func() []Named { return devs }).WritePrometheus(&buf)
	text := buf.String()
	for _, want := range []string{
		"# TYPE dmfuse_reads_completed_total counter\n",
		"# TYPE dmfuse_io_now gauge\n",
		"# TYPE dmfuse_read_latency_seconds histogram\n",
	} {
		if strings.Count(text, want) != 1 {
			t.Errorf("%q appears %d times, want once", want, strings.Count(text, want))
		}
	}
	// Every family's TYPE line comes before all of its samples, once.
	typed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name := strings.Fields(f)[0]
			if typed[name] {
				t.Errorf("TYPE %s twice", name)
			}
			typed[name] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		fam := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(name, suf) && typed[strings.TrimSuffix(name, suf)] {
				fam = strings.TrimSuffix(name, suf)
			}
		}
		if !typed[fam] {
			t.Errorf("sample before its TYPE: %s", line)
		}
	}
}

// parseSamples maps "name{labels}" to its value.
func parseSamples(t *testing.T, text string) map[string]float64 {
	t.Helper()
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		if _, dup := m[line[:i]]; dup {
			t.Errorf("duplicate series %s", line[:i])
		}
		m[line[:i]] = v
	}
	return m
}

// Histogram counts equal the completed counters and their sums the time
// counters, and the buckets are cumulative, for every device and group.
func TestPrometheusConsistency(t *testing.T) {
	_, devs := promFixture()
	var buf bytes.Buffer
	NewExporter(func() []Named { return devs }).WritePrometheus(&buf)
	m := parseSamples(t, buf.String())
	pairs := []struct{ hist, count, secs string }{
		{"dmfuse_read_latency_seconds", "dmfuse_reads_completed_total", "dmfuse_read_time_seconds_total"},
		{"dmfuse_write_latency_seconds", "dmfuse_writes_completed_total", "dmfuse_write_time_seconds_total"},
		{"dmfuse_discard_latency_seconds", "dmfuse_discards_completed_total", "dmfuse_discard_time_seconds_total"},
	}
	for _, dev := range []string{`device="a"`, `device="b\"\\x"`} {
		for _, p := range pairs {
			count, ok := m[p.count+"{"+dev+"}"]
			if !ok {
				t.Fatalf("no %s{%s}", p.count, dev)
			}
			if hc := m[p.hist+"_count{"+dev+"}"]; hc != count {
				t.Errorf("%s_count{%s} = %v, %s = %v", p.hist, dev, hc, p.count, count)
			}
			if inf := m[p.hist+`_bucket{`+dev+`,le="+Inf"}`]; inf != count {
				t.Errorf("%s +Inf bucket %v, count %v", p.hist, inf, count)
			}
			if hs, s := m[p.hist+"_sum{"+dev+"}"], m[p.secs+"{"+dev+"}"]; hs != s {
				t.Errorf("%s_sum %v, %s %v", p.hist, hs, p.secs, s)
			}
			prev := 0.0
			for _, le := range leLabels {
				v := m[p.hist+`_bucket{`+dev+`,le="`+le+`"}`]
				if v < prev {
					t.Errorf("%s{%s} buckets not cumulative at le=%s", p.hist, dev, le)
				}
				prev = v
			}
		}
	}
	if m[`dmfuse_reads_completed_total{device="a"}`] != 4 || m[`dmfuse_io_now{device="a"}`] != 1 ||
		m[`dmfuse_writes_completed_total{device="a"}`] != 2 || m[`dmfuse_read_bytes_total{device="a"}`] != 32*512 {
		t.Errorf("unexpected values:\n%s", buf.String())
	}
}

// A device that the list no longer returns has no series.
func TestPrometheusRemovedDevice(t *testing.T) {
	_, devs := promFixture()
	var mu sync.Mutex
	cur := devs
	e := NewExporter(func() []Named { mu.Lock(); defer mu.Unlock(); return cur })
	var buf bytes.Buffer
	e.WritePrometheus(&buf)
	if !strings.Contains(buf.String(), `device="a"`) {
		t.Fatal("device a missing")
	}
	mu.Lock()
	cur = devs[:1]
	mu.Unlock()
	buf.Reset()
	e.WritePrometheus(&buf)
	if strings.Contains(buf.String(), `device="a"`) || !strings.Contains(buf.String(), `device="b`) {
		t.Errorf("after removal:\n%s", buf.String())
	}
	mu.Lock()
	cur = nil
	mu.Unlock()
	buf.Reset()
	e.WritePrometheus(&buf)
	if buf.Len() != 0 {
		t.Errorf("no devices: %q", buf.String())
	}
}

func TestPrometheusHTTP(t *testing.T) {
	_, devs := promFixture()
	e := NewExporter(func() []Named { return devs })
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("content type %q", ct)
	}
	body := rec.Body.String()
	if !strings.Contains(body, `dmfuse_reads_completed_total{device="a"} 4`) || !strings.Contains(body, "go_goroutines") {
		t.Errorf("body:\n%s", body)
	}
}

// Scrapes do not disturb the counters: the hot path is counted once.
func TestPrometheusScrapeDoesNotCount(t *testing.T) {
	_, devs := promFixture()
	e := NewExporter(func() []Named { return devs })
	var a, b bytes.Buffer
	e.WritePrometheus(&a)
	e.WritePrometheus(&b)
	if a.String() != b.String() {
		t.Error("two scrapes differ")
	}
}
