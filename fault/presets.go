package fault

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Presets name a device's performance by what it imitates; each expands to
// the options below (a user's own options after it override them). The
// figures are the providers' published ones; latencies, which they do not
// publish as distributions, are lognormal fits to their stated typical
// figures, and say so.
//
//	gp2[:size=GiB,credits=N]  AWS EBS gp2: baseline 3 IOPS/GiB (at least 100, at
//	                      most 16000), bursts to 3000 IOPS from a 5.4 M
//	                      credit bucket that starts full and refills at the
//	                      baseline (volumes of 1000 GiB and more have no
//	                      burst); 128 MiB/s up to 170 GiB, 250 MiB/s above;
//	                      an I/O up to 256 KiB counts once (credits= makes
//	                      the bucket smaller, to see it run out). Latency
//	                      lognormal(600us,3ms): "single-digit millisecond".
//	                      Source: EC2 user guide, ebs-volume-types.
//	gp3[:iops=N,mbps=M]   AWS EBS gp3: 3000 IOPS and 125 MiB/s at any size,
//	                      or what is provisioned (up to 16000 and 1000).
//	                      Latency as gp2. Source: as gp2.
//	io2[:iops=N]          AWS EBS io2 Block Express: provisioned IOPS
//	                      (default 16000), 0.256 MiB/s per IOPS up to 4000
//	                      MiB/s; "under 500 us average latency for 16 KiB
//	                      I/O": lognormal(300us,800us). Source: EBS
//	                      provisioned-iops.
//	azure-p1 ... azure-p20  Azure Premium SSD v1 tiers with credit bursting:
//	                      the tier's IOPS and MB/s, bursting to 3500 IOPS and
//	                      170 MB/s from a bucket of 30 minutes at the burst
//	                      rate that starts full and refills from unused
//	                      baseline. Latency lognormal(1ms,5ms). Source:
//	                      Microsoft docs, disk-bursting.
//	hdd7200[:size=GiB]    a 7200 rpm disk: seek from 1 ms (track to track)
//	                      to 16 ms (full stroke) by distance, rotation
//	                      uniform over 8.33 ms, 200 MB/s outer to 100 MB/s
//	                      inner, one head. Source: Ruemmler and Wilkes,
//	                      "An Introduction to Disk Drive Modeling" (1994),
//	                      with figures of current 7200 rpm drives.
//	consumer-ssd          a consumer SSD: reads lognormal(80us,500us), writes
//	                      lognormal(30us,300us) (its write cache), flushes
//	                      lognormal(1ms,5ms), 4 parallel units, and a
//	                      garbage-collection stall of 150 ms after every 2
//	                      GiB written. Source: "The Tail at Store" (Hao et
//	                      al., FAST'16) for the stalls' cause; the figures
//	                      are typical, not one product's.
//	cloud-nvme            a cloud VM's local NVMe behind the hypervisor's
//	                      token bucket: 90 us reads, and the I/O over
//	                      275000 IOPS held by a quantum of 3 ms: latency
//	                      mix(0.99*lognormal(90us,200us),0.01*3ms), the
//	                      bimodal "hold". Source: eloqstore PR #461.
func preset(spec string) ([]string, error) {
	name, params, _ := strings.Cut(spec, ":")
	kv := map[string]string{}
	if params != "" {
		for _, p := range strings.Split(params, ",") {
			k, v, ok := strings.Cut(p, "=")
			if !ok {
				return nil, fmt.Errorf("preset %s: %q is not KEY=VALUE", name, p)
			}
			kv[k] = v
		}
	}
	num := func(k string, def float64) (float64, error) {
		v, ok := kv[k]
		delete(kv, k)
		if !ok {
			return def, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSuffix(v, "G"), "GiB"), 64)
		if err != nil || f <= 0 {
			return 0, fmt.Errorf("preset %s: %s=%q is not a number above 0", name, k, v)
		}
		return f, nil
	}
	var out []string
	var err error
	switch name {
	case "gp2":
		var size float64
		if size, err = num("size", 100); err != nil {
			return nil, err
		}
		base := min(max(3*size, 100), 16000)
		mbps := 128.0
		if size > 170 {
			mbps = 250
		}
		var credits float64
		if credits, err = num("credits", 5.4e6); err != nil {
			return nil, err
		}
		iops := fmt.Sprintf("iops=%g", base)
		if size < 1000 && base < 3000 {
			// 3000 x 1800 s = 5.4 M credits
			iops = fmt.Sprintf("iops=%g/3000/%dms", base, int64(credits/3000*1000))
		}
		out = []string{iops, fmt.Sprintf("bps=%gM", mbps), "iops-size=256K", "read=lognormal(600us,3ms)", "write=lognormal(600us,3ms)", "flush=lognormal(600us,3ms)"}
	case "gp3":
		var iops, mbps float64
		if iops, err = num("iops", 3000); err != nil {
			return nil, err
		}
		if mbps, err = num("mbps", 125); err != nil {
			return nil, err
		}
		if iops < 3000 || iops > 16000 || mbps < 125 || mbps > 1000 {
			return nil, fmt.Errorf("preset gp3: iops 3000-16000 and mbps 125-1000")
		}
		out = []string{fmt.Sprintf("iops=%g", iops), fmt.Sprintf("bps=%gM", mbps), "iops-size=256K", "read=lognormal(600us,3ms)", "write=lognormal(600us,3ms)", "flush=lognormal(600us,3ms)"}
	case "io2":
		var iops float64
		if iops, err = num("iops", 16000); err != nil {
			return nil, err
		}
		if iops < 100 || iops > 256000 {
			return nil, fmt.Errorf("preset io2: iops 100-256000")
		}
		out = []string{fmt.Sprintf("iops=%g", iops), fmt.Sprintf("bps=%gM", min(iops*0.256, 4000)), "iops-size=256K", "read=lognormal(300us,800us)", "write=lognormal(300us,800us)", "flush=lognormal(300us,800us)"}
	case "hdd7200":
		var size float64
		if size, err = num("size", 1000); err != nil {
			return nil, err
		}
		out = []string{fmt.Sprintf("hdd=%g", size), "flush=lognormal(500us,2ms)"}
	case "consumer-ssd":
		out = []string{"read=lognormal(80us,500us)", "write=lognormal(30us,300us)", "flush=lognormal(1ms,5ms)", "units=4", "gc=2G/150ms"}
	case "cloud-nvme":
		out = []string{"read=mix(0.99*lognormal(90us,200us),0.01*3ms)", "write=mix(0.99*lognormal(30us,100us),0.01*3ms)", "iops=275000"}
	default:
		if tier, ok := azureTiers[name]; ok {
			out = []string{fmt.Sprintf("iops=%d/3500/1800s", tier[0]), fmt.Sprintf("bps=%dM/170M/1800s", tier[1]),
				"read=lognormal(1ms,5ms)", "write=lognormal(1ms,5ms)", "flush=lognormal(1ms,5ms)"}
			break
		}
		names := []string{"gp2", "gp3", "io2", "hdd7200", "consumer-ssd", "cloud-nvme"}
		for n := range azureTiers {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("unknown preset %q (%s)", name, strings.Join(names, ", "))
	}
	for k := range kv {
		return nil, fmt.Errorf("preset %s takes no %s", name, k)
	}
	return out, nil
}

// azureTiers are the Premium SSD tiers with credit bursting: IOPS and MB/s.
var azureTiers = map[string][2]int{
	"azure-p1": {120, 25}, "azure-p2": {120, 25}, "azure-p3": {120, 25}, "azure-p4": {120, 25},
	"azure-p6": {240, 50}, "azure-p10": {500, 100}, "azure-p15": {1100, 125}, "azure-p20": {2300, 150},
}
