package stats

import (
	"bytes"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// RegionHistogramName is the Prometheus histogram of the dm-stats regions
// that have histogram boundaries.
const RegionHistogramName = "dmfuse_dmstats_region_latency_seconds"

// WriteRegionHistograms writes, for every dm-stats region with a histogram
// on the listed devices, one Prometheus histogram named
// RegionHistogramName, labelled device="NAME", region="ID" and
// program_id="...": the region's buckets summed over its areas, reads and
// writes together (as dm-stats counts them). A dm-stats bucket holds the
// durations below its boundary b, which are whole milliseconds (or whole
// nanoseconds with precise_timestamps), so its "le" is b minus one unit, in
// seconds. _sum is the summed read and write time of the region, _count its
// completed pieces (areas count a piece that spans them once each, as
// @stats_print does). Devices are written sorted by name, regions by id.
func WriteRegionHistograms(w io.Writer, devs []Named) {
	devs = slices.Clone(devs)
	slices.SortFunc(devs, func(a, b Named) int { return strings.Compare(a.Name, b.Name) })
	var b bytes.Buffer
	for _, n := range devs {
		if n.Disk == nil {
			continue
		}
		set := n.Disk.regions.Load()
		if set == nil {
			continue
		}
		for _, rg := range set.regions {
			if len(rg.bounds) == 0 {
				continue
			}
			if b.Len() == 0 {
				metrics.WriteMetadataIfNeeded(&b, RegionHistogramName, "histogram")
			}
			rg.writeHistogram(&b, `device="`+escapeLabel(n.Name)+`",region="`+strconv.Itoa(rg.id)+
				`",program_id="`+escapeLabel(rg.programID)+`"`)
		}
	}
	w.Write(b.Bytes())
}

func (rg *region) writeHistogram(b *bytes.Buffer, label string) {
	nb := rg.nbuckets()
	sums := make([]uint64, nb)
	var ticks uint64
	for i := range rg.areas {
		a := &rg.areas[i]
		a.mu.Lock()
		for j, v := range rg.hist[i*nb : (i+1)*nb] {
			sums[j] += v
		}
		ticks += a.c.ticks[0] + a.c.ticks[1]
		a.mu.Unlock()
	}
	unit := 1e3
	if rg.precise {
		unit = 1e9
	}
	var cum uint64
	for j, v := range sums {
		cum += v
		le := "+Inf"
		if j < len(rg.bounds) {
			le = strconv.FormatFloat(float64(rg.bounds[j]-1)/unit, 'g', -1, 64)
		}
		b.WriteString(RegionHistogramName + "_bucket{" + label + `,le="` + le + `"} `)
		b.WriteString(strconv.FormatUint(cum, 10))
		b.WriteByte('\n')
	}
	b.WriteString(RegionHistogramName + "_sum{" + label + "} ")
	b.WriteString(strconv.FormatFloat(float64(ticks)/unit, 'g', -1, 64))
	b.WriteByte('\n')
	b.WriteString(RegionHistogramName + "_count{" + label + "} ")
	b.WriteString(strconv.FormatUint(cum, 10))
	b.WriteByte('\n')
}

// RegionHistograms returns a metric set that writes the region histograms of
// the devices that list returns (WriteRegionHistograms). Registered with
// metrics.RegisterSet, which the daemon does, they join what
// metrics.WritePrometheus writes, and so an Exporter's /metrics.
func RegionHistograms(list func() []Named) *metrics.Set {
	s := metrics.NewSet()
	s.RegisterMetricsWriter(func(w io.Writer) { WriteRegionHistograms(w, list()) })
	return s
}
