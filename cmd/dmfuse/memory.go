package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/dmfuse/dmfuse/fs"
)

// releaseAfter is how long the devices must be idle before the daemon gives
// its request buffers back to the operating system.
const releaseAfter = 5 * time.Second

// memoryAndDebug applies --memory-limit and opens the listeners of
// --metrics-addr and --pprof (nil when not asked for), before anything is
// mounted, so that a bad value changes nothing.
func (c *MountCmd) memoryAndDebug() (limit int64, metricsLn, pprofLn net.Listener, err error) {
	if limit, err = memoryLimit(c.MemoryLimit); err != nil {
		return 0, nil, nil, err
	}
	if c.MetricsAddr != "" {
		if metricsLn, err = net.Listen("tcp", c.MetricsAddr); err != nil {
			return 0, nil, nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	if c.Pprof != "" {
		if pprofLn, err = listenLoopback(c.Pprof); err != nil {
			if metricsLn != nil {
				metricsLn.Close()
			}
			return 0, nil, nil, fmt.Errorf("--pprof: %w", err)
		}
	}
	return limit, metricsLn, pprofLn, nil
}

// memoryLimit works out the daemon's memory limit: --memory-limit when given
// ("off" or 0: none), else the Go runtime's GOMEMLIMIT when set ("off":
// none), else fs.DefaultMemoryLimit. It returns the limit for fs.Options (negative: none)
// and sets the Go runtime's soft limit to it, so that the collector works
// harder instead of letting the heap grow past it.
func memoryLimit(flag string) (int64, error) {
	var limit int64
	switch {
	case flag != "":
		n, err := parseSize(flag)
		if err != nil {
			return 0, fmt.Errorf("--memory-limit %q: %w", flag, err)
		}
		limit = n
		if n == 0 {
			limit = -1
		}
	case os.Getenv("GOMEMLIMIT") != "":
		// The runtime has parsed it already; "off" reads as MaxInt64.
		if limit = debug.SetMemoryLimit(-1); limit == math.MaxInt64 {
			limit = -1
		}
	default:
		limit = fs.DefaultMemoryLimit
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	return limit, nil
}

// memoryHeld serializes reserveMemory's changes to the runtime's limit.
var memoryHeld sync.Mutex

// reserveMemory is the Manager's Memory hook: it adds n bytes (negative:
// takes them back) that targets hold beyond the request buffers (a powercut
// cache) to the Go runtime's soft memory limit, when one is set. Without
// their room in the limit, a full cache would leave the request buffers no
// headroom and the collector would run without pause; the request budget
// of the memory plan, fixed at mount, stays half of --memory-limit.
func reserveMemory(n int64) {
	memoryHeld.Lock()
	defer memoryHeld.Unlock()
	if cur := debug.SetMemoryLimit(-1); cur != math.MaxInt64 {
		debug.SetMemoryLimit(max(cur+n, 0))
	}
}

// parseSize reads a byte count: a number with an optional binary suffix
// (B, K/KiB, M/MiB, G/GiB, T/TiB), or "off" for 0.
func parseSize(s string) (int64, error) {
	if strings.EqualFold(s, "off") {
		return 0, nil
	}
	i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(s)
	}
	num, unit := s[:i], strings.TrimSpace(s[i:])
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, errors.New("not a size (want for example 64MiB, or off)")
	}
	shift := map[string]uint{"": 0, "b": 0, "k": 10, "kib": 10, "m": 20, "mib": 20, "g": 30, "gib": 30, "t": 40, "tib": 40}
	sh, ok := shift[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q (want B, KiB, MiB, GiB or TiB)", unit)
	}
	if n > math.MaxInt64>>sh {
		return 0, errors.New("too large")
	}
	return n << sh, nil
}

// memoryMetrics registers, in the metrics package's default set that
// /metrics serves after the device metrics and the go_* and process_*
// figures, the gauges and counters (_total) of srv's memory plan:
//
//	dmfuse_memory_limit_bytes          the memory limit (0: none)
//	dmfuse_request_memory_bound_bytes  the most request buffers may hold
//	dmfuse_max_request_bytes           the largest READ or WRITE the kernel sends
//	dmfuse_max_background              the kernel's cap on asynchronous requests
//	dmfuse_memory_releases_total       times idle request buffers were returned to the system
//	dmfuse_heap_live_bytes             live heap at the last collection (runtime/metrics /gc/heap/live:bytes)
//
// and of its io_uring queues (all 0 on /dev/fuse):
//
//	dmfuse_uring_handoffs_total{cause="waiting"}   a queue went to another thread: a request said it waits
//	dmfuse_uring_handoffs_total{cause="watchdog"}  ... a request held the queue's thread for 1 ms
//	dmfuse_uring_threads                           the queues' threads, leaders and standby
//	dmfuse_uring_interrupts_total                  FUSE_INTERRUPTs that reached a ring request
//	dmfuse_uring_offloaded_total                   large READs and WRITEs run off the queue's thread
//	dmfuse_uring_requests_total{queue="N"}         requests queue N received (the kernel picks the submitting CPU's)
//	dmfuse_uring_polling                           1 while a queue that runs dry would poll (requests expected soon)
//	dmfuse_uring_polls_total                       spins of queues that ran dry, requests being expected soon
//	dmfuse_uring_poll_probes_total                 spins that test whether requests come densely again
//	dmfuse_uring_poll_hits_total                   spins (polls or probes) that found a request on their queue
//	dmfuse_uring_poll_contended_total              spins cut short because another thread wanted the CPU
//	dmfuse_uring_poll_microseconds_total           time the queues spent spinning, for requests and for replies
func memoryMetrics(srv *fs.Server) *metrics.Set {
	p := srv.Memory()
	set := metrics.NewSet()
	set.NewGauge("dmfuse_memory_limit_bytes", func() float64 { return float64(p.Limit) })
	set.NewGauge("dmfuse_request_memory_bound_bytes", func() float64 { return float64(p.Bound) })
	set.NewGauge("dmfuse_max_request_bytes", func() float64 { return float64(p.MaxWrite) })
	set.NewGauge("dmfuse_max_background", func() float64 { return float64(p.MaxBackground) })
	set.NewGauge("dmfuse_heap_live_bytes", func() float64 {
		s := []runtimemetrics.Sample{{Name: "/gc/heap/live:bytes"}}
		runtimemetrics.Read(s)
		if s[0].Value.Kind() != runtimemetrics.KindUint64 {
			return 0
		}
		return float64(s[0].Value.Uint64())
	})
	set.NewGauge("dmfuse_uring_threads", func() float64 { return float64(srv.URingStats().Threads) })
	set.NewGauge("dmfuse_uring_polling", func() float64 {
		if srv.URingStats().Polling {
			return 1
		}
		return 0
	})
	set.RegisterMetricsWriter(func(w io.Writer) {
		u := srv.URingStats()
		c := []counterValue{
			{"dmfuse_memory_releases_total", srv.Releases()},
			{`dmfuse_uring_handoffs_total{cause="waiting"}`, u.Waiting},
			{`dmfuse_uring_handoffs_total{cause="watchdog"}`, u.Watchdog},
			{"dmfuse_uring_interrupts_total", u.Interrupts},
			{"dmfuse_uring_offloaded_total", u.Offloaded},
			{"dmfuse_uring_direct_total", u.Direct},
			{"dmfuse_uring_polls_total", u.Polls},
			{"dmfuse_uring_poll_probes_total", u.Probes},
			{"dmfuse_uring_poll_hits_total", u.PollHits},
			{"dmfuse_uring_poll_contended_total", u.PollContended},
			{"dmfuse_uring_poll_microseconds_total", uint64(u.PollTime.Microseconds())},
		}
		for q := range p.URingQueues {
			var n uint64
			if q < len(u.Requests) {
				n = u.Requests[q]
			}
			c = append(c, counterValue{fmt.Sprintf(`dmfuse_uring_requests_total{queue="%d"}`, q), n})
		}
		writeCounters(w, c)
	})
	metrics.RegisterSet(set)
	return set
}

// counterValue is one counter's series and its value at a scrape.
type counterValue struct {
	name  string
	value uint64
}

// writeCounters writes c to w as Prometheus counters (with their TYPE lines
// when metrics.ExposeMetadata(true) is in force), not as the gauges that a
// metrics.Set's callbacks make.
func writeCounters(w io.Writer, c []counterValue) {
	set := metrics.NewSet()
	for _, v := range c {
		set.NewCounter(v.name).Set(v.value)
	}
	set.WritePrometheus(w)
}

// listenLoopback listens on addr, which must name a loopback address
// (127.0.0.0/8, ::1 or localhost): the pprof endpoints show the daemon's
// memory and let anyone who reaches them make it work.
func listenLoopback(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%s: not a loopback address (want 127.0.0.1:PORT, [::1]:PORT or localhost:PORT)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
		ln.Close()
		return nil, fmt.Errorf("%s: resolves to %v, not a loopback address", addr, ln.Addr())
	}
	return ln, nil
}

// pprofMux serves the runtime profiles under /debug/pprof/, for
// `go tool pprof http://HOST:PORT/debug/pprof/heap`.
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// serveHTTP serves h on ln until the returned function is called.
func serveHTTP(what string, ln net.Listener, h http.Handler) (stop func()) {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "dmfuse: %s: %v\n", what, err)
		}
	}()
	return func() { hs.Close() }
}

// limitString prints a memory limit in MiB, or "off".
func limitString(n int64) string {
	if n <= 0 {
		return "off"
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}
