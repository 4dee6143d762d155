package health

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollector(t *testing.T) {
	g0, g1 := h100(0), h100(1)
	g0.throttle = nvml.ClocksEventReasonSwPowerCap
	g0.corr, g0.uncorr = 3, 0
	g1.noECC, g1.powerMW, g1.temp = true, 0, 99
	m, _ := newMonitor(t, newFakeHost(g0, g1), MonitorConfig{})
	defer m.Close()
	c := NewCollector(m.Snapshot)

	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	want := `
# HELP voxmux_gpu_ecc_errors_total ECC errors since the driver loaded (volatile counters).
# TYPE voxmux_gpu_ecc_errors_total counter
voxmux_gpu_ecc_errors_total{index="0",name="NVIDIA H100 80GB HBM3",type="corrected",uuid="GPU-00000000"} 3
voxmux_gpu_ecc_errors_total{index="0",name="NVIDIA H100 80GB HBM3",type="uncorrected",uuid="GPU-00000000"} 0
# HELP voxmux_gpu_healthy 1 when the GPU is healthy, 0 when voxmux considers it faulty.
# TYPE voxmux_gpu_healthy gauge
voxmux_gpu_healthy{index="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000000"} 1
voxmux_gpu_healthy{index="1",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000001"} 0
# HELP voxmux_gpu_memory_used_bytes GPU memory in use.
# TYPE voxmux_gpu_memory_used_bytes gauge
voxmux_gpu_memory_used_bytes{index="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000000"} 1.073741824e+09
voxmux_gpu_memory_used_bytes{index="1",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000001"} 1.073741824e+09
# HELP voxmux_gpu_memory_total_bytes GPU memory in all.
# TYPE voxmux_gpu_memory_total_bytes gauge
voxmux_gpu_memory_total_bytes{index="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000000"} 8.589934592e+10
voxmux_gpu_memory_total_bytes{index="1",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000001"} 8.589934592e+10
# HELP voxmux_gpu_power_watts GPU power draw.
# TYPE voxmux_gpu_power_watts gauge
voxmux_gpu_power_watts{index="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000000"} 123.456
# HELP voxmux_gpu_temperature_celsius GPU temperature.
# TYPE voxmux_gpu_temperature_celsius gauge
voxmux_gpu_temperature_celsius{index="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000000"} 40
voxmux_gpu_temperature_celsius{index="1",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000001"} 99
# HELP voxmux_gpu_utilization_ratio Share of the last sample period the GPU was busy (0-1).
# TYPE voxmux_gpu_utilization_ratio gauge
voxmux_gpu_utilization_ratio{index="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000000"} 0.42
voxmux_gpu_utilization_ratio{index="1",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000001"} 0.42
# HELP voxmux_gpu_xid_errors_total Critical (not ignored) Xid errors seen since voxmux started.
# TYPE voxmux_gpu_xid_errors_total counter
voxmux_gpu_xid_errors_total{index="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000000"} 0
voxmux_gpu_xid_errors_total{index="1",name="NVIDIA H100 80GB HBM3",uuid="GPU-00000001"} 0
`
	names := []string{"voxmux_gpu_ecc_errors_total", "voxmux_gpu_healthy", "voxmux_gpu_memory_used_bytes", "voxmux_gpu_memory_total_bytes",
		"voxmux_gpu_power_watts", "voxmux_gpu_temperature_celsius", "voxmux_gpu_utilization_ratio", "voxmux_gpu_xid_errors_total"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// Every reason is exported per GPU (0 or 1), so a series never vanishes between scrapes.
	var b strings.Builder
	b.WriteString("# HELP voxmux_gpu_throttle_reason 1 while the reason holds the GPU's clocks down (NVML clock event reasons).\n")
	b.WriteString("# TYPE voxmux_gpu_throttle_reason gauge\n")
	for i := range 2 {
		for _, r := range clockEventReasonNames {
			v := 0
			if i == 0 && r.name == "sw_power_cap" {
				v = 1
			}
			fmt.Fprintf(&b, "voxmux_gpu_throttle_reason{index=\"%d\",name=\"NVIDIA H100 80GB HBM3\",reason=%q,uuid=\"GPU-0000000%d\"} %d\n", i, r.name, i, v)
		}
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(b.String()), "voxmux_gpu_throttle_reason"); err != nil {
		t.Error(err)
	}
}
