package staged

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/goccy/go-yaml"
)

// Manifest describes a staged (LM → flow → vocoder) pipeline; docs/pipeline.md is its contract.
type Manifest struct {
	Kind       string            `yaml:"kind"`
	Name       string            `yaml:"name"`
	SampleRate int               `yaml:"sample_rate"`
	DType      string            `yaml:"dtype"`
	Voices     []string          `yaml:"voices"`
	Tokenizer  TokenizerSpec     `yaml:"tokenizer"`
	LM         LMSpec            `yaml:"lm"`
	Flow       FlowSpec          `yaml:"flow"`
	Vocoder    VocoderSpec       `yaml:"vocoder"`
	Streaming  StreamingSpec     `yaml:"streaming"`
	Names      map[string]string `yaml:"names"`

	// Dir is the manifest's folder; stage files are relative to it.
	Dir  string `yaml:"-"`
	File string `yaml:"-"`
}

// TokenizerSpec declares how text becomes LM input ids.
type TokenizerSpec struct {
	Type   string `yaml:"type"`
	Offset int64  `yaml:"offset"`
	BOS    int64  `yaml:"bos"`
}

// LMSpec describes the autoregressive LM graph.
type LMSpec struct {
	File              string  `yaml:"file"`
	Layers            int     `yaml:"layers"`
	KVHeads           int     `yaml:"kv_heads"`
	HeadDim           int     `yaml:"head_dim"`
	SpeechVocab       int     `yaml:"speech_vocab"`
	SpeechTokenOffset int64   `yaml:"speech_token_offset"`
	SOS               int64   `yaml:"sos"`
	TokenRate         float64 `yaml:"token_rate"`
	MinTokensPerChar  float64 `yaml:"min_tokens_per_char"`
	MaxTokensPerChar  float64 `yaml:"max_tokens_per_char"`
	MaxTokens         int     `yaml:"max_tokens"`
	// Cache is the key/value cache's contract: "concat" (the graph returns past + new) or
	// "shared" (one buffer per layer of MaxPositions positions per sequence, written in place).
	Cache        string `yaml:"cache"`
	MaxPositions int    `yaml:"max_positions"`
}

// FlowSpec describes the flow-matching encoder and estimator.
type FlowSpec struct {
	Encoder   string `yaml:"encoder"`
	Estimator string `yaml:"estimator"`
	// Step is a graph of one whole Euler step, guidance included (docs/pipeline.md); when given,
	// the engine runs it instead of the estimator, keeping the sample on the device.
	Step           string  `yaml:"step"`
	MelBins        int     `yaml:"mel_bins"`
	FramesPerToken int     `yaml:"frames_per_token"`
	Steps          int     `yaml:"steps"`
	CFGStrength    float32 `yaml:"cfg_strength"`
	// MaxBatchFrames is the most padded frames (items × frames) one flow run may carry; 0: not
	// stated. It is the graphs' limit, which only their author knows: ONNX Runtime's CUDA
	// kernels index with 32-bit integers, and a run whose largest intermediate passes 2^31
	// values is an illegal memory access that kills the process. The engine's batches stay
	// under it; a larger run is refused with an error.
	MaxBatchFrames int `yaml:"max_batch_frames"`
}

// VocoderSpec describes the mel → audio graph.
type VocoderSpec struct {
	File string `yaml:"file"`
	Hop  int    `yaml:"hop"`
}

// StreamingSpec sets the chunk schedule.
type StreamingSpec struct {
	ChunkTokens   []int `yaml:"chunk_tokens"`
	ContextTokens int   `yaml:"context_tokens"`
}

// LoadManifest reads and checks a manifest; every error names the file.
func LoadManifest(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pipeline manifest: %w", err)
	}
	var m Manifest
	if err := yaml.UnmarshalWithOptions(data, &m, yaml.DisallowUnknownField(), yaml.Strict()); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %s", path, yaml.FormatError(err, false, true))
	}
	m.File = path
	m.Dir = filepath.Dir(path)
	m.defaults()
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %w", path, err)
	}
	return &m, nil
}

func (m *Manifest) defaults() {
	if m.Kind == "" {
		m.Kind = "staged"
	}
	if m.DType == "" {
		m.DType = "float32"
	}
	if len(m.Voices) == 0 {
		m.Voices = []string{"default"}
	}
	if m.Tokenizer.Type == "" {
		m.Tokenizer.Type = "bytes"
	}
	if m.LM.MaxTokens == 0 {
		m.LM.MaxTokens = 4000
	}
	if m.LM.Cache == "" {
		m.LM.Cache = "concat"
	}
	if m.Flow.FramesPerToken == 0 {
		m.Flow.FramesPerToken = 2
	}
	if len(m.Streaming.ChunkTokens) == 0 {
		m.Streaming.ChunkTokens = []int{10, 25, 50}
	}
}

