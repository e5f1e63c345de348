package stack

import (
	"github.com/VictoriaMetrics/metrics"

	"github.com/dmfuse/dmfuse/stats"
)

// RegionHistograms returns the metric set of the histograms of the dm-stats
// regions of m's devices that have a live table (stats.RegionHistograms),
// which the daemon registers (metrics.RegisterSet) to serve them on its
// /metrics. A manager answers dm-stats' messages when it is built with
// ManagerOptions.CoreMessage set to DMStatsMessage.
func RegionHistograms(m *Manager) *metrics.Set {
	return stats.RegionHistograms(func() []stats.Named {
		var out []stats.Named
		for _, d := range m.Devices() {
			if d.Live() != nil {
				out = append(out, stats.Named{Name: d.Name(), Disk: d.Disk()})
			}
		}
		return out
	})
}

// DMStatsMessage is the ManagerOptions.CoreMessage that answers the
// device-mapper core's dm-stats messages (`@stats_create`, `@stats_delete`,
// `@stats_clear`, `@stats_list`, `@stats_print`, `@stats_print_clear`,
// `@stats_set_aux`; drivers/md/dm-stats.c: dm_stats_message) for d, with the
// regions kept in d's stats.Disk (the words start with the message name).
// Other `@` words fail with "Unsupported message sent to DM core" (EINVAL),
// as in dm. Regions live as long as their device: a removed device takes its
// regions with it, and a new device of the same name starts with none. A
// whole-device range (`-`) covers the live table's sectors at the time of
// the message (1 sector if there is no live table).
func DMStatsMessage(d *Device, args []string) (string, error) {
	out, handled, err := d.Disk().StatsMessage(args, uint64(d.Size())/SectorSize)
	if !handled {
		return "", Errorf("Unsupported message sent to DM core")
	}
	return out, err
}
