package health

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exposes GPU figures and health as Prometheus metrics, read from a snapshot at each
// scrape so that they are never staler than the monitor's last poll.
type Collector struct {
	snapshot func() []GPUStatus

	memUsed, memTotal, util, temp, tempLimit, power, throttle, ecc, xids, healthy *prometheus.Desc
}

// NewCollector reads GPUs from snapshot (a Monitor's Snapshot); register it on the registry that
// serves /metrics.
func NewCollector(snapshot func() []GPUStatus) *Collector {
	l := []string{"index", "uuid", "name"}
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("voxmux_gpu_"+name, help, append(append([]string(nil), l...), extra...), nil)
	}
	return &Collector{
		snapshot:  snapshot,
		memUsed:   d("memory_used_bytes", "GPU memory in use."),
		memTotal:  d("memory_total_bytes", "GPU memory in all."),
		util:      d("utilization_ratio", "Share of the last sample period the GPU was busy (0-1)."),
		temp:      d("temperature_celsius", "GPU temperature."),
		tempLimit: d("temperature_limit_celsius", "Temperature above which voxmux takes the GPU's group out."),
		power:     d("power_watts", "GPU power draw."),
		throttle:  d("throttle_reason", "1 while the reason holds the GPU's clocks down (NVML clock event reasons).", "reason"),
		ecc:       d("ecc_errors_total", "ECC errors since the driver loaded (volatile counters).", "type"),
		xids:      d("xid_errors_total", "Critical (not ignored) Xid errors seen since voxmux started."),
		healthy:   d("healthy", "1 when the GPU is healthy, 0 when voxmux considers it faulty."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.memUsed, c.memTotal, c.util, c.temp, c.tempLimit, c.power, c.throttle, c.ecc, c.xids, c.healthy} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.snapshot() {
		l := []string{strconv.Itoa(g.Index), g.UUID, g.Name}
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(append([]string(nil), l...), extra...)...)
		}
		gauge(c.memUsed, float64(g.MemoryUsedBytes))
		gauge(c.memTotal, float64(g.MemoryTotalBytes))
		gauge(c.util, float64(g.UtilizationPercent)/100)
		gauge(c.temp, float64(g.TemperatureC))
		gauge(c.tempLimit, float64(g.TemperatureLimitC))
		if g.PowerWatts != nil {
			gauge(c.power, *g.PowerWatts)
		}
		active := map[string]bool{}
		for _, r := range g.ThrottleReasons {
			active[r] = true
		}
		for _, r := range clockEventReasonNames {
			gauge(c.throttle, b2f(active[r.name]), r.name)
		}
		if g.ECCCorrected != nil && g.ECCUncorrected != nil {
			ch <- prometheus.MustNewConstMetric(c.ecc, prometheus.CounterValue, float64(*g.ECCCorrected), append(append([]string(nil), l...), "corrected")...)
			ch <- prometheus.MustNewConstMetric(c.ecc, prometheus.CounterValue, float64(*g.ECCUncorrected), append(append([]string(nil), l...), "uncorrected")...)
		}
		ch <- prometheus.MustNewConstMetric(c.xids, prometheus.CounterValue, float64(g.XidErrors), l...)
		gauge(c.healthy, b2f(g.Healthy))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
