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
}

// Describe reads the model at path (without loading any graph) and checks it can be served.
func Describe(path string) (Description, error) {
	m, err := LoadManifest(path)
	if err != nil {
		return Description{}, err
	}
	return Description{Kind: m.Kind, Name: m.Name, SampleRate: m.SampleRate, Voices: m.Voices}, nil
}

// Open loads the model named by cfg.Manifest and returns its runner.
func Open(cfg LoadConfig) (Runner, Description, error) {
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
