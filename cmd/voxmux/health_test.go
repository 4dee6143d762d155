package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/health"
)

func TestGPUsWithoutNVML(t *testing.T) {
	// The real binary on this host: without an NVIDIA driver it says so and exits 0.
	out, err := exec.Command(voxmuxBinary(t), "gpus").CombinedOutput()
	if err != nil {
		t.Fatalf("voxmux gpus: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "no NVIDIA driver/NVML on this host") && !strings.HasPrefix(string(out), "INDEX") {
		t.Fatalf("output = %q", out)
	}

	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
	var stdout, stderr bytes.Buffer
	if err := listGPUs(&stdout, &stderr, health.NewNVML(lib), false); err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); !strings.HasPrefix(got, "no NVIDIA driver/NVML on this host: nvmlInit: ") {
		t.Errorf("table output = %q", got)
	}
	stdout.Reset()
	if err := listGPUs(&stdout, &stderr, health.NewNVML(lib), true); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "[]\n" || !strings.Contains(stderr.String(), "no NVIDIA driver/NVML") {
		t.Errorf("--json: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// fakeLib is one healthy and one overheating GPU behind go-nvml's mock.
func fakeLib() *mock.Interface {
	dev := func(i int, temp uint32) *mock.Device {
		return &mock.Device{
			GetUUIDFunc:                      func() (string, nvml.Return) { return []string{"GPU-aaaa", "GPU-bbbb"}[i], nvml.SUCCESS },
			GetNameFunc:                      func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3", nvml.SUCCESS },
			GetMemoryInfoFunc:                func() (nvml.Memory, nvml.Return) { return nvml.Memory{Used: 2 << 30, Total: 80 << 30}, nvml.SUCCESS },
			GetUtilizationRatesFunc:          func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 7}, nvml.SUCCESS },
			GetTemperatureFunc:               func(nvml.TemperatureSensors) (uint32, nvml.Return) { return temp, nvml.SUCCESS },
			GetTemperatureThresholdFunc:      func(nvml.TemperatureThresholds) (uint32, nvml.Return) { return 87, nvml.SUCCESS },
			GetPowerUsageFunc:                func() (uint32, nvml.Return) { return 70000, nvml.SUCCESS },
			GetCurrentClocksEventReasonsFunc: func() (uint64, nvml.Return) { return 0, nvml.SUCCESS },
			GetTotalEccErrorsFunc: func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
				return 0, nvml.SUCCESS
			},
			GetSupportedEventTypesFunc: func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
		}
	}
	devs := []nvml.Device{dev(0, 45), dev(1, 95)}
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 2, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return devs[i], nvml.SUCCESS },
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			return &mock.EventSet{FreeFunc: func() nvml.Return { return nvml.SUCCESS }}, nvml.SUCCESS
		},
	}
}

func TestGPUsTable(t *testing.T) {
	var out bytes.Buffer
	if err := listGPUs(&out, &out, health.NewNVML(fakeLib()), false); err != nil {
		t.Fatal(err)
	}
	want := `INDEX  UUID      NAME                   MEMORY            UTIL  TEMP  HEALTH
0      GPU-aaaa  NVIDIA H100 80GB HBM3  2048 / 81920 MiB  7%    45°C  healthy
1      GPU-bbbb  NVIDIA H100 80GB HBM3  2048 / 81920 MiB  7%    95°C  unhealthy: temperature 95°C over the limit 87°C
`
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestGPUsJSON(t *testing.T) {
	var out bytes.Buffer
	if err := listGPUs(&out, &out, health.NewNVML(fakeLib()), true); err != nil {
		t.Fatal(err)
	}
	var gpus []map[string]any
	if err := json.Unmarshal(out.Bytes(), &gpus); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(gpus) != 2 || gpus[0]["uuid"] != "GPU-aaaa" || gpus[0]["healthy"] != true || gpus[1]["healthy"] != false ||
		gpus[1]["memory_total_bytes"] != float64(80<<30) || gpus[1]["temperature_c"] != float64(95) || gpus[0]["power_watts"] != float64(70) {
		t.Errorf("json = %s", out.String())
	}
}

func TestOpenGPUMonitorCPUOnly(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := &config.Config{Groups: []config.Group{{Name: "cpu"}}}
	if m := openGPUMonitor(log, cfg); m != nil {
		t.Fatal("a monitor for CPU groups")
	}
	if n := strings.Count(logs.String(), "GPU health monitoring off"); n != 1 {
		t.Errorf("logged %d times: %s", n, logs.String())
	}
}

func TestConsulAPIConfig(t *testing.T) {
	t.Setenv("CONSUL_HTTP_ADDR", "10.1.1.1:8500")
	t.Setenv("CONSUL_HTTP_TOKEN", "env-token")
	t.Setenv("CONSUL_CACERT", "/env/ca.pem")
	cfg := &config.Config{File: "/etc/voxmux/voxmux.yaml"}
	c := consulAPIConfig(cfg)
	if c.Address != "10.1.1.1:8500" || c.Token != "env-token" || c.TLSConfig.CAFile != "/env/ca.pem" {
		t.Errorf("from the environment: %+v", c)
	}
	cfg.Consul = config.Consul{Address: "https://consul.local:8501", Token: "file-token", Datacenter: "dc2",
		TLS: config.ConsulTLS{CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem", ServerName: "consul.local"}}
	c = consulAPIConfig(cfg)
	if c.Address != "https://consul.local:8501" || c.Token != "file-token" || c.Datacenter != "dc2" ||
		c.TLSConfig.CAFile != "/etc/voxmux/ca.pem" || c.TLSConfig.CertFile != "/etc/voxmux/c.pem" ||
		c.TLSConfig.KeyFile != "/etc/voxmux/k.pem" || c.TLSConfig.Address != "consul.local" {
		t.Errorf("from the config file: %+v", c)
	}
}

func TestRegistrarConfig(t *testing.T) {
	addr := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	cfg := &config.Config{Consul: config.Consul{Enabled: true, Tags: []string{"gpu"}, CheckInterval: config.Duration(time.Second)}}
	rc, err := registrarConfig(cfg, addr("10.0.0.7:8080"), "host1")
	if err != nil {
		t.Fatal(err)
	}
	if rc.Service != "voxmux" || rc.ID != "voxmux-host1-8080" || rc.Address != "10.0.0.7" || rc.Port != 8080 ||
		rc.CheckURL != "http://10.0.0.7:8080/readyz" || rc.CheckInterval != time.Second || rc.Tags[0] != "gpu" {
		t.Errorf("specific address: %+v", rc)
	}
	// All interfaces: the agent's node address is registered, and the check goes through loopback.
	rc, _ = registrarConfig(cfg, addr("0.0.0.0:9000"), "host1")
	if rc.Address != "" || rc.CheckURL != "http://127.0.0.1:9000/readyz" {
		t.Errorf("all interfaces: %+v", rc)
	}
	cfg.Consul.Advertise, cfg.Consul.Service, cfg.Consul.ServiceID = "192.0.2.5", "tts", "tts-a"
	rc, _ = registrarConfig(cfg, addr("[::]:9000"), "host1")
	if rc.Address != "192.0.2.5" || rc.Service != "tts" || rc.ID != "tts-a" || rc.CheckURL != "http://127.0.0.1:9000/readyz" {
		t.Errorf("advertised: %+v", rc)
	}
}
