package health

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func newMonitor(t *testing.T, h *fakeHost, cfg MonitorConfig) (*Monitor, chan GPUStatus) {
	t.Helper()
	m, err := NewMonitor(h.nvml(), cfg, nil)
	if err != nil {
		t.Fatalf("NewMonitor: %v", err)
	}
	changes := make(chan GPUStatus, 64)
	m.OnChange(func(s GPUStatus) { changes <- s })
	return m, changes
}

// run starts the monitor's loops and stops them when the test ends.
func run(t *testing.T, m *Monitor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// next waits for the next health change (the monitor reports it; no timing is asserted).
func next(t *testing.T, changes chan GPUStatus) GPUStatus {
	t.Helper()
	select {
	case s := <-changes:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("no GPU health change reported")
		return GPUStatus{}
	}
}

func noChange(t *testing.T, changes chan GPUStatus) {
	t.Helper()
	select {
	case s := <-changes:
		t.Fatalf("unexpected health change: %+v", s)
	default:
	}
}

func TestNoNVML(t *testing.T) {
	h := newFakeHost()
	h.initRet = nvml.ERROR_LIBRARY_NOT_FOUND
	_, err := NewMonitor(h.nvml(), MonitorConfig{}, nil)
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("err = %v, want ErrNoNVML", err)
	}
	if !strings.Contains(err.Error(), "nvmlInit") {
		t.Errorf("err = %q, want it to say what failed", err)
	}
	// The real library on a host without the driver fails the same way, cleanly.
	if _, err := NewMonitor(NewNVML(nvml.New()), MonitorConfig{}, nil); err != nil && !errors.Is(err, ErrNoNVML) {
		t.Errorf("real NVML: err = %v, want nil or ErrNoNVML", err)
	}
}

