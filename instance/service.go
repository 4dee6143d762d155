package instance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Service is the instance process's side of the router contract: it loads one pipeline and runs
// requests on its engine, refusing more than max_inflight at once.
type Service struct {
	mu       sync.Mutex
	e        Runner
	info     Info
	slots    chan struct{}
	inflight atomic.Int64
	env      func(string) string
	stop     chan struct{}
}

// statser is a Runner that reports per-stage statistics (the staged engine).
type statser interface {
	Stats() []StageStats
}

// firstAudioer is a Runner that reports where its requests' first audio spent its time.
type firstAudioer interface {
	FirstAudio() []FirstAudio
}

// firstAudioSummary gives the median and 95th percentile of each part of the time to first audio
// and of their sum, in ms.
func firstAudioSummary(fa []FirstAudio) string {
	parts := []struct {
		name string
		of   func(FirstAudio) time.Duration
	}{
		{"total", func(f FirstAudio) time.Duration { return f.Prefill + f.Decode + f.Flow + f.Vocoder }},
		{"prefill", func(f FirstAudio) time.Duration { return f.Prefill }},
		{"decode", func(f FirstAudio) time.Duration { return f.Decode }},
		{"flow", func(f FirstAudio) time.Duration { return f.Flow }},
		{"vocoder", func(f FirstAudio) time.Duration { return f.Vocoder }},
	}
	out := fmt.Sprintf("n=%d p50/p95_ms", len(fa))
	ds := make([]time.Duration, len(fa))
	for _, p := range parts {
		for i, f := range fa {
			ds[i] = p.of(f)
		}
		slices.Sort(ds)
		q := func(x float64) float64 { return float64(ds[int(x*float64(len(ds)-1)+0.5)].Microseconds()) / 1000 }
		out += fmt.Sprintf(" %s=%.0f/%.0f", p.name, q(0.5), q(0.95))
	}
	return out
}

// logStats writes the engine's per-stage figures every interval while it is busy: where the
// time goes (the profile behind the benchmark reports).
func logStats(r statser, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := map[string]StageStats{}
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		var attrs []any
		for _, d := range r.Stats() {
			p := last[d.Stage]
			last[d.Stage] = d
			runs := d.Batches - p.Batches
			if runs == 0 {
				continue
			}
			busy := d.Busy - p.Busy
			line := fmt.Sprintf("runs=%d mean_batch=%.1f busy=%.0f%% mean_run_ms=%.1f",
				runs, float64(d.Items-p.Items)/float64(runs), 100*busy.Seconds()/interval.Seconds(),
				float64(busy.Milliseconds())/float64(runs))
			if d.Wait > 0 {
				// Little's law: the items' summed wait over the window's length is the mean queue.
				line += fmt.Sprintf(" mean_waiting=%.1f", (d.Wait-p.Wait).Seconds()/interval.Seconds())
			}
			attrs = append(attrs, d.Stage, line)
		}
		if f, ok := r.(firstAudioer); ok {
			if fa := f.FirstAudio(); len(fa) > 0 {
				attrs = append(attrs, "first_audio", firstAudioSummary(fa))
			}
		}
		if len(attrs) > 0 {
			slog.Info("engine stats", attrs...)
		}
	}
}

// NewService makes an empty service; getenv is how it reads what the router set in its environment.
func NewService(getenv func(string) string) *Service { return &Service{env: getenv} }

// Load loads the pipeline; an instance loads exactly one.
func (s *Service) Load(_ context.Context, cfg LoadConfig) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		return Info{}, errors.New("instance already loaded")
	}
	r, desc, err := Open(cfg)
	if err != nil {
		return Info{}, err
	}
	n := cfg.MaxInflight
	if n <= 0 {
		n = 16
	}
	s.e, s.slots, s.stop = r, make(chan struct{}, n), make(chan struct{})
	if st, ok := r.(statser); ok {
		go logStats(st, 10*time.Second, s.stop)
	}
	s.info = Info{
		Model:              desc.Name,
		SampleRate:         desc.SampleRate,
		Voices:             desc.Voices,
		Provider:           cfg.Provider,
		CUDAVisibleDevices: s.env("CUDA_VISIBLE_DEVICES"),
		PID:                os.Getpid(),
		GPUs:               CUDADevices(),
	}
	return s.info, nil
}

func (s *Service) engine() Runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e
}

// Synthesize runs one request.
func (s *Service) Synthesize(ctx context.Context, req Request, emit func(Chunk) error) error {
	e := s.engine()
	if e == nil {
		return &Error{Kind: ErrNotReady, Msg: "instance has no pipeline loaded"}
	}
	select {
	case s.slots <- struct{}{}:
	default:
		return &Error{Kind: ErrBusy, Msg: fmt.Sprintf("instance is at its max_inflight (%d)", cap(s.slots))}
	}
	defer func() { <-s.slots }()
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	err := e.Synthesize(ctx, req, emit)
	if errors.Is(err, ErrEmptyText) {
		return &Error{Kind: ErrInvalid, Msg: err.Error()}
	}
	return err
}

// Health reports whether a pipeline is loaded and how busy the instance is.
func (s *Service) Health(context.Context) (Health, error) {
	if s.engine() == nil {
		return Health{Ready: false, Message: "no pipeline loaded"}, nil
	}
	h := Health{Ready: true, Message: "ok", Inflight: int(s.inflight.Load())}
	if st, ok := s.engine().(statser); ok {
		h.Stages = st.Stats()
	}
	return h, nil
}

// Close stops the engine and frees the pipeline.
func (s *Service) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e == nil {
		return nil
	}
	close(s.stop)
	err := s.e.Close()
	s.e = nil
	return err
}
