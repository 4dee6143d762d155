package voxcpm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
	"github.com/voxmux/voxmux/tts"
)

// Family serves VoxCPM exports: a pipeline.yaml whose kind is voxcpm.
type Family struct{}

var (
	_ instance.Family         = Family{}
	_ instance.Runner         = (*Engine)(nil)
	_ instance.StageStatser   = (*Engine)(nil)
	_ instance.CancelStatser  = (*Engine)(nil)
	_ instance.VoiceExtractor = (*Engine)(nil)
	_ instance.Runner         = (*replicas)(nil)
	_ instance.StageStatser   = (*replicas)(nil)
	_ instance.CancelStatser  = (*replicas)(nil)
	_ instance.VoiceExtractor = (*replicas)(nil)
)

// defaultSlots is the streams an engine takes at once when the group sets no max_inflight (the
// service's own default).
const defaultSlots = 16

// Claims takes a YAML file whose kind is voxcpm, reading nothing else.
func (Family) Claims(path string) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		return kindOf(path) == Kind
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
	devices := 1
	if cfg.Provider == "cuda" {
		devices = max(1, len(ort.CUDADevices())) // with none, device 0 fails with ONNX Runtime's own reason
	}
	var engines []*Engine
	for d := range devices {
		e, err := openEngine(m, tok, cfg, o, d)
		if err != nil {
			for _, e := range engines {
				e.Close()
			}
			return nil, tts.Description{}, fmt.Errorf("voxcpm %s: device %d: %w", cfg.Manifest, d, err)
		}
		engines = append(engines, e)
	}
	if len(engines) == 1 {
		return engines[0], m.description(), nil
	}
	return &replicas{engine.NewReplicas(engines)}, m.description(), nil
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
	g, err := openGraphs(m, rt, slots, resolveModes(o, rt.CUDA()))
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

// replicas spreads requests over one engine per GPU, to the least loaded.
type replicas struct {
	*engine.Replicas[*Engine]
}

func (r *replicas) CancelStats() tts.CancelStats {
	var out tts.CancelStats
	for _, e := range r.Engines {
		c := e.CancelStats()
		out.Count += c.Count
		out.Freeing += c.Freeing
		out.MaxFreeing = max(out.MaxFreeing, c.MaxFreeing)
	}
	return out
}

// ExtractVoice runs on the first engine, the one with the voice encoder.
func (r *replicas) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	return r.Engines[0].ExtractVoice(ctx, clip)
}
