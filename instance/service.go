package instance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// slotGrace is how long a request that finds every slot taken waits for one (Synthesize).
const slotGrace = time.Second

// Service is the instance process's side of the router contract: it loads one pipeline and runs
// requests on its engine, refusing more than max_inflight at once.
type Service struct {
	families Families
	mu       sync.Mutex
	e        Runner
	info     tts.Info
	slots    chan struct{}
	inflight atomic.Int64
	env      func(string) string
	stop     chan struct{}
	// firstAudio keeps the runner's first-audio figures until logStats summarizes them.
	firstAudio engine.FirstAudios
}

// statsInterval is how often the engine's figures are logged while it is busy.
const statsInterval = 10 * time.Second

// report is the runner's report; its first-audio figures are kept for logStats, whichever call
// (Health or logStats) took them from the runner.
func (s *Service) report(r Runner) Report {
	rep := r.Report()
	s.firstAudio.Add(rep.FirstAudio...)
	return rep
}

// logStats writes the engine's per-stage figures every interval while it is busy: where the
// time goes (the profile behind the benchmark reports).
func (s *Service) logStats(r Runner, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := map[string]tts.StageStats{}
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		var attrs []any
		for _, d := range s.report(r).Stages {
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
		if fa := engine.SummarizeFirstAudio(s.firstAudio.Take()); fa != "" {
			attrs = append(attrs, "first_audio", fa)
		}
		if len(attrs) > 0 {
			slog.Info("engine stats", attrs...)
		}
	}
}

// NewService makes an empty service that loads models of families; getenv is how it reads what
// the router set in its environment.
func NewService(families Families, getenv func(string) string) *Service {
	return &Service{families: families, env: getenv}
}

// Load loads the pipeline; an instance loads exactly one.
func (s *Service) Load(_ context.Context, cfg tts.LoadConfig) (tts.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		return tts.Info{}, errors.New("instance already loaded")
	}
	r, _, err := s.families.Open(cfg)
	if err != nil {
		return tts.Info{}, err
	}
	n := cfg.MaxInflight
	if n <= 0 {
		n = 16
	}
	s.e, s.slots, s.stop = r, make(chan struct{}, n), make(chan struct{})
	go s.logStats(r, statsInterval, s.stop)
	s.info = tts.Info{CUDAVisibleDevices: s.env("CUDA_VISIBLE_DEVICES"), GPUs: ort.CUDADevices()}
	return s.info, nil
}

func (s *Service) engine() Runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e
}

// Synthesize runs one request.
func (s *Service) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	e := s.engine()
	if e == nil {
		return &tts.Error{Kind: tts.ErrNotReady, Msg: "instance has no pipeline loaded"}
	}
	select {
	case s.slots <- struct{}{}:
	default:
		// The router sends no more than max_inflight, but it frees a cancelled request's slot as
		// soon as it cancels, a moment before the cancel reaches this process over gRPC and the
		// request returns here; a request that comes in that moment waits for that slot.
		t := time.NewTimer(slotGrace)
		defer t.Stop()
		select {
		case s.slots <- struct{}{}:
		case <-t.C:
			return &tts.Error{Kind: tts.ErrBusy, Msg: fmt.Sprintf("instance is at its max_inflight (%d)", cap(s.slots))}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer func() { <-s.slots }()
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	return e.Synthesize(ctx, req, emit)
}

// VoiceExtractor is a Runner whose model makes voices from reference clips (tts.Description's
// Cloning).
type VoiceExtractor interface {
	ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error)
}

// ExtractVoice computes a voice prompt from a clip with the loaded model, when it can.
func (s *Service) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	e := s.engine()
	if e == nil {
		return tts.VoicePrompt{}, &tts.Error{Kind: tts.ErrNotReady, Msg: "instance has no pipeline loaded"}
	}
	x, ok := e.(VoiceExtractor)
	if !ok {
		return tts.VoicePrompt{}, tts.Invalid("this model does not make voices from reference audio")
	}
	return x.ExtractVoice(ctx, clip)
}

// Health reports whether a pipeline is loaded and how busy the instance is.
func (s *Service) Health(context.Context) (tts.Health, error) {
	e := s.engine()
	if e == nil {
		return tts.Health{Ready: false, Message: "no pipeline loaded"}, nil
	}
	rep := s.report(e)
	return tts.Health{Ready: true, Message: "ok", Inflight: int(s.inflight.Load()), Stages: rep.Stages, Cancels: rep.Cancels, PromptCache: rep.PromptCache, FlowMemory: rep.FlowMemory}, nil
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
