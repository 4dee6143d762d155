package staged

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/voxmux/voxmux/tts/promptfile"
)

// Voice is a voice's zero-shot prompt (voice_dir/NAME/voice.yaml): the transcript of a prompt
// clip and the clip's speech tokens go before the LM's text and speech, its mel is the flow's
// condition for the prompt's frames, and its speaker embedding conditions every frame.
type Voice struct {
	Name string
	Text string
	// textIDs are Text's LM input ids (tokenizer.offset added).
	textIDs      []int64
	SpeechTokens []int64
	// Mel is channel-major [mel_bins][frames_per_token·len(SpeechTokens)].
	Mel []float32
	// Embedding is [flow.embedding_dim]; zeros where voice.yaml gives none, nil without
	// flow.embedding_dim.
	Embedding []float32
}

// voice returns the prompt that a request for voice name speaks with: that voice's, or the first
// listed voice's for "" (tts.Request.Voice's rule; requestVoices refuses names the manifest does
// not list). nil: no prompt.
func (m *Manifest) voice(name string) *Voice {
	if name == "" && len(m.Voices) > 0 {
		name = m.Voices[0]
	}
	return m.voices[name]
}

// longestPromptTokens is the most speech tokens any voice's prompt holds.
func (m *Manifest) longestPromptTokens() int {
	n := 0
	for _, v := range m.voices {
		n = max(n, len(v.SpeechTokens))
	}
	return n
}

// promptLens are the voices' prompt lengths in speech tokens, 0 included when some listed
// voice has no prompt.
func (m *Manifest) promptLens() []int {
	seen := map[int]bool{}
	var out []int
	for _, name := range m.Voices {
		n := 0
		if v := m.voices[name]; v != nil {
			n = len(v.SpeechTokens)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		out = []int{0}
	}
	return out
}

// loadVoices loads and checks every listed voice's prompt that voice_dir holds; the tokenizer
// must be loaded.
func (m *Manifest) loadVoices() error {
	if m.VoiceDir == "" {
		return nil
	}
	var errs []error
	for _, name := range m.Voices {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
			errs = append(errs, fmt.Errorf("voices: %q cannot name a folder of voice_dir", name))
			continue
		}
		dir := filepath.Join(m.Path(m.VoiceDir), name)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue // no prompt
		}
		v, err := m.loadVoice(name, dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if m.voices == nil {
			m.voices = map[string]*Voice{}
		}
		m.voices[name] = v
	}
	return errors.Join(errs...)
}

// loadVoice reads dir/voice.yaml and the files it names; every error names the file and key.
func (m *Manifest) loadVoice(name, dir string) (*Voice, error) {
	// The router's voice library writes the same file with keys that record where the voice
	// came from, so one of its folders can be copied into an export; any other key is refused.
	file := filepath.Join(dir, promptfile.YAMLName)
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("voice %s: %w", name, err)
	}
	var f promptfile.File
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.DisallowUnknownField(), yaml.Strict()); err != nil {
		return nil, fmt.Errorf("voice %s: %s: %s", name, file, yaml.FormatError(err, false, true))
	}
	bad := func(key, msg string, args ...any) error {
		return fmt.Errorf("voice %s: %s: %s: %s", name, file, key, fmt.Sprintf(msg, args...))
	}
	if f.Latents != "" {
		return nil, bad("latents", "are a latent-space model's voice; this model's voices are speech_tokens, mel and embedding")
	}
	v := &Voice{Name: name, Text: f.Text, SpeechTokens: f.SpeechTokens}
	for _, id := range m.tok.Encode(f.Text) {
		v.textIDs = append(v.textIDs, id+m.Tokenizer.Offset)
	}
	for i, t := range f.SpeechTokens {
		if t < 0 || t >= int64(m.LM.SpeechVocab) {
			return nil, bad("speech_tokens", "token %d at index %d is outside [0, lm.speech_vocab = %d)", t, i, m.LM.SpeechVocab)
		}
	}
	C, D := m.Flow.MelBins, m.Flow.EmbeddingDim
	if f.MelBins != 0 && f.MelBins != C {
		return nil, bad("mel_bins", "is %d, the model's flow.mel_bins is %d", f.MelBins, C)
	}
	if len(f.SpeechTokens) > 0 && D == 0 {
		// The prompt's mel reaches the flow only through the step graph's cond input.
		return nil, bad("speech_tokens", "a prompt needs flow.embedding_dim > 0 (the flow's cond and embedding inputs)")
	}
	frames := m.Flow.FramesPerToken * len(f.SpeechTokens)
	switch {
	case f.Mel == "" && frames > 0:
		return nil, bad("mel", "is required with speech_tokens")
	case f.Mel != "":
		p := f.Mel
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		mel, err := promptfile.ReadFloats(p)
		if err != nil {
			return nil, bad("mel", "%v", err)
		}
		if len(mel) != frames*C {
			return nil, bad("mel", "%s holds %d floats, want flow.frames_per_token × %d speech tokens × flow.mel_bins = %d", p, len(mel), len(f.SpeechTokens), frames*C)
		}
		v.Mel = frameMajorToChannels(mel, frames, C)
	}
	if D > 0 {
		v.Embedding = make([]float32, D)
	}
	if f.Embedding != "" {
		if D == 0 {
			return nil, bad("embedding", "needs flow.embedding_dim > 0")
		}
		p := f.Embedding
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		emb, err := promptfile.ReadFloats(p)
		if err != nil {
			return nil, bad("embedding", "%v", err)
		}
		if len(emb) != D {
			return nil, bad("embedding", "%s holds %d floats, want flow.embedding_dim = %d", p, len(emb), D)
		}
		v.Embedding = emb
	}
	return v, nil
}

// frameMajorToChannels turns [frames][C] into channel-major [C][frames].
func frameMajorToChannels(x []float32, frames, C int) []float32 {
	out := make([]float32, len(x))
	for f := 0; f < frames; f++ {
		for c := 0; c < C; c++ {
			out[c*frames+f] = x[f*C+c]
		}
	}
	return out
}

// loadFlowNoise reads flow.noise's table.
func (m *Manifest) loadFlowNoise() error {
	if m.Flow.Noise == "" {
		return nil
	}
	t, err := promptfile.ReadFloats(m.Path(m.Flow.Noise))
	if err != nil {
		return fmt.Errorf("flow.noise: %w", err)
	}
	if len(t) == 0 || len(t)%m.Flow.MelBins != 0 {
		return fmt.Errorf("flow.noise: %d floats is not a positive whole number of frames of flow.mel_bins (%d)", len(t), m.Flow.MelBins)
	}
	m.noise = t
	return nil
}
