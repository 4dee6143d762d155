package voxcpm

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/manifest"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
	"github.com/voxmux/voxmux/tts"
)

// Family serves VoxCPM exports: a pipeline.yaml whose kind is voxcpm.
type Family struct{}

var (
	_ instance.Family         = Family{}
	_ instance.Runner         = (*Engine)(nil)
	_ instance.VoiceExtractor = (*Engine)(nil)
	_ instance.VoiceExtractor = (*engine.Replicas[*Engine])(nil)
)

// defaultSlots is the streams an engine takes at once when the group sets no max_inflight (the
// service's own default).
const defaultSlots = 16

// Claims takes a YAML file whose kind is voxcpm, reading nothing else.
func (Family) Claims(path string) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		return manifest.Kind(path) == Kind
	}
	return false
}

// Describe reads and checks the manifest, its voices and its graphs' inputs and outputs.
func (Family) Describe(path string) (tts.Description, error) {
	m, err := LoadManifest(path)
	if err != nil {
		return tts.Description{}, err
	}
	return m.description(), nil
}

func (m *Manifest) description() tts.Description {
	return tts.Description{Kind: m.Kind, Name: m.Name, SampleRate: m.SampleRate, Voices: m.voiceNames,
		Cloning: m.Graphs.VAEEncoder != ""}
}

// Open loads the export on the configured provider: on CUDA, an engine on every visible GPU.
func (Family) Open(cfg tts.LoadConfig) (instance.Runner, tts.Description, error) {
	m, err := LoadManifest(cfg.Manifest)
	if err != nil {
		return nil, tts.Description{}, err
	}
	o, err := parseOptions(cfg.Engine)
	if err != nil {
		return nil, tts.Description{}, err
	}
	if cfg.Placement == "split" {
		return nil, tts.Description{}, errors.New("placement split is not supported by voxcpm models: each GPU runs the whole model (placement replicated)")
	}
	tok, err := loadTokenizer(m)
	if err != nil {
		return nil, tts.Description{}, fmt.Errorf("voxcpm %s: %w", cfg.Manifest, err)
	}
	r, err := engine.OpenReplicas(ort.Devices(cfg.Provider), func(d int) (*Engine, error) {
		return openEngine(m, tok, cfg, o, d)
	})
	if err != nil {
		return nil, tts.Description{}, fmt.Errorf("voxcpm %s: %w", cfg.Manifest, err)
	}
	return r, m.description(), nil
}

// openEngine loads the graphs on device d and starts an engine over them; the engine on device 0
// also makes voices from clips.
func openEngine(m *Manifest, tok tokenizer, cfg tts.LoadConfig, o Options, d int) (*Engine, error) {
	rt, err := ort.New(cfg, d, o.Options)
	if err != nil {
		return nil, err
	}
	if err := iobind.Init(cfg.ORTLibrary); err != nil {
		rt.Close()
		return nil, err
	}
	slots := cmp.Or(max(cfg.MaxInflight, 0), defaultSlots)
	g, err := openWithFallback(o, resolveModes(o, rt.CUDA(), slots), func(modes graphModes) (*graphs, error) {
		return openGraphs(m, rt, slots, modes)
	})
	if err != nil {
		rt.Close()
		return nil, err
	}
	var enc *voiceEncoder
	if m.Graphs.VAEEncoder != "" && d == 0 {
		if enc, err = newVoiceEncoder(m, cfg, o.Options); err != nil {
			g.close()
			rt.Close()
			return nil, err
		}
	}
	e := newEngine(m, tok, g, slots)
	e.enc, e.closeRest = enc, rt.Close
	return e, nil
}

// openWithFallback opens the graphs as modes says. When lm_cuda_graph is unset (captured by default
// on CUDA) and the step's capture check finds a replay unlike a plain run, as an export whose
// step has a kernel that cannot be captured gives, it warns and opens them again with the step
// uncaptured. An lm_cuda_graph set to on keeps the error.
func openWithFallback(o Options, modes graphModes, open func(graphModes) (*graphs, error)) (*graphs, error) {
	g, err := open(modes)
	if err == nil || o.LMCUDAGraph != "" || modes.step != StepGraphOn || modes.captureVAE || !errors.Is(err, errReplayDiffers) {
		return g, err
	}
	slog.Warn("voxcpm: the step's CUDA graphs replay unlike plain runs, so the step runs uncaptured (slower); export the model again with scripts/voxcpm/export.py, or set engine.lm_cuda_graph: off to skip the check", "error", err)
	modes.step = StepGraphOff
	return open(modes)
}
