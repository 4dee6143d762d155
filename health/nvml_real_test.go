package health

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestRealNVML runs the monitor on the host's own GPUs; it is skipped where there is no NVIDIA
// driver (CI), and is how the adapter is checked against a real driver.
func TestRealNVML(t *testing.T) {
	m, err := NewMonitor(NewNVML(nvml.New()), MonitorConfig{PollInterval: 100 * time.Millisecond}, nil)
	if errors.Is(err, ErrNoNVML) {
		t.Skipf("no NVML here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if m.events == nil {
		t.Log("no GPU supports NVML events here; polling only")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	time.Sleep(2 * time.Second) // several polls and event waits (timeouts) on the real driver
	gpus := m.Snapshot()
	if len(gpus) == 0 {
		t.Fatal("NVML initialised but sees no GPU")
	}
	indices := make([]int, len(gpus))
	for i, g := range gpus {
		indices[i] = g.Index
		t.Logf("%+v", g)
		if g.UUID == "" || g.Name == "" || g.MemoryTotalBytes == 0 || g.TemperatureC == 0 || g.TemperatureLimitC == 0 {
			t.Errorf("GPU %d: missing figures: %+v", g.Index, g)
		}
	}
	if err := m.Check(indices...); err != nil {
		t.Errorf("Check on a quiet host: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run (closing NVML): %v", err)
	}
}
