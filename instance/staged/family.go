package staged

import (
	"context"
	"fmt"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Family serves staged (LM → flow → vocoder) pipelines: a manifest whose kind is staged.
type Family struct{}

var (
	_ instance.Family         = Family{}
	_ instance.VoiceExtractor = (*Engine)(nil)
	_ instance.VoiceExtractor = (*replicas)(nil)
)

// Claims takes any path that is not another family's: the manifest's own checks then say what is
// wrong with it.
func (Family) Claims(string) bool { return true }

// Describe reads and checks the manifest at path.
func (Family) Describe(path string) (tts.Description, error) {
	m, err := LoadManifest(path)
	if err != nil {
		return tts.Description{}, err
	}
	return m.description(), nil
}

// Open loads the pipeline and starts its engine(s).
func (Family) Open(cfg tts.LoadConfig) (instance.Runner, tts.Description, error) {
	m, err := LoadManifest(cfg.Manifest)
	if err != nil {
		return nil, tts.Description{}, err
	}
	r, err := open(m, cfg)
	if err != nil {
		return nil, tts.Description{}, err
	}
	return r, m.description(), nil
}

func (m *Manifest) description() tts.Description {
	_, instruct := m.instructText("")
	return tts.Description{Kind: m.Kind, Name: m.Name, SampleRate: m.SampleRate, Voices: m.Voices,
		Instructions: instruct, Cloning: m.VoiceEncoder != nil}
}

// open places the pipeline on the visible GPUs: split puts the LM on device 0 and flow and
// vocoder on device 1; replicated runs a whole pipeline (and engine) on every device.
func open(m *Manifest, cfg tts.LoadConfig) (instance.Runner, error) {
	devices := 1
	if cfg.Provider == "cuda" {
		devices = max(1, len(ort.CUDADevices())) // with none, device 0 fails with ONNX Runtime's own reason
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
	return newReplicas(engines), nil
}

// synthesizer is what replicas spread requests over: an Engine, or a fake in tests.
type synthesizer interface {
	Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error
	Stats() []tts.StageStats
	FirstAudio() []FirstAudio
	Close() error
}

// replicas spreads requests over one engine per GPU, to the least loaded.
type replicas struct {
	*engine.Replicas[synthesizer]
}

func newReplicas[S synthesizer](engines []S) *replicas {
	all := make([]synthesizer, len(engines))
	for i, e := range engines {
		all[i] = e
	}
	return &replicas{engine.NewReplicas(all)}
}

// FirstAudio gathers every engine's first-audio figures since the last call.
func (r *replicas) FirstAudio() []FirstAudio {
	var out []FirstAudio
	for _, e := range r.Engines {
		out = append(out, e.FirstAudio()...)
	}
	return out
}

// ExtractVoice makes a voice with the first engine's pipeline, the one that holds the voice
// encoder (loadPipeline).
func (r *replicas) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	x, ok := r.Engines[0].(instance.VoiceExtractor)
	if !ok {
		return tts.VoicePrompt{}, tts.Invalid("this model does not make voices from reference audio")
	}
	return x.ExtractVoice(ctx, clip)
}
