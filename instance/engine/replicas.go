package engine

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/voxmux/voxmux/tts"
)

// Replica is one copy of a model's engine, on one GPU.
type Replica interface {
	Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error
	Report() Report
	Close() error
}

// voiceExtractor is a Replica whose model makes voices from reference clips.
type voiceExtractor interface {
	ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error)
}

// Replicas spreads requests over one engine per GPU, each to the one with the fewest requests
// under way, and reports for all of them as one engine. Every family that runs on several GPUs
// uses it, so none reports less for a replicated group than for one engine.
type Replicas[E Replica] struct {
	// Engines are the replicas, the first the one that holds what runs once per model (a voice
	// encoder).
	Engines []E
	load    []atomic.Int64
}

// NewReplicas spreads requests over engines.
func NewReplicas[E Replica](engines []E) *Replicas[E] {
	return &Replicas[E]{Engines: engines, load: make([]atomic.Int64, len(engines))}
}

// Synthesize runs req on the least loaded engine.
func (r *Replicas[E]) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	best := 0
	for i := range r.Engines {
		if r.load[i].Load() < r.load[best].Load() {
			best = i
		}
	}
	r.load[best].Add(1)
	defer r.load[best].Add(-1)
	return r.Engines[best].Synthesize(ctx, req, emit)
}

// Report adds up the engines' reports (Merge), so that replicas read like a single engine.
func (r *Replicas[E]) Report() Report {
	all := make([]Report, len(r.Engines))
	for i, e := range r.Engines {
		all[i] = e.Report()
	}
	return Merge(all...)
}

// ExtractVoice makes a voice with the first engine, the one that holds what runs once per model
// (its voice encoder).
func (r *Replicas[E]) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	x, ok := any(r.Engines[0]).(voiceExtractor)
	if !ok {
		return tts.VoicePrompt{}, tts.Invalid("this model does not make voices from reference audio")
	}
	return x.ExtractVoice(ctx, clip)
}

// Close closes every engine.
func (r *Replicas[E]) Close() error {
	var errs []error
	for _, e := range r.Engines {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}
