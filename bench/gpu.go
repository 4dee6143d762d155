package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// GPUSample is one reading of one GPU.
type GPUSample struct {
	Index           int
	MemoryUsedBytes uint64
	// UtilizationPct is the share of time the GPU was busy, 0 to 100; NaN when unknown.
	UtilizationPct float64
}

// GPUSampler reads the current state of the GPUs a benchmark target runs on. main passes a local
// NVML sampler when it has one; servers that export their own GPU gauges are read through
// MetricsSampler instead.
type GPUSampler interface {
	Sample(ctx context.Context) ([]GPUSample, error)
}

// Gauges a server may expose on GET /metrics (Prometheus text format), one series per GPU with
// the GPU's index in the label GPULabel.
const (
	MetricGPUMemoryUsed  = "voxmux_gpu_memory_used_bytes"
	MetricGPUUtilization = "voxmux_gpu_utilization_ratio" // 0 to 1
	GPULabel             = "gpu"
)

// ErrNoGPUMetrics means the server's /metrics has neither GPU gauge.
var ErrNoGPUMetrics = errors.New("no " + MetricGPUMemoryUsed + " or " + MetricGPUUtilization + " gauges")

// MetricsSampler reads GPU gauges from a server's /metrics endpoint.
type MetricsSampler struct {
	Client *http.Client
	URL    string // the server's base URL; /metrics is appended
}

// Sample fetches and parses /metrics once.
func (m *MetricsSampler) Sample(ctx context.Context) ([]GPUSample, error) {
	families, err := m.families(ctx)
	if err != nil {
		return nil, err
	}
	return gpuSamplesFrom(families)
}

// families fetches and parses /metrics.
func (m *MetricsSampler) families(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(m.URL, "/")+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("metrics request: %w", err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := m.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", req.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("get %s: HTTP %d", req.URL, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", req.URL, err)
	}
	return families, nil
}

func gpuSamplesFrom(families map[string]*dto.MetricFamily) ([]GPUSample, error) {
	mem, util := families[MetricGPUMemoryUsed], families[MetricGPUUtilization]
	if mem == nil && util == nil {
		return nil, ErrNoGPUMetrics
	}
	byIndex := map[int]*GPUSample{}
	get := func(m *dto.Metric, pos int) (*GPUSample, error) {
		idx := pos
		for _, l := range m.GetLabel() {
			// voxmux's health collector labels the GPU "index"; the baseline server says "gpu".
			if l.GetName() == GPULabel || l.GetName() == "index" {
				n, err := strconv.Atoi(l.GetValue())
				if err != nil {
					return nil, fmt.Errorf("label %s=%q is not a GPU index", GPULabel, l.GetValue())
				}
				idx = n
			}
		}
		s := byIndex[idx]
		if s == nil {
			s = &GPUSample{Index: idx, UtilizationPct: math.NaN()}
			byIndex[idx] = s
		}
		return s, nil
	}
	if mem != nil {
		for i, m := range mem.GetMetric() {
			s, err := get(m, i)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", MetricGPUMemoryUsed, err)
			}
			s.MemoryUsedBytes = uint64(max(0, gaugeValue(m)))
		}
	}
	if util != nil {
		for i, m := range util.GetMetric() {
			s, err := get(m, i)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", MetricGPUUtilization, err)
			}
			s.UtilizationPct = 100 * gaugeValue(m)
		}
	}
	out := make([]GPUSample, 0, len(byIndex))
	for _, s := range byIndex {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// gaugeValue reads a series whether the server typed it as a gauge or left it untyped.
func gaugeValue(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetUntyped().GetValue()
}

// GPUStat summarises one GPU over one concurrency level.
type GPUStat struct {
	Index           int    `json:"index"`
	PeakMemoryBytes uint64 `json:"peak_memory_bytes"`
	MeanUtilPct     Value  `json:"mean_utilization_pct"` // NaN (null in JSON) when never reported
	Samples         int    `json:"samples"`
}

// gpuRecorder samples a GPUSampler at a fixed interval while a level runs.
type gpuRecorder struct {
	sampler  GPUSampler
	interval time.Duration

	mu      sync.Mutex
	stats   map[int]*gpuAcc
	errs    int
	lastErr error

	stop chan struct{}
	done chan struct{}
}

type gpuAcc struct {
	peak    uint64
	utilSum float64
	utilN   int
	samples int
}

func startGPURecorder(ctx context.Context, s GPUSampler, interval time.Duration) *gpuRecorder {
	r := &gpuRecorder{sampler: s, interval: interval, stats: map[int]*gpuAcc{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if s == nil {
		close(r.done)
		return r
	}
	// One reading at the start and one at the end make every level have at least two, however
	// short it is.
	r.sample(ctx)
	go func() {
		defer close(r.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				r.sample(ctx)
				return
			case <-ctx.Done():
				return
			case <-t.C:
				r.sample(ctx)
			}
		}
	}()
	return r
}

func (r *gpuRecorder) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(r.interval, time.Second))
	defer cancel()
	samples, err := r.sampler.Sample(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs++
		r.lastErr = err
		return
	}
	for _, s := range samples {
		a := r.stats[s.Index]
		if a == nil {
			a = &gpuAcc{}
			r.stats[s.Index] = a
		}
		a.samples++
		a.peak = max(a.peak, s.MemoryUsedBytes)
		if !math.IsNaN(s.UtilizationPct) {
			a.utilSum += s.UtilizationPct
			a.utilN++
		}
	}
}

// finish stops sampling and returns the per-GPU summary, with the last sampling error if every
// sample failed.
func (r *gpuRecorder) finish() ([]GPUStat, error) {
	if r.sampler != nil {
		close(r.stop)
	}
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]GPUStat, 0, len(r.stats))
	for idx, a := range r.stats {
		st := GPUStat{Index: idx, PeakMemoryBytes: a.peak, MeanUtilPct: Value(math.NaN()), Samples: a.samples}
		if a.utilN > 0 {
			st.MeanUtilPct = Value(a.utilSum / float64(a.utilN))
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	if len(out) == 0 && r.lastErr != nil {
		return nil, fmt.Errorf("%d GPU samples failed: %w", r.errs, r.lastErr)
	}
	return out, nil
}
