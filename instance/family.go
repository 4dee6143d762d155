package instance

import (
	"context"
	"fmt"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// Runner synthesizes requests on a loaded model; each model family has its own. A runner over
// several GPUs is an engine.Replicas, which reports for them all.
type Runner interface {
	Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error
	// Report is what the runner tells about its work (tts.Health's stages and cancels, the
	// first-audio figures the instance logs); every runner gives one.
	Report() Report
	Close() error
}

// Report is a runner's figures (engine.Report).
type Report = engine.Report

// Family is one kind of model voxmux serves. A new kind of model is a new package implementing
// Family, handed to the service by main; nothing else changes.
type Family interface {
	// Claims reports whether the model at path is of this family, reading as little as it can.
	Claims(path string) bool
	// Describe reads the model at path, without loading any graph, and checks it can be served.
	Describe(path string) (tts.Description, error)
	// Open loads the model named by cfg.Manifest.
	Open(cfg tts.LoadConfig) (Runner, tts.Description, error)
}

// Families are the model families an instance (and the router, for Describe) knows, in the order
// they are asked to claim a path: the first that claims it serves it.
type Families []Family

func (fs Families) of(path string) (Family, error) {
	for _, f := range fs {
		if f.Claims(path) {
			return f, nil
		}
	}
	return nil, fmt.Errorf("model %s: no model family serves it", path)
}

// Describe describes the model at path with the family that claims it.
func (fs Families) Describe(path string) (tts.Description, error) {
	f, err := fs.of(path)
	if err != nil {
		return tts.Description{}, err
	}
	return f.Describe(path)
}

// Open loads the model named by cfg.Manifest with the family that claims it.
func (fs Families) Open(cfg tts.LoadConfig) (Runner, tts.Description, error) {
	f, err := fs.of(cfg.Manifest)
	if err != nil {
		return nil, tts.Description{}, err
	}
	return f.Open(cfg)
}