func (m *Manifest) validate() error {
	var errs []error
	need := func(ok bool, key, msg string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s", key, msg))
		}
	}
	need(m.Kind == "staged", "kind", fmt.Sprintf("%q is not supported (want staged)", m.Kind))
	need(m.Name != "", "name", "is required")
	need(m.SampleRate > 0, "sample_rate", "must be positive")
	need(m.DType == "float32" || m.DType == "float16", "dtype", fmt.Sprintf("%q is not float32 or float16", m.DType))
	need(m.Tokenizer.Type == "bytes", "tokenizer.type", fmt.Sprintf("%q is not supported (want bytes)", m.Tokenizer.Type))
	need(m.LM.Layers > 0, "lm.layers", "must be positive")
	need(m.LM.KVHeads > 0, "lm.kv_heads", "must be positive")
	need(m.LM.HeadDim > 0, "lm.head_dim", "must be positive")
	need(m.LM.SpeechVocab > 0, "lm.speech_vocab", "must be positive")
	need(m.LM.MaxTokensPerChar > 0, "lm.max_tokens_per_char", "must be positive")
	need(m.LM.MinTokensPerChar >= 0 && m.LM.MinTokensPerChar <= m.LM.MaxTokensPerChar, "lm.min_tokens_per_char", "must be between 0 and lm.max_tokens_per_char")
	need(m.LM.MaxTokens > 0, "lm.max_tokens", "must be positive")
	need(m.LM.Cache == "concat" || m.LM.Cache == "shared", "lm.cache", fmt.Sprintf("%q is not concat or shared", m.LM.Cache))
	need(m.LM.Cache != "shared" || m.LM.MaxPositions > 1, "lm.max_positions", "must be more than 1 with lm.cache: shared")
	need(m.LM.Cache == "shared" || m.LM.MaxPositions == 0, "lm.max_positions", "applies only to lm.cache: shared")
	need(m.Flow.MelBins > 0, "flow.mel_bins", "must be positive")
	need(m.Flow.Steps > 0, "flow.steps", "must be positive")
	need(m.Flow.FramesPerToken > 0, "flow.frames_per_token", "must be positive")
	need(m.Flow.CFGStrength >= 0, "flow.cfg_strength", "must not be negative")
	if mf := m.Flow.MaxBatchFrames; mf != 0 && m.Flow.FramesPerToken > 0 {
		// The longest chunk with its context has to fit in a run on its own.
		longest := m.alignTokens(slices.Max(m.Streaming.ChunkTokens)+max(m.Streaming.ContextTokens, 0)) * m.Flow.FramesPerToken
		need(mf >= longest, "flow.max_batch_frames", fmt.Sprintf("%d is less than the longest chunk with its context, %d frames padded (streaming.chunk_tokens, streaming.context_tokens)", mf, longest))
	}
	need(m.Vocoder.Hop > 0, "vocoder.hop", "must be positive")
	need(m.Streaming.ContextTokens >= 0, "streaming.context_tokens", "must not be negative")
	for _, c := range m.Streaming.ChunkTokens {
		need(c > 0, "streaming.chunk_tokens", "every chunk must be at least one token")
	}
	need(m.Flow.Estimator != "" || m.Flow.Step != "", "flow.estimator", "is required (or flow.step)")
	files := map[string]string{"lm.file": m.LM.File, "flow.encoder": m.Flow.Encoder, "vocoder.file": m.Vocoder.File}
	for key, f := range map[string]string{"flow.estimator": m.Flow.Estimator, "flow.step": m.Flow.Step} {
		if f != "" {
			files[key] = f
		}
	}
	for key, f := range files {
		if f == "" {
			errs = append(errs, fmt.Errorf("%s: is required", key))
			continue
		}
		if _, err := os.Stat(m.Path(f)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

// Path resolves a stage file relative to the manifest.
func (m *Manifest) Path(f string) string {
	if filepath.IsAbs(f) {
		return f
	}
	return filepath.Join(m.Dir, f)
}

// Tensor returns the graph's name for a contract tensor name, honouring `names:` renames.
func (m *Manifest) Tensor(name string) string {
	if n, ok := m.Names[name]; ok {
		return n
	}
	return name
}

// flowBatchFits says why a flow run of b items of up to n tokens cannot run, if it cannot: its
// padded frames pass flow.max_batch_frames.
func (m *Manifest) flowBatchFits(b, n int) error {
	mf := m.Flow.MaxBatchFrames
	if frames := b * m.alignTokens(n) * m.Flow.FramesPerToken; mf > 0 && frames > mf {
		return fmt.Errorf("a flow run of %d items of %d tokens is %d padded frames, more than the manifest's flow.max_batch_frames (%d) allows in one run", b, n, frames, mf)
	}
	return nil
}

// ChunkSize is the number of speech tokens in chunk i of a stream.
func (m *Manifest) ChunkSize(i int) int {
	c := m.Streaming.ChunkTokens
	if i < len(c) {
		return c[i]
	}
	return c[len(c)-1]
}

// alignTokens rounds a length in tokens up to whole runs of 8 frames: ONNX Runtime's fused
// attention with a bias (float16) needs the length aligned to 8, and falls back to materialising
// the scores otherwise. The extra frames are padding like any other.
func (m *Manifest) alignTokens(n int) int {
	for n*m.Flow.FramesPerToken%8 != 0 {
		n++
	}
	return n
}
