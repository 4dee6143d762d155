package voxcpm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/voxmux/voxmux/instance/manifest"
)

// Kind is the manifest kind this family serves.
const Kind = "voxcpm"

// Manifest is a VoxCPM export's pipeline.yaml (docs/voxcpm.md, "What the export writes").
type Manifest struct {
	Kind       string `yaml:"kind"`
	Name       string `yaml:"name"`
	SampleRate int    `yaml:"sample_rate"`
	// DType is the LM graphs' cache type: float16 or float32.
	DType      string         `yaml:"dtype"`
	PatchSize  int            `yaml:"patch_size"`
	FeatDim    int            `yaml:"feat_dim"`
	ChunkSize  int            `yaml:"chunk_size"`
	DiTHidden  int            `yaml:"dit_hidden"`
	Tokenizer  TokenizerSpec  `yaml:"tokenizer"`
	LM         LMSpec         `yaml:"lm"`
	Generation GenerationSpec `yaml:"generation"`
	Graphs     GraphsSpec     `yaml:"graphs"`
	VAE        VAESpec        `yaml:"vae"`
	// VoiceDir is an optional folder of voices: VoiceDir/NAME/voice.yaml + latents.f32.
	VoiceDir string `yaml:"voices"`

	// Dir is the manifest's folder, which relative paths start from; File is the manifest.
	Dir  string `yaml:"-"`
	File string `yaml:"-"`
	// voices are the export's voices by name; the built-in default (no prompt) is not in it.
	voices map[string]*voice
	// voiceNames are the voices a request may name, default first.
	voiceNames []string
}

// TokenizerSpec is the text tokenizer: a Hugging Face tokenizer.json (Llama-style BPE).
type TokenizerSpec struct {
	File string `yaml:"file"`
	// AudioStart is the id appended after the text; required.
	AudioStart *int64 `yaml:"audio_start"`
	// SplitChinese splits multi-character CJK tokens into single characters, as the reference's
	// tokenizer wrapper does.
	SplitChinese bool `yaml:"split_chinese"`
}

// LMSpec describes the two LMs' caches.
type LMSpec struct {
	Layers         int `yaml:"layers"`
	ResidualLayers int `yaml:"residual_layers"`
	KVHeads        int `yaml:"kv_heads"`
	HeadDim        int `yaml:"head_dim"`
	// MaxPositions is the cache's positions per sequence: the prompt and every patch.
	MaxPositions int `yaml:"max_positions"`
}

// GenerationSpec holds the reference's generation settings.
type GenerationSpec struct {
	Timesteps int     `yaml:"timesteps"`
	CFGValue  float32 `yaml:"cfg_value"`
	// MinLen: a row may stop only after patch index MinLen.
	MinLen int `yaml:"min_len"`
	// MaxLen bounds the patches of a request; LenRatio bounds them to
	// int(target_text_tokens·LenRatio + 10) too.
	MaxLen   int     `yaml:"max_len"`
	LenRatio float64 `yaml:"len_ratio"`
}

// GraphsSpec names the graph files, relative to the manifest.
type GraphsSpec struct {
	Prefill    string `yaml:"prefill"`
	Step       string `yaml:"step"`
	VAEDecoder string `yaml:"vae_decoder"`
	// VAEEncoder is optional: without it the model makes no voices from clips.
	VAEEncoder string `yaml:"vae_encoder"`
}

// VAESpec describes the streaming AudioVAE decoder.
type VAESpec struct {
	// StateSize is the floats of streaming state per stream.
	StateSize int `yaml:"state_size"`
	// ContextPatches are the prompt patches the decoder's state is primed with.
	ContextPatches int `yaml:"context_patches"`
}

