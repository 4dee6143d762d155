package staged

import (
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
	_ instance.Runner         = (*Engine)(nil)
	_ instance.VoiceExtractor = (*Engine)(nil)
	_ instance.VoiceExtractor = (*engine.Replicas[*Engine])(nil)
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
	devices := ort.Devices(cfg.Provider)
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
	return engine.OpenReplicas(devices, func(d int) (*Engine, error) {
		p, err := loadPipeline(m, cfg, d, d)
		if err != nil {
			return nil, err
		}
		return NewEngine(p), nil
	})
}
