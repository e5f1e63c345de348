package stats

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// Named is a device's name with its counters, as the Exporter lists them.
type Named struct {
	Name string
	Disk *Disk
}

// Exporter writes the counters of the devices that list returns, in the
// Prometheus text format, with names after node_exporter's disk metrics and a
// "dmfuse_" prefix, labelled device="NAME":
//
//	dmfuse_reads_completed_total, dmfuse_reads_merged_total, dmfuse_read_bytes_total,
//	dmfuse_read_time_seconds_total, dmfuse_writes_completed_total,
//	dmfuse_writes_merged_total, dmfuse_written_bytes_total,
//	dmfuse_write_time_seconds_total, dmfuse_io_now, dmfuse_io_time_seconds_total,
//	dmfuse_io_time_weighted_seconds_total, dmfuse_discards_completed_total,
//	dmfuse_discards_merged_total, dmfuse_discarded_sectors_total,
//	dmfuse_discard_time_seconds_total, dmfuse_flush_requests_total,
//	dmfuse_flush_requests_time_seconds_total
//
// plus the in-flight gauges dmfuse_reads_in_flight and dmfuse_writes_in_flight
// (discards and flushes count as writes) and the latency histograms
// dmfuse_read_latency_seconds, dmfuse_write_latency_seconds and
// dmfuse_discard_latency_seconds, with Prometheus "le" buckets.
//
// Everything is computed from one Snapshot per device at scrape time, so the
// I/O path is not counted twice, a histogram's _count equals the matching
// completed counter and its _sum the matching time counter, and a device that
// list no longer returns has no series. As in the kernel, merges and flush
// requests are always 0 (an empty flush counts as a write); the time counters
// are the exact nanosecond sums, not the millisecond fields of diskstats.
type Exporter struct {
	list func() []Named
}

// NewExporter returns an Exporter of the devices that list returns at each
// scrape. list may return devices in any order; they are written sorted by name.
func NewExporter(list func() []Named) *Exporter { return &Exporter{list: list} }

type counterDef struct {
	name  string
	value func(s *Snapshot) uint64
}

type secondsDef struct {
	name string
	ns   func(s *Snapshot) uint64
}

var promCounters = []counterDef{
	{"dmfuse_reads_completed_total", func(s *Snapshot) uint64 { return s.IOs[GroupRead] }},
	{"dmfuse_reads_merged_total", func(*Snapshot) uint64 { return 0 }},
	{"dmfuse_read_bytes_total", func(s *Snapshot) uint64 { return s.Sectors[GroupRead] * 512 }},
	{"dmfuse_writes_completed_total", func(s *Snapshot) uint64 { return s.IOs[GroupWrite] }},
	{"dmfuse_writes_merged_total", func(*Snapshot) uint64 { return 0 }},
	{"dmfuse_written_bytes_total", func(s *Snapshot) uint64 { return s.Sectors[GroupWrite] * 512 }},
	{"dmfuse_discards_completed_total", func(s *Snapshot) uint64 { return s.IOs[GroupDiscard] }},
	{"dmfuse_discards_merged_total", func(*Snapshot) uint64 { return 0 }},
	{"dmfuse_discarded_sectors_total", func(s *Snapshot) uint64 { return s.Sectors[GroupDiscard] }},
	{"dmfuse_flush_requests_total", func(*Snapshot) uint64 { return 0 }},
}

var promSeconds = []secondsDef{
	{"dmfuse_read_time_seconds_total", func(s *Snapshot) uint64 { return s.Nsecs[GroupRead] }},
	{"dmfuse_write_time_seconds_total", func(s *Snapshot) uint64 { return s.Nsecs[GroupWrite] }},
	{"dmfuse_discard_time_seconds_total", func(s *Snapshot) uint64 { return s.Nsecs[GroupDiscard] }},
	{"dmfuse_flush_requests_time_seconds_total", func(*Snapshot) uint64 { return 0 }},
	{"dmfuse_io_time_seconds_total", func(s *Snapshot) uint64 { return s.IOTicks * uint64(TickNs) }},
	{"dmfuse_io_time_weighted_seconds_total", func(s *Snapshot) uint64 {
		return s.Nsecs[GroupRead] + s.Nsecs[GroupWrite] + s.Nsecs[GroupDiscard]
	}},
}

