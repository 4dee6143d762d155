package instance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

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
	// Name is the family's name, the Kind of the descriptions it gives ("staged", "piper",
	// "voxcpm").
	Name() string
	// OptionKeys are the keys of the family's `engine:` section, its own options.
	OptionKeys() []string
	// ParseOptions parses and checks a group's `engine:` section into the family's own Options,
	// which it returns; an error about one key is a *tts.OptionError naming it. The config loading
	// calls it (through Families.CheckOptions) so a bad option names its line; Open parses
	// cfg.Engine the same way.
	ParseOptions(section tts.EngineSection) (any, error)
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
	if err := notAModel(path); err != nil {
		return nil, err
	}
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

// CheckOptions parses a group's `engine:` section with the family that serves the model at path.
// A key of another family is refused naming that family; an error about one key is a
// *tts.OptionError naming it.
func (fs Families) CheckOptions(path string, section tts.EngineSection) error {
	f, err := fs.of(path)
	if err != nil {
		return err
	}
	fields, err := section.Fields()
	if err != nil {
		return err
	}
	own := f.OptionKeys()
	for _, kv := range fields {
		if slices.Contains(own, kv.Key) {
			continue
		}
		if other := fs.OptionFamily(kv.Key); other != "" {
			return &tts.OptionError{Key: kv.Key, Msg: fmt.Sprintf("%s is an option of the %s family; this model (%s) is served by the %s family",
				kv.Key, other, path, f.Name())}
		}
		return &tts.OptionError{Key: kv.Key, Msg: fmt.Sprintf("unknown key; the %s family's keys are %s", f.Name(), strings.Join(own, ", "))}
	}
	_, err = f.ParseOptions(section)
	return err
}

// OptionFamily names the families that have the engine option key, joined by "/" (as
// "voxcpm/staged"), "" when none has it.
func (fs Families) OptionFamily(key string) string {
	var names []string
	for _, f := range fs {
		if slices.Contains(f.OptionKeys(), key) {
			names = append(names, f.Name())
		}
	}
	return strings.Join(names, "/")
}

// notAModel explains the folders users point model: at that no family serves as they are: an
// export folder (its manifest is the model) and a published checkpoint directory (exported first).
// Without it, the Piper family, which serves a folder of voices, would answer with a Piper error.
func notAModel(path string) error {
	if st, err := os.Stat(path); err != nil || !st.IsDir() {
		return nil
	}
	has := func(names ...string) bool {
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(path, n)); err != nil {
				return false
			}
		}
		return true
	}
	switch {
	case has("pipeline.yaml"):
		return fmt.Errorf("model %s is an export folder: name its manifest, %s", path, filepath.Join(path, "pipeline.yaml"))
	case has("cosyvoice3.yaml", "llm.pt"):
		return fmt.Errorf("model %s is CosyVoice3's published directory, which voxmux serves once exported: "+
			"/usr/bin/python3 -m scripts.cosyvoice3.export %s OUT, then model: OUT/pipeline.yaml (docs/cosyvoice3.md)", path, path)
	case has("audiovae.pth", "config.json"):
		return fmt.Errorf("model %s is VoxCPM's published directory, which voxmux serves once exported: "+
			"/usr/bin/python3 -m scripts.voxcpm.export %s OUT, then model: OUT/pipeline.yaml (docs/voxcpm.md)", path, path)
	}
	return nil
}