func TestNilMonitorIsNoGPUs(t *testing.T) {
	var m *Monitor
	if s := m.Snapshot(); s != nil {
		t.Errorf("Snapshot = %v", s)
	}
	if err := m.Check(0); err != nil {
		t.Errorf("Check = %v", err)
	}
	if ok, _ := m.Healthy(0); !ok {
		t.Error("Healthy = false")
	}
	m.OnChange(func(GPUStatus) {})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Run(ctx); err != nil {
		t.Errorf("Run = %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}

func TestSnapshotFigures(t *testing.T) {
	g0, g1 := h100(0), h100(1)
	g1.throttle = nvml.ClocksEventReasonSwPowerCap | nvml.ClocksThrottleReasonHwThermalSlowdown
	g1.corr, g1.uncorr = 7, 0
	g1.slowdown, g1.powerMW = 0, 0 // reports neither its slowdown threshold nor its power
	g0.noECC = true
	m, _ := newMonitor(t, newFakeHost(g0, g1), MonitorConfig{})
	defer m.Close()
	s := m.Snapshot()
	if len(s) != 2 {
		t.Fatalf("%d GPUs, want 2", len(s))
	}
	a, b := s[0], s[1]
	if a.Index != 0 || a.UUID != g0.uuid || a.Name != g0.name || a.MemoryUsedBytes != 1<<30 || a.MemoryTotalBytes != 80<<30 ||
		a.UtilizationPercent != 42 || a.TemperatureC != 40 || !a.Healthy || a.Reason != "" {
		t.Errorf("GPU 0 = %+v", a)
	}
	if a.PowerWatts == nil || *a.PowerWatts != 123.456 {
		t.Errorf("GPU 0 power = %v, want 123.456 W", a.PowerWatts)
	}
	if a.TemperatureLimitC != 87 {
		t.Errorf("GPU 0 limit = %d, want its slowdown threshold 87", a.TemperatureLimitC)
	}
	if a.ECCCorrected != nil || a.ECCUncorrected != nil {
		t.Errorf("GPU 0 has no ECC, got %v %v", a.ECCCorrected, a.ECCUncorrected)
	}
	if b.Index != 1 || b.PowerWatts != nil || b.TemperatureLimitC != DefaultMaxTemperature || !b.Healthy {
		t.Errorf("GPU 1 = %+v", b)
	}
	if b.ECCCorrected == nil || *b.ECCCorrected != 7 || b.ECCUncorrected == nil || *b.ECCUncorrected != 0 {
		t.Errorf("GPU 1 ECC = %v %v, want 7 0", b.ECCCorrected, b.ECCUncorrected)
	}
	if strings.Join(b.ThrottleReasons, ",") != "sw_power_cap,hw_thermal_slowdown" {
		t.Errorf("GPU 1 throttle = %v", b.ThrottleReasons)
	}
	if g0.registers != 1 || g1.registers != 1 {
		t.Errorf("event registrations = %d, %d; want 1 each", g0.registers, g1.registers)
	}

	m2, _ := newMonitor(t, newFakeHost(h100(0)), MonitorConfig{MaxTemperature: 75})
	defer m2.Close()
	if l := m2.Snapshot()[0].TemperatureLimitC; l != 75 {
		t.Errorf("configured limit = %d, want 75", l)
	}
}

func TestCriticalXidUntilCheckPasses(t *testing.T) {
	h := newFakeHost(h100(0), h100(1))
	m, changes := newMonitor(t, h, MonitorConfig{})
	run(t, m)

	h.xid(1, 79) // fell off the bus
	s := next(t, changes)
	if s.Index != 1 || s.Healthy || s.Reason != "critical Xid 79" || s.XidErrors != 1 || s.LastXid != 79 {
		t.Fatalf("change = %+v, want GPU 1 unhealthy from Xid 79", s)
	}
	if !m.Snapshot()[0].Healthy {
		t.Error("GPU 0 turned unhealthy from GPU 1's Xid")
	}
	if ok, why := m.Healthy(0); !ok || why != "" {
		t.Errorf("Healthy(0) = %v %q", ok, why)
	}
	if ok, why := m.Healthy(0, 1, 5); ok || why != "GPU 1: critical Xid 79; GPU 5: not on this host (NVML sees 2 GPUs)" {
		t.Errorf("Healthy(0, 1, 5) = %v %q", ok, why)
	}
	// The Xid is latched: the first check after it fails, the next passes and clears it.
	if err := m.Check(0, 1); err == nil || !strings.Contains(err.Error(), "GPU 1: critical Xid 79 since the last check") {
		t.Fatalf("first Check = %v, want the Xid reported", err)
	}
	if m.Snapshot()[1].Healthy {
		t.Fatal("GPU 1 healthy after a failing check")
	}
	if err := m.Check(0, 1); err != nil {
		t.Fatalf("second Check = %v, want pass", err)
	}
	if s := next(t, changes); s.Index != 1 || !s.Healthy {
		t.Fatalf("change = %+v, want GPU 1 healthy", s)
	}
	if err := m.Check(2); err == nil {
		t.Error("Check of a GPU the host lacks passed")
	}
}

func TestIgnoredXids(t *testing.T) {
	h := newFakeHost(h100(0))
	m, changes := newMonitor(t, h, MonitorConfig{})
	run(t, m)
	for _, x := range DefaultIgnoredXids {
		h.xid(0, x)
	}
	h.xid(0, 48) // events are handled in order: once 48 is reported, the others were skipped
	if s := next(t, changes); s.Reason != "critical Xid 48" || s.XidErrors != 1 {
		t.Fatalf("change = %+v, want only Xid 48 counted", s)
	}
	noChange(t, changes)

	// The list is configurable: here 48 is the one ignored, and 13 counts.
	h2 := newFakeHost(h100(0))
	m2, changes2 := newMonitor(t, h2, MonitorConfig{IgnoredXids: []uint64{48}})
	run(t, m2)
	h2.xid(0, 48)
	h2.xid(0, 13)
	if s := next(t, changes2); s.Reason != "critical Xid 13" || s.XidErrors != 1 {
		t.Fatalf("change = %+v, want Xid 13 critical", s)
	}
}

func TestDoubleBitECC(t *testing.T) {
	g := h100(0)
	h := newFakeHost(g)
	m, changes := newMonitor(t, h, MonitorConfig{})
	run(t, m)
	h.events <- waitResult{data: nvml.EventData{Device: g.device(), EventType: nvml.EventTypeDoubleBitEccError}}
	if s := next(t, changes); s.Healthy || s.Reason != "double-bit ECC error" {
		t.Fatalf("change = %+v", s)
	}
	if err := m.Check(0); err == nil {
		t.Fatal("Check passed right after the event")
	}
	if err := m.Check(0); err != nil {
		t.Fatalf("second Check = %v", err)
	}
	if s := next(t, changes); !s.Healthy {
		t.Fatalf("change = %+v, want healthy", s)
	}

	// A rise of the uncorrected counter counts even when no event came.
	g.set(func(g *fakeGPU) { g.uncorr = 2 })
	m.poll()
	if s := next(t, changes); s.Healthy || s.Reason != "2 new double-bit (uncorrectable) ECC errors" {
		t.Fatalf("change = %+v", s)
	}
	if err := m.Check(0); err == nil {
		t.Fatal("Check passed right after new ECC errors")
	}
	if err := m.Check(0); err != nil {
		t.Fatalf("Check = %v; the count did not rise again", err)
	}
	if s := next(t, changes); !s.Healthy {
		t.Fatalf("change = %+v, want healthy", s)
	}
}

func TestOverheating(t *testing.T) {
	g := h100(0)
	h := newFakeHost(g)
	m, changes := newMonitor(t, h, MonitorConfig{})
	defer m.Close()
	g.set(func(g *fakeGPU) { g.temp = 95 })
	m.poll()
	if s := next(t, changes); s.Healthy || s.Reason != "temperature 95°C over the limit 87°C" {
		t.Fatalf("change = %+v", s)
	}
	if err := m.Check(0); err == nil {
		t.Fatal("Check passed while hot")
	}
	if err := m.Check(0); err == nil {
		t.Fatal("Check passed while still hot")
	}
	// Temperature is a live fault: cooling down heals it on the next reading.
	g.set(func(g *fakeGPU) { g.temp = 60 })
	m.poll()
	if s := next(t, changes); !s.Healthy || s.TemperatureC != 60 {
		t.Fatalf("change = %+v, want healthy at 60°C", s)
	}
	if err := m.Check(0); err != nil {
		t.Fatalf("Check = %v", err)
	}
}

func TestWaitErrorMarksAllSuspect(t *testing.T) {
	h := newFakeHost(h100(0), h100(1))
	m, changes := newMonitor(t, h, MonitorConfig{PollInterval: time.Hour})
	run(t, m)
	h.events <- waitResult{ret: nvml.ERROR_UNKNOWN}
	for range 2 {
		if s := next(t, changes); s.Healthy || !strings.HasPrefix(s.Reason, "suspect: NVML event wait failed") {
			t.Fatalf("change = %+v", s)
		}
	}
	if err := m.Check(0, 1); err == nil {
		t.Fatal("Check passed right after a failed wait")
	}
	if err := m.Check(0, 1); err != nil {
		t.Fatalf("Check = %v", err)
	}
	for range 2 {
		if s := next(t, changes); !s.Healthy {
			t.Fatalf("change = %+v", s)
		}
	}
}

func TestEventForUnknownDeviceMarksAllSuspect(t *testing.T) {
	stranger := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "GPU-stranger", nvml.SUCCESS }}
	for name, dev := range map[string]nvml.Device{"other UUID": stranger, "no device": nil} {
		t.Run(name, func(t *testing.T) {
			h := newFakeHost(h100(0), h100(1))
			m, changes := newMonitor(t, h, MonitorConfig{})
			run(t, m)
			h.events <- waitResult{data: nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 79}}
			seen := map[int]bool{}
			for range 2 {
				s := next(t, changes)
				if s.Healthy || s.Reason != "suspect: critical Xid 79 on an unknown device" {
					t.Fatalf("change = %+v", s)
				}
				seen[s.Index] = true
			}
			if !seen[0] || !seen[1] {
				t.Fatalf("suspect GPUs = %v, want both", seen)
			}
		})
	}
}

