package staged

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/voxmux/voxmux/instance/manifest"

	"github.com/voxmux/voxmux/instance/text"
)

// DefaultMaxPromptTokens is lm.max_prompt_tokens when a manifest gives none.
const DefaultMaxPromptTokens = 1024

// Manifest describes a staged (LM → flow → vocoder) pipeline; docs/pipeline.md is its contract.
type Manifest struct {
	Kind       string   `yaml:"kind"`
	Name       string   `yaml:"name"`
	SampleRate int      `yaml:"sample_rate"`
	DType      string   `yaml:"dtype"`
	Voices     []string `yaml:"voices"`
	// VoiceDir holds each voice's zero-shot prompt in VoiceDir/NAME/voice.yaml (voice.go); a
	// voice without a folder there, or every voice without VoiceDir, speaks without a prompt.
	VoiceDir  string            `yaml:"voice_dir"`
	Tokenizer TokenizerSpec     `yaml:"tokenizer"`
	Text      TextSpec          `yaml:"text"`
	LM        LMSpec            `yaml:"lm"`
	Flow      FlowSpec          `yaml:"flow"`
	Vocoder   VocoderSpec       `yaml:"vocoder"`
	Streaming StreamingSpec     `yaml:"streaming"`
	Names     map[string]string `yaml:"names"`
	// VoiceEncoder makes voices from reference clips (voiceenc.go); absent: the model speaks in
	// its listed voices and in prompts made elsewhere only.
	VoiceEncoder *VoiceEncoderSpec `yaml:"voice_encoder"`

	// Dir is the manifest's folder; stage files are relative to it.
	Dir  string `yaml:"-"`
	File string `yaml:"-"`
	// tok turns text into ids (tokenizer.type), loaded with the manifest.
	tok textTokenizer
	// voices are the voices' prompts by name (voice_dir), loaded with the manifest; a voice
	// without a prompt is not in it.
	voices map[string]*Voice
	// noise is flow.noise's table, frame-major [frames][mel_bins]; nil: seeded noise.
	noise []float32
}

// TokenizerSpec declares how text becomes LM input ids: "bytes" (a token per UTF-8 byte) or
// "qwen2" (Qwen2's byte-level BPE, from the model's own tokenizer files).
type TokenizerSpec struct {
	Type   string `yaml:"type"`
	Offset int64  `yaml:"offset"`
	BOS    int64  `yaml:"bos"`
	// qwen2: vocab.json, merges.txt and tokenizer_config.json (its added tokens), relative to
	// the manifest, and the name of a set of special tokens the model adds in code
	// ("cosyvoice3"; text.SpecialTokenSets).
	Vocab         string `yaml:"vocab"`
	Merges        string `yaml:"merges"`
	Config        string `yaml:"config"`
	SpecialTokens string `yaml:"special_tokens"`
}

// TextSpec is the text frontend: what happens to a request's text before it is tokenized.
type TextSpec struct {
	// Normalize applies CosyVoice's rule-based normalization (text.Normalize).
	Normalize bool `yaml:"normalize"`
	// Split cuts long text into segments spoken one after another; absent: one segment.
	Split *SplitSpec `yaml:"split"`
}

// SplitSpec sizes segments in prompt tokens (characters for Chinese), as text.SplitSpec.
type SplitSpec struct {
	MaxTokens   int `yaml:"max_tokens"`
	MinTokens   int `yaml:"min_tokens"`
	MergeTokens int `yaml:"merge_tokens"`
}

