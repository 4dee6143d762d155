package instance

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// Runner synthesizes requests on a loaded model; each kind of model has its own.
type Runner interface {
	Synthesize(ctx context.Context, req Request, emit func(Chunk) error) error
	Close() error
}

// Description is what the router needs to know of a model before any instance runs it.
type Description struct {
	Kind       string
	Name       string
	SampleRate int
	Voices     []string
	// NativeSpeed is true when the model applies the request's speed itself (piper: through
	// length_scale), so the router must not time-stretch its audio.
	NativeSpeed bool
	// Instructions is true when the model follows a request's "instructions" (no kind served
	// today does; the router drops them for the others).
	Instructions bool
}

// Describe reads the model at path (without loading any graph) and checks it can be served. The
// path is a staged pipeline manifest, or piper voices: an .onnx (with its .onnx.json), an
// .onnx.json, a folder of voices, or a manifest with kind: piper (docs/piper.md).
func Describe(path string) (Description, error) {
	if isPiperPath(path) {
		m, err := loadPiperModel(path)
		if err != nil {
			return Description{}, err
		}
		return m.description(), nil
	}
	m, err := LoadManifest(path)
	if err != nil {
		return Description{}, err
	}
	return m.description(), nil
}

func (m *Manifest) description() Description {
	return Description{Kind: m.Kind, Name: m.Name, SampleRate: m.SampleRate, Voices: m.Voices}
}

// Open loads the model named by cfg.Manifest and returns its runner.
func Open(cfg LoadConfig) (Runner, Description, error) {
	if isPiperPath(cfg.Manifest) {
		r, d, err := openPiper(cfg)
		if err != nil {
			return nil, Description{}, err
		}
		return r, d, nil
	}
	m, err := LoadManifest(cfg.Manifest) // checks that the kind is staged
	if err != nil {
		return nil, Description{}, err
	}
	r, err := openStaged(m, cfg)
	return r, m.description(), err
}

// openStaged places the staged pipeline on the visible GPUs: split puts the LM on device 0 and
// flow and vocoder on device 1; replicated runs a whole pipeline (and engine) on every device.
func openStaged(m *Manifest, cfg LoadConfig) (Runner, error) {
	devices := 1
	if cfg.Provider == "cuda" {
		devices = max(1, len(CUDADevices())) // with none, device 0 fails with ONNX Runtime's own reason
	}
	if cfg.Placement == "split" {
		if devices < 2 {
			return nil, fmt.Errorf("placement split needs 2 visible GPUs, this instance sees %d", devices)
		}
		p, err := loadPipeline(m, cfg, 0, 1)
		if err != nil {
			return nil, err
		}
		return NewEngine(p), nil
	}
	var engines []*Engine
	for d := 0; d < devices; d++ {
		p, err := loadPipeline(m, cfg, d, d)
		if err != nil {
			for _, e := range engines {
				e.Close()
			}
			return nil, fmt.Errorf("device %d: %w", d, err)
		}
		engines = append(engines, NewEngine(p))
	}
	if len(engines) == 1 {
		return engines[0], nil
	}
	return &replicas{engines: engines, load: make([]atomic.Int64, len(engines))}, nil
}

// replicas spreads requests over one engine per GPU, to the least loaded.
type replicas struct {
	engines []*Engine
	load    []atomic.Int64
}

func (r *replicas) Synthesize(ctx context.Context, req Request, emit func(Chunk) error) error {
	best := 0
	for i := range r.engines {
		if r.load[i].Load() < r.load[best].Load() {
			best = i
		}
	}
	r.load[best].Add(1)
	defer r.load[best].Add(-1)
	return r.engines[best].Synthesize(ctx, req, emit)
}

// Stats adds up the engines' stage counters.
func (r *replicas) Stats() []StageStats {
	var out []StageStats
	for _, e := range r.engines {
		for i, st := range e.Stats() {
			if i == len(out) {
				out = append(out, StageStats{Stage: st.Stage})
			}
			out[i].Batches += st.Batches
			out[i].Items += st.Items
			out[i].Busy += st.Busy
		}
	}
	return out
}

func (r *replicas) Close() error {
	var errs []error
	for _, e := range r.engines {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}
