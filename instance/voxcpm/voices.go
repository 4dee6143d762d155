package voxcpm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/voxmux/voxmux/tts"
	"github.com/voxmux/voxmux/tts/promptfile"
)

// defaultVoice is the built-in voice: no prompt.
const defaultVoice = "default"

// voice is a voice prompt: a clip's transcript, which goes before the target text, and its
// AudioVAE latents, which follow audio_start.
type voice struct {
	name string
	text string
	// latents are [patches][patch_size][feat_dim].
	latents []float32
	patches int
}

// loadVoices reads every folder of the voices folder that holds a voice.yaml.
func (m *Manifest) loadVoices() error {
	m.voiceNames = []string{defaultVoice}
	if m.VoiceDir == "" {
		return nil
	}
	dir := m.Path(m.VoiceDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("voices: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		if _, err := os.Stat(filepath.Join(dir, name, promptfile.YAMLName)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if name == defaultVoice {
			errs = append(errs, fmt.Errorf("voices: %s: %q is the built-in voice without a prompt", filepath.Join(dir, name), name))
			continue
		}
		v, err := m.loadVoice(name, filepath.Join(dir, name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if m.voices == nil {
			m.voices = map[string]*voice{}
		}
		m.voices[name] = v
		m.voiceNames = append(m.voiceNames, name)
	}
	slices.Sort(m.voiceNames[1:])
	return errors.Join(errs...)
}

// loadVoice reads dir/voice.yaml, a voice folder in the voice library's format (tts/promptfile),
// and its latents; every error names the file.
func (m *Manifest) loadVoice(name, dir string) (*voice, error) {
	file := filepath.Join(dir, promptfile.YAMLName)
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("voice %s: %w", name, err)
	}
	f, err := promptfile.Parse(data, file)
	if err != nil {
		return nil, fmt.Errorf("voice %s: %w", name, err)
	}
	vp, err := f.Prompt(dir)
	if err == nil {
		var v *voice
		if v, err = m.voiceOf(name, vp); err == nil {
			return v, nil
		}
	}
	return nil, fmt.Errorf("voice %s: %s: %w", name, file, err)
}

// voiceOf checks a voice prompt (an export's voice, a library voice, a cloned clip) against the
// model and makes the voice it speaks in.
func (m *Manifest) voiceOf(name string, vp *tts.VoicePrompt) (*voice, error) {
	if len(vp.Latents) == 0 {
		return nil, fmt.Errorf("it holds no latents: model %s speaks in voices made from its own AudioVAE's latents", m.Name)
	}
	if vp.LatentDim != m.FeatDim {
		return nil, fmt.Errorf("latent_dim: is %d, the model's feat_dim is %d", vp.LatentDim, m.FeatDim)
	}
	PD := m.patchFloats()
	if len(vp.Latents)%PD != 0 {
		return nil, fmt.Errorf("latents: %d values are not a positive whole number of patches of patch_size (%d) × feat_dim (%d)",
			len(vp.Latents), m.PatchSize, m.FeatDim)
	}
	if !utf8.ValidString(vp.Text) {
		return nil, errors.New("its text is not valid UTF-8")
	}
	if strings.TrimSpace(vp.Text) == "" {
		return nil, errors.New("its text is empty: the clip's transcript goes before the target text")
	}
	for i, x := range vp.Latents {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("latent value %d is %v, not a finite number", i, x)
		}
	}
	return &voice{name: name, text: vp.Text, latents: vp.Latents, patches: len(vp.Latents) / PD}, nil
}

// voice is the prompt of the voice called name: nil for the built-in default ("" or its name;
// requestVoice refuses names the export does not have).
func (m *Manifest) voice(name string) *voice { return m.voices[name] }