// SamplingSpec is repetition-aware sampling (CosyVoice's ras_sampling): nucleus sampling over
// the TopK most likely tokens up to probability TopP; a token that already appears in the last
// Window tokens at least Window·TauR times is drawn again from the whole distribution without it.
type SamplingSpec struct {
	TopP   float64 `yaml:"top_p"`
	TopK   int     `yaml:"top_k"`
	Window int     `yaml:"window"`
	TauR   float64 `yaml:"tau_r"`
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
	// Bounds on speech tokens per text token (CosyVoice: 2 and 20); when given they replace
	// the per-character bounds.
	MinTokensPerTextToken float64 `yaml:"min_tokens_per_text_token"`
	MaxTokensPerTextToken float64 `yaml:"max_tokens_per_text_token"`
	MaxTokens             int     `yaml:"max_tokens"`
	// MaxPromptTokens bounds one prompt (one segment's), checked before any work: the LM's
	// prefill memory grows with the square of its prompt.
	MaxPromptTokens int `yaml:"max_prompt_tokens"`
	// Sampling picks speech tokens by repetition-aware sampling from the request's seed;
	// absent: the most likely token (greedy).
	Sampling *SamplingSpec `yaml:"sampling"`
	// Cache is the key/value cache's contract: "concat" (the graph returns past + new) or
	// "shared" (one buffer per layer of MaxPositions positions per sequence, written in place).
	Cache        string `yaml:"cache"`
	MaxPositions int    `yaml:"max_positions"`
	// EndOfPrompt (an LM input id; 0: none) must appear in a prompt's text: an LM trained with
	// it (CosyVoice3) gets DefaultPromptText before the segment's text when neither the voice's
	// text nor the segment's holds it.
	EndOfPrompt       int64  `yaml:"endofprompt"`
	DefaultPromptText string `yaml:"default_prompt_text"`
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
	// EmbeddingDim > 0: the step graph also reads the voice's prompt mel (cond) and speaker
	// embedding (embedding); flow.step is then required.
	EmbeddingDim int `yaml:"embedding_dim"`
	// LookaheadTokens are the tokens after a non-last chunk that the encoder reads; their frames
	// are masked off and dropped.
	LookaheadTokens int `yaml:"lookahead_tokens"`
	// Schedule is the Euler steps' times: linear (t_k = k/steps) or cosine (t_k = 1 − cos(k/steps·π/2)).
	Schedule string `yaml:"schedule"`
	// Noise is a fixed table of starting samples, float32 [frames][mel_bins] (flowNoise); empty:
	// seeded noise.
	Noise string `yaml:"noise"`
	// ChunkStep is the chunk-causal step graph (docs/cosyvoice3.md, "Chunk-causal flow"): one
	// guided Euler step over new frames under CosyVoice's streaming mask of ChunkFrames-frame
	// chunks, reading the keys and values of every earlier frame (past_kv [B,P,kv_layers,4,
	// kv_width]) and ConvContextFrames frames of context before the new ones, and returning the
	// new frames' keys and values (present_kv). Checked at load; chunkFlow runs it.
	ChunkStep         string `yaml:"chunk_step"`
	ChunkFrames       int    `yaml:"chunk_frames"`
	ConvContextFrames int    `yaml:"conv_context_frames"`
	KVLayers          int    `yaml:"kv_layers"`
	KVWidth           int    `yaml:"kv_width"`
}

// VocoderSpec describes the mel → audio graph.
type VocoderSpec struct {
	File string `yaml:"file"`
	Hop  int    `yaml:"hop"`
	// ContextFrames is each window's left context in frames; 0: streaming.context_tokens' frames.
	ContextFrames int `yaml:"context_frames"`
	// LookaheadFrames are a non-last window's last frames, whose audio is held back and made by
	// the next window instead (vocwindow.go).
	LookaheadFrames int `yaml:"lookahead_frames"`
	// SourcePhase > 0: the graph carries the phase of this many source harmonics from window to
	// window (inputs phase, phase_at, sample_offset; output phase_out), given at window frame
	// PhaseFrames.
	SourcePhase int `yaml:"source_phase"`
	PhaseFrames int `yaml:"phase_frames"`
}

// StreamingSpec sets the chunk schedule.
type StreamingSpec struct {
	ChunkTokens   []int `yaml:"chunk_tokens"`
	ContextTokens int   `yaml:"context_tokens"`
}

