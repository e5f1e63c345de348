package test

import (
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// TestURingIdleNoPolling: after a stream of QD1 reads, during which the
// io_uring queues poll for requests, an idle daemon spins no more: its own
// counts of spins and of the time spent spinning stay the same over a
// second without I/O.
func TestURingIdleNoPolling(t *testing.T) {
	requireURing(t)
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 8<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 16384 linear ./a.img 0;", "--transport", "uring", "--metrics-addr", "127.0.0.1:0")
	mustLog(t, d, "transport io_uring")
	f := openDirect(t, d.path("lin"))
	buf := directBuf()
	for n := range 5000 {
		if _, err := f.ReadAt(buf, int64(n%2048)*4096); err != nil {
			t.Fatalf("read %d: %v", n, err)
		}
	}
	spins := func(body []byte) int {
		return scraped(t, body, "dmfuse_uring_polls_total") + scraped(t, body, "dmfuse_uring_poll_probes_total")
	}
	// The last spin, if any, ends within the poll window of the last read.
	time.Sleep(100 * time.Millisecond)
	before := scrape(t, d)
	time.Sleep(time.Second)
	after := scrape(t, d)
	show := func() [][]byte { return regexp.MustCompile(`(?m)^dmfuse_uring_poll.*$`).FindAll(after, -1) }
	t.Logf("after 5000 QD1 reads and a second without I/O:\n%s", show())
	if spins(before) == 0 || scraped(t, before, "dmfuse_uring_poll_microseconds_total") == 0 {
		t.Errorf("no spin during 5000 QD1 reads:\n%s", show())
	}
	if s0, s1 := spins(before), spins(after); s1 != s0 {
		t.Errorf("%d spins during a second without I/O", s1-s0)
	}
	if u0, u1 := scraped(t, before, "dmfuse_uring_poll_microseconds_total"), scraped(t, after, "dmfuse_uring_poll_microseconds_total"); u1 != u0 {
		t.Errorf("%d us spent spinning during a second without I/O:\n%s", u1-u0, show())
	}
}