// LoadManifest reads and checks a manifest, its voices and its graphs' inputs and outputs
// (read from the files, no graph loaded); every error names the file.
func LoadManifest(path string) (*Manifest, error) {
	var m Manifest
	if err := manifest.Read(path, "voxcpm manifest", &m); err != nil {
		return nil, err
	}
	m.File, m.Dir = path, filepath.Dir(path)
	for _, step := range []func() error{m.validate, m.checkGraphs, m.loadVoices} {
		if err := step(); err != nil {
			return nil, fmt.Errorf("voxcpm manifest %s: %w", path, err)
		}
	}
	return &m, nil
}

func (m *Manifest) validate() error {
	var errs []error
	need := func(ok bool, key, msg string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s", key, msg))
		}
	}
	need(m.Kind == Kind, "kind", fmt.Sprintf("%q is not supported (want %s)", m.Kind, Kind))
	need(m.Name != "", "name", "is required")
	need(m.SampleRate > 0, "sample_rate", "must be positive")
	need(m.DType == "float16" || m.DType == "float32", "dtype", fmt.Sprintf("%q is not float16 or float32", m.DType))
	need(m.PatchSize > 0, "patch_size", "must be positive")
	need(m.FeatDim > 0, "feat_dim", "must be positive")
	need(m.ChunkSize > 0, "chunk_size", "must be positive")
	need(m.DiTHidden > 0, "dit_hidden", "must be positive")
	need(m.Tokenizer.AudioStart != nil, "tokenizer.audio_start", "is required")
	need(m.Tokenizer.AudioStart == nil || *m.Tokenizer.AudioStart >= 0, "tokenizer.audio_start", "must not be negative")
	need(m.LM.Layers > 0, "lm.layers", "must be positive")
	need(m.LM.ResidualLayers > 0, "lm.residual_layers", "must be positive")
	need(m.LM.KVHeads > 0, "lm.kv_heads", "must be positive")
	need(m.LM.HeadDim > 0, "lm.head_dim", "must be positive")
	need(m.LM.MaxPositions > 1, "lm.max_positions", "must be more than 1")
	g := m.Generation
	need(g.Timesteps > 0, "generation.timesteps", "must be positive")
	need(g.CFGValue > 0, "generation.cfg_value", "must be positive")
	need(g.MinLen >= 0, "generation.min_len", "must not be negative")
	need(g.MaxLen > 0, "generation.max_len", "must be positive")
	need(g.LenRatio > 0, "generation.len_ratio", "must be positive")
	need(m.VAE.StateSize > 0, "vae.state_size", "must be positive")
	need(m.VAE.ContextPatches >= 0, "vae.context_patches", "must not be negative")
	files := map[string]string{"tokenizer.file": m.Tokenizer.File, "graphs.prefill": m.Graphs.Prefill,
		"graphs.step": m.Graphs.Step, "graphs.vae_decoder": m.Graphs.VAEDecoder}
	if m.Graphs.VAEEncoder != "" {
		files["graphs.vae_encoder"] = m.Graphs.VAEEncoder
	}
	for _, key := range sortedKeys(files) {
		f := files[key]
		if f == "" {
			errs = append(errs, fmt.Errorf("%s: is required", key))
			continue
		}
		if _, err := os.Stat(m.Path(f)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	if m.VoiceDir != "" {
		if st, err := os.Stat(m.Path(m.VoiceDir)); err != nil {
			errs = append(errs, fmt.Errorf("voices: %w", err))
		} else if !st.IsDir() {
			errs = append(errs, fmt.Errorf("voices: %s is not a folder", m.Path(m.VoiceDir)))
		}
	}
	return errors.Join(errs...)
}

// Path resolves a file named by the manifest.
func (m *Manifest) Path(f string) string {
	if filepath.IsAbs(f) {
		return f
	}
	return filepath.Join(m.Dir, f)
}

// patchFloats is the floats of one patch: patch_size frames of feat_dim values.
func (m *Manifest) patchFloats() int { return m.PatchSize * m.FeatDim }

// patchSamples is the audio samples of one patch.
func (m *Manifest) patchSamples() int { return m.PatchSize * m.ChunkSize }