// LoadManifest reads and checks a manifest; every error names the file.
func LoadManifest(path string) (*Manifest, error) {
	var m Manifest
	if err := manifest.Read(path, "pipeline manifest", &m); err != nil {
		return nil, err
	}
	m.File = path
	m.Dir = filepath.Dir(path)
	m.defaults()
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %w", path, err)
	}
	if err := m.loadTokenizer(); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %w", path, err)
	}
	if err := m.checkEndOfPrompt(); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %w", path, err)
	}
	if err := m.checkVoiceEncoderText(); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %w", path, err)
	}
	if err := m.loadVoices(); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %w", path, err)
	}
	if err := m.loadFlowNoise(); err != nil {
		return nil, fmt.Errorf("pipeline manifest %s: %w", path, err)
	}
	// The voices' prompts lengthen every flow run.
	if err := m.checkMaxBatchFrames(); err != nil {
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
	if m.LM.MaxPromptTokens == 0 {
		m.LM.MaxPromptTokens = DefaultMaxPromptTokens
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
	if m.Flow.Schedule == "" {
		m.Flow.Schedule = "linear"
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
	need(m.Tokenizer.Type == "bytes" || m.Tokenizer.Type == "qwen2", "tokenizer.type", fmt.Sprintf("%q is not supported (want bytes or qwen2)", m.Tokenizer.Type))
	if m.Tokenizer.Type == "qwen2" {
		need(m.Tokenizer.Vocab != "", "tokenizer.vocab", "is required with tokenizer.type: qwen2")
		need(m.Tokenizer.Merges != "", "tokenizer.merges", "is required with tokenizer.type: qwen2")
	} else {
		need(m.Tokenizer.Vocab == "" && m.Tokenizer.Merges == "" && m.Tokenizer.Config == "" && m.Tokenizer.SpecialTokens == "",
			"tokenizer", "vocab, merges, config and special_tokens apply only to tokenizer.type: qwen2")
	}
	if st := m.Tokenizer.SpecialTokens; st != "" {
		_, ok := text.SpecialTokenSets[st]
		need(ok, "tokenizer.special_tokens", fmt.Sprintf("%q is not a known set (cosyvoice3)", st))
	}
	if sp := m.Text.Split; sp != nil {
		need(sp.MaxTokens > 0 && sp.MinTokens >= 0 && sp.MinTokens <= sp.MaxTokens && sp.MergeTokens >= 0,
			"text.split", "needs max_tokens > 0 and 0 <= min_tokens <= max_tokens, merge_tokens >= 0")
	}
	need(m.LM.MaxPromptTokens > 2, "lm.max_prompt_tokens", "must be more than 2")
	if s := m.LM.Sampling; s != nil {
		need(s.TopP > 0 && s.TopP <= 1, "lm.sampling.top_p", "must be in (0, 1]")
		need(s.TopK > 0, "lm.sampling.top_k", "must be positive")
		need(s.Window >= 0, "lm.sampling.window", "must not be negative")
		need(s.TauR >= 0, "lm.sampling.tau_r", "must not be negative")
	}
	perText := m.LM.MaxTokensPerTextToken > 0 || m.LM.MinTokensPerTextToken > 0
	need(m.LM.Layers > 0, "lm.layers", "must be positive")
	need(m.LM.KVHeads > 0, "lm.kv_heads", "must be positive")
	need(m.LM.HeadDim > 0, "lm.head_dim", "must be positive")
	need(m.LM.SpeechVocab > 0, "lm.speech_vocab", "must be positive")
	if perText {
		need(m.LM.MaxTokensPerTextToken > 0, "lm.max_tokens_per_text_token", "must be positive")
		need(m.LM.MinTokensPerTextToken >= 0 && m.LM.MinTokensPerTextToken <= m.LM.MaxTokensPerTextToken, "lm.min_tokens_per_text_token", "must be between 0 and lm.max_tokens_per_text_token")
	} else {
		need(m.LM.MaxTokensPerChar > 0, "lm.max_tokens_per_char", "must be positive")
		need(m.LM.MinTokensPerChar >= 0 && m.LM.MinTokensPerChar <= m.LM.MaxTokensPerChar, "lm.min_tokens_per_char", "must be between 0 and lm.max_tokens_per_char")
	}
	need(m.LM.MaxTokens > 0, "lm.max_tokens", "must be positive")
	need(m.LM.Cache == "concat" || m.LM.Cache == "shared", "lm.cache", fmt.Sprintf("%q is not concat or shared", m.LM.Cache))
	need(m.LM.Cache != "shared" || m.LM.MaxPositions > 1, "lm.max_positions", "must be more than 1 with lm.cache: shared")
	need(m.LM.Cache == "shared" || m.LM.MaxPositions == 0, "lm.max_positions", "applies only to lm.cache: shared")
	need(m.Flow.MelBins > 0, "flow.mel_bins", "must be positive")
	need(m.Flow.Steps > 0, "flow.steps", "must be positive")
	need(m.Flow.FramesPerToken > 0, "flow.frames_per_token", "must be positive")
	need(m.Flow.CFGStrength >= 0, "flow.cfg_strength", "must not be negative")
	need(m.Flow.EmbeddingDim >= 0, "flow.embedding_dim", "must not be negative")
	need(m.Flow.EmbeddingDim == 0 || m.Flow.Step != "", "flow.embedding_dim", "needs flow.step (the estimator graph has no cond or embedding input)")
	need(m.Flow.LookaheadTokens >= 0, "flow.lookahead_tokens", "must not be negative")
	need(m.Flow.Schedule == "linear" || m.Flow.Schedule == "cosine", "flow.schedule", fmt.Sprintf("%q is not linear or cosine", m.Flow.Schedule))
	if f := m.Flow; f.ChunkStep != "" {
		need(f.ChunkFrames > 0, "flow.chunk_frames", "must be positive with flow.chunk_step")
		need(f.ConvContextFrames >= 0, "flow.conv_context_frames", "must not be negative")
		need(f.KVLayers > 0, "flow.kv_layers", "must be positive with flow.chunk_step")
		need(f.KVWidth > 0, "flow.kv_width", "must be positive with flow.chunk_step")
		need(f.EmbeddingDim > 0, "flow.chunk_step", "needs flow.embedding_dim (the graph reads cond and embedding)")
	} else {
		need(f.ChunkFrames == 0 && f.ConvContextFrames == 0 && f.KVLayers == 0 && f.KVWidth == 0,
			"flow.chunk_frames", "chunk_frames, conv_context_frames, kv_layers and kv_width apply only with flow.chunk_step")
	}
	need(m.LM.EndOfPrompt >= 0, "lm.endofprompt", "must not be negative")
	need(m.LM.EndOfPrompt == 0 || m.LM.DefaultPromptText != "", "lm.default_prompt_text", "is required with lm.endofprompt")
	need(m.LM.EndOfPrompt > 0 || m.LM.DefaultPromptText == "", "lm.default_prompt_text", "applies only with lm.endofprompt")
	if m.Flow.FramesPerToken > 0 && len(m.Streaming.ChunkTokens) > 0 {
		if err := m.checkMaxBatchFrames(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, m.validateVoiceEncoder()...)
	need(m.Vocoder.Hop > 0, "vocoder.hop", "must be positive")
	v := m.Vocoder
	need(v.ContextFrames >= 0, "vocoder.context_frames", "must not be negative")
	need(v.LookaheadFrames >= 0, "vocoder.lookahead_frames", "must not be negative")
	need(v.SourcePhase >= 0, "vocoder.source_phase", "must not be negative")
	if v.SourcePhase > 0 {
		// The carried phase is read at frame phase_frames of a window, which has to lie in
		// the window's left context, after the previous window's start.
		need(v.PhaseFrames > 0 && v.PhaseFrames <= v.ContextFrames, "vocoder.phase_frames", fmt.Sprintf("%d must be in [1, vocoder.context_frames (%d)] with vocoder.source_phase", v.PhaseFrames, v.ContextFrames))
	} else {
		need(v.PhaseFrames == 0, "vocoder.phase_frames", "applies only with vocoder.source_phase")
	}
	need(m.Streaming.ContextTokens >= 0, "streaming.context_tokens", "must not be negative")
	for _, c := range m.Streaming.ChunkTokens {
		need(c > 0, "streaming.chunk_tokens", "every chunk must be at least one token")
	}
	need(m.Flow.Estimator != "" || m.Flow.Step != "", "flow.estimator", "is required (or flow.step)")
	files := map[string]string{"lm.file": m.LM.File, "flow.encoder": m.Flow.Encoder, "vocoder.file": m.Vocoder.File}
	for key, f := range map[string]string{"flow.estimator": m.Flow.Estimator, "flow.step": m.Flow.Step, "flow.noise": m.Flow.Noise, "flow.chunk_step": m.Flow.ChunkStep} {
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

// longestFlowTokens is the longest flow input the engine makes: the longest voice prompt, the
// longest chunk with its context, and the look-ahead.
func (m *Manifest) longestFlowTokens() int {
	return m.longestPromptTokens() + slices.Max(m.Streaming.ChunkTokens) + max(m.Streaming.ContextTokens, 0) + max(m.Flow.LookaheadTokens, 0)
}

// checkMaxBatchFrames refuses a flow.max_batch_frames that the longest flow input (padded)
// passes on its own.
func (m *Manifest) checkMaxBatchFrames() error {
	mf := m.Flow.MaxBatchFrames
	if mf == 0 {
		return nil
	}
	longest := m.alignTokens(m.longestFlowTokens()) * m.Flow.FramesPerToken
	if mf < longest {
		return fmt.Errorf("flow.max_batch_frames: %d is less than the longest chunk with its context, look-ahead and voice prompt, %d frames padded (streaming.chunk_tokens, streaming.context_tokens, flow.lookahead_tokens, voices)", mf, longest)
	}
	return nil
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
