package instance

import (
	"context"
	"fmt"
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
	return Description{Kind: m.Kind, Name: m.Name, SampleRate: m.SampleRate, Voices: m.Voices}, nil
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
	d, err := Describe(cfg.Manifest)
	if err != nil {
		return nil, Description{}, err
	}
	switch d.Kind {
	case "staged":
		p, err := LoadPipeline(cfg)
		if err != nil {
			return nil, Description{}, err
		}
		return NewEngine(p), d, nil
	}
	return nil, Description{}, fmt.Errorf("model %s: kind %q cannot be served", cfg.Manifest, d.Kind)
}
