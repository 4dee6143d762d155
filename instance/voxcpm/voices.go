package voxcpm

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/goccy/go-yaml"

	"github.com/voxmux/voxmux/tts/voicefile"
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

// voiceFile is voices/NAME/voice.yaml: the export writes text and patches beside latents.f32;
// a voice library's folder (tts/voicefile) names its latents file and their latent_dim instead,
// and records where the voice came from (read and ignored), so one of its folders can be copied
// into an export.
type voiceFile struct {
	Text      string `yaml:"text"`
	Patches   int    `yaml:"patches"`
	Latents   string `yaml:"latents"`
	LatentDim int    `yaml:"latent_dim"`

	Transcript string           `yaml:"transcript"`
	CreatedAt  time.Time        `yaml:"created_at"`
	Consent    string           `yaml:"consent"`
	Source     voicefile.Source `yaml:"source"`
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
		if _, err := os.Stat(filepath.Join(dir, name, voicefile.YAMLName)); errors.Is(err, os.ErrNotExist) {
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

// loadVoice reads dir/voice.yaml and its latents; every error names the file and key.
func (m *Manifest) loadVoice(name, dir string) (*voice, error) {
	file := filepath.Join(dir, voicefile.YAMLName)
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("voice %s: %w", name, err)
	}
	var f voiceFile
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.DisallowUnknownField(), yaml.Strict()); err != nil {
		return nil, fmt.Errorf("voice %s: %s: %s", name, file, yaml.FormatError(err, false, true))
	}
	bad := func(key, msg string, args ...any) error {
		return fmt.Errorf("voice %s: %s: %s: %s", name, file, key, fmt.Sprintf(msg, args...))
	}
	if f.Patches < 0 {
		return nil, bad("patches", "must be positive")
	}
	if f.LatentDim != 0 && f.LatentDim != m.FeatDim {
		return nil, bad("latent_dim", "is %d, the model's feat_dim is %d", f.LatentDim, m.FeatDim)
	}
	lat := cmp.Or(f.Latents, voicefile.LatentsName)
	if filepath.IsAbs(lat) || lat != filepath.Base(lat) {
		return nil, bad("latents", "%q is not a file of the voice's folder", lat)
	}
	latents, err := voicefile.ReadFloats(filepath.Join(dir, lat))
	if err != nil {
		return nil, bad("latents", "%v", err)
	}
	PD := m.patchFloats()
	if len(latents) == 0 || len(latents)%PD != 0 {
		return nil, bad("latents", "%s holds %d floats, not a positive whole number of patches of patch_size (%d) × feat_dim (%d)", lat, len(latents), m.PatchSize, m.FeatDim)
	}
	if f.Patches != 0 && len(latents) != f.Patches*PD {
		return nil, bad("patches", "is %d, but %s holds %d patches", f.Patches, lat, len(latents)/PD)
	}
	v := &voice{name: name, text: f.Text, latents: latents, patches: len(latents) / PD}
	if err := m.checkVoice(v); err != nil {
		return nil, fmt.Errorf("voice %s: %s: %w", name, file, err)
	}
	return v, nil
}

// checkVoice checks what every voice needs, whatever its source.
func (m *Manifest) checkVoice(v *voice) error {
	if !utf8.ValidString(v.text) {
		return errors.New("its text is not valid UTF-8")
	}
	if strings.TrimSpace(v.text) == "" {
		return errors.New("its text is empty: the clip's transcript goes before the target text")
	}
	for i, x := range v.latents {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("latent value %d is %v, not a finite number", i, x)
		}
	}
	return nil
}

// voice is the prompt of the voice called name: nil for the built-in default and for names the
// export does not have (OpenAI's clients send their own voice names).
func (m *Manifest) voice(name string) *voice { return m.voices[name] }