func TestLostGPU(t *testing.T) {
	g := h100(0)
	h := newFakeHost(g, h100(1))
	m, changes := newMonitor(t, h, MonitorConfig{})
	defer m.Close()
	g.set(func(g *fakeGPU) { g.lost = true })
	m.poll()
	s := next(t, changes)
	if s.Index != 0 || s.Healthy || !strings.Contains(s.Reason, "nvml: nvmlDeviceGetMemoryInfo") {
		t.Fatalf("change = %+v", s)
	}
	if err := m.Check(0); err == nil {
		t.Fatal("Check passed on a lost GPU")
	}
	g.set(func(g *fakeGPU) { g.lost = false })
	if err := m.Check(0); err != nil {
		t.Fatalf("Check = %v after the GPU came back", err)
	}
	if s := next(t, changes); !s.Healthy {
		t.Fatalf("change = %+v", s)
	}
}

func TestGPUWithoutHandleAtStart(t *testing.T) {
	h := newFakeHost(h100(0))
	h.handleErr[0] = nvml.ERROR_UNKNOWN
	m, changes := newMonitor(t, h, MonitorConfig{})
	defer m.Close()
	if s := m.Snapshot()[0]; s.Healthy || s.UUID != "" {
		t.Fatalf("GPU 0 = %+v, want unhealthy without a handle", s)
	}
	h.mu.Lock()
	delete(h.handleErr, 0)
	h.mu.Unlock()
	m.poll()
	if s := next(t, changes); !s.Healthy || s.UUID != h.gpus[0].uuid || s.TemperatureLimitC != 87 {
		t.Fatalf("change = %+v, want GPU 0 opened and healthy", s)
	}
}

func TestNoEventSupportStillPolls(t *testing.T) {
	g := h100(0)
	g.noEvents = true
	h := newFakeHost(g)
	m, changes := newMonitor(t, h, MonitorConfig{})
	if m.events != nil {
		t.Error("event set kept with no GPU registered on it")
	}
	if n := len(h.set.FreeCalls()); n != 1 {
		t.Errorf("event set freed %d times, want 1", n)
	}
	g.set(func(g *fakeGPU) { g.temp = 99 })
	m.poll()
	if s := next(t, changes); s.Healthy {
		t.Fatalf("change = %+v", s)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestRunReleasesNVML(t *testing.T) {
	h := newFakeHost(h100(0))
	m, _ := newMonitor(t, h, MonitorConfig{PollInterval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(h.set.FreeCalls()) != 1 || len(h.lib.ShutdownCalls()) != 1 {
		t.Fatalf("Free %d, Shutdown %d; want 1 each", len(h.set.FreeCalls()), len(h.lib.ShutdownCalls()))
	}
	if err := m.Close(); err != nil || len(h.lib.ShutdownCalls()) != 1 {
		t.Fatalf("second Close: %v, Shutdown %d times", err, len(h.lib.ShutdownCalls()))
	}
}