var promGauges = []counterDef{
	{"dmfuse_io_now", func(s *Snapshot) uint64 { return uint64(s.InFlightTotal) }},
	{"dmfuse_reads_in_flight", func(s *Snapshot) uint64 { return uint64(s.InFlight[0]) }},
	{"dmfuse_writes_in_flight", func(s *Snapshot) uint64 { return uint64(s.InFlight[1]) }},
}

var promHistograms = [NumGroups]string{
	GroupRead:    "dmfuse_read_latency_seconds",
	GroupWrite:   "dmfuse_write_latency_seconds",
	GroupDiscard: "dmfuse_discard_latency_seconds",
}

// leLabels are the formatted upper bounds of the buckets, "+Inf" last.
var leLabels = func() []string {
	var l []string
	for _, b := range LatencyBounds() {
		l = append(l, strconv.FormatFloat(b, 'g', -1, 64))
	}
	return append(l, "+Inf")
}()

// escapeLabel escapes a label value for the text format.
func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

type devSnap struct {
	label string // `device="NAME"`
	snap  Snapshot
}

// snapshots takes one snapshot per listed device, sorted by name, skipping
// duplicate names and nil disks.
func (e *Exporter) snapshots() []devSnap {
	list := e.list()
	seen := make(map[string]bool, len(list))
	out := make([]devSnap, 0, len(list))
	for _, n := range list {
		if n.Disk == nil || seen[n.Name] {
			continue
		}
		seen[n.Name] = true
		out = append(out, devSnap{label: `device="` + escapeLabel(n.Name) + `"`, snap: n.Disk.Snapshot()})
	}
	slices.SortFunc(out, func(a, b devSnap) int { return strings.Compare(a.label, b.label) })
	return out
}

// WritePrometheus writes the metrics of every listed device to w. HELP and TYPE
// lines are written when metrics.ExposeMetadata(true) is in force.
func (e *Exporter) WritePrometheus(w io.Writer) {
	devs := e.snapshots()
	if len(devs) == 0 {
		return
	}
	set := metrics.NewSet()
	for i := range devs {
		d := &devs[i]
		for _, c := range promCounters {
			set.NewCounter(c.name + "{" + d.label + "}").Set(c.value(&d.snap))
		}
		for _, c := range promSeconds {
			set.NewFloatCounter(c.name + "{" + d.label + "}").Set(float64(c.ns(&d.snap)) / 1e9)
		}
		for _, g := range promGauges {
			set.NewGauge(g.name+"{"+d.label+"}", nil).Set(float64(g.value(&d.snap)))
		}
	}
	var bb bytes.Buffer
	set.WritePrometheus(&bb)
	for g, name := range promHistograms {
		metrics.WriteMetadataIfNeeded(&bb, name, "histogram")
		for i := range devs {
			writeHistogram(&bb, name, devs[i].label, &devs[i].snap, Group(g))
		}
	}
	w.Write(bb.Bytes())
}

// writeHistogram writes one device's histogram of group g: cumulative buckets,
// _sum in seconds and _count.
func writeHistogram(b *bytes.Buffer, name, label string, s *Snapshot, g Group) {
	var cum uint64
	var num []byte
	for i, n := range s.Latency[g] {
		cum += n
		b.WriteString(name)
		b.WriteString("_bucket{")
		b.WriteString(label)
		b.WriteString(`,le="`)
		b.WriteString(leLabels[i])
		b.WriteString(`"} `)
		num = strconv.AppendUint(num[:0], cum, 10)
		b.Write(num)
		b.WriteByte('\n')
	}
	b.WriteString(name + "_sum{" + label + "} ")
	b.WriteString(strconv.FormatFloat(float64(s.Nsecs[g])/1e9, 'g', -1, 64))
	b.WriteByte('\n')
	b.WriteString(name + "_count{" + label + "} ")
	b.Write(strconv.AppendUint(num[:0], cum, 10))
	b.WriteByte('\n')
}

// ServeHTTP serves the device metrics followed by those of the metrics
// package's default set and registered sets and the process metrics (go_*,
// process_*), for a /metrics endpoint.
func (e *Exporter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	e.WritePrometheus(w)
	metrics.WritePrometheus(w, true)
}
