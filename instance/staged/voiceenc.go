package staged

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"unicode/utf8"

	onnxrt "github.com/yalue/onnxruntime_go"

	"github.com/voxmux/voxmux/instance/clipfeat"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// VoiceEncoderSpec is the manifest's voice_encoder: the networks that make a zero-shot voice
// prompt from a reference clip, as CosyVoice3's frontend does (ExtractVoice).
type VoiceEncoderSpec struct {
	// SpeechTokenizer takes Whisper's 128-bin log-mel of the clip at 16 kHz (inputs, by position:
	// float32 [1, 128, T] and int32 [1], T) and gives its speech tokens (int32 or int64 [1, N]).
	SpeechTokenizer string `yaml:"speech_tokenizer"`
	// Speaker takes the clip's 80-bin Kaldi fbank at 16 kHz less its mean (float32 [1, T, 80])
	// and gives its speaker embedding (float32 [1, flow.embedding_dim]).
	Speaker string `yaml:"speaker"`
	// PromptText goes before the clip's transcript in the voice's text.
	PromptText string `yaml:"prompt_text"`
	// MinSeconds and MaxSeconds bound the clip once its silence is trimmed.
	MinSeconds float64 `yaml:"min_seconds"`
	MaxSeconds float64 `yaml:"max_seconds"`
}

// endOfPromptText is CosyVoice3's <|endofprompt|> as text: what ends a prompt's instruction.
const endOfPromptText = "<|endofprompt|>"

// Limits of the voice encoder.
const (
	// speechTokenizerSeconds is the longest clip CosyVoice3's speech tokenizer takes (its
	// frontend refuses longer ones).
	speechTokenizerSeconds = 30
	// minClipRate is the lowest sample rate a clip may have: the speech tokenizer and the speaker
	// network read 16 kHz audio, and upsampling a narrower band adds nothing they can use.
	minClipRate = 16000
)

// validateVoiceEncoder checks voice_encoder's keys against the rest of the manifest.
func (m *Manifest) validateVoiceEncoder() []error {
	v := m.VoiceEncoder
	if v == nil {
		return nil
	}
	var errs []error
	need := func(ok bool, key, msg string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s", strings.TrimSuffix("voice_encoder."+key, "."), msg))
		}
	}
	for key, f := range map[string]string{"speech_tokenizer": v.SpeechTokenizer, "speaker": v.Speaker} {
		if f == "" {
			need(false, key, "is required")
		} else if _, err := os.Stat(m.Path(f)); err != nil {
			errs = append(errs, fmt.Errorf("voice_encoder.%s: %w", key, err))
		}
	}
	need(v.PromptText != "", "prompt_text", "is required")
	need(v.MinSeconds > 0, "min_seconds", "must be positive")
	need(v.MaxSeconds >= v.MinSeconds && v.MaxSeconds <= speechTokenizerSeconds, "max_seconds",
		fmt.Sprintf("%g must be in [min_seconds, %d] (the speech tokenizer's limit)", v.MaxSeconds, speechTokenizerSeconds))
	// The features are CosyVoice3's: a 24 kHz vocoder of 80-bin mel at 50 Hz, tokens at 25 Hz.
	need(m.SampleRate == 24000, "", fmt.Sprintf("needs sample_rate 24000 (the prompt mel's), not %d", m.SampleRate))
	need(m.Flow.MelBins == clipfeat.FlowBins, "", fmt.Sprintf("needs flow.mel_bins %d (the prompt mel's), not %d", clipfeat.FlowBins, m.Flow.MelBins))
	need(m.Flow.FramesPerToken == 2, "", fmt.Sprintf("needs flow.frames_per_token 2 (50 Hz mel, 25 Hz tokens), not %d", m.Flow.FramesPerToken))
	need(m.Flow.EmbeddingDim > 0, "", "needs flow.embedding_dim > 0 (the flow's cond and embedding inputs)")
	return errs
}

// checkVoiceEncoderText refuses a prompt_text without lm.endofprompt once tokenized; the
// tokenizer must be loaded.
func (m *Manifest) checkVoiceEncoderText() error {
	v := m.VoiceEncoder
	if v == nil || m.LM.EndOfPrompt == 0 {
		return nil
	}
	for _, id := range m.textIDs(v.PromptText) {
		if id == m.LM.EndOfPrompt {
			return nil
		}
	}
	return fmt.Errorf("voice_encoder.prompt_text: %q does not hold lm.endofprompt (%d) once tokenized", v.PromptText, m.LM.EndOfPrompt)
}

// voiceEncoder runs the voice encoder's two networks. They run on the CPU whatever the
// pipeline's provider: they are small, run once per voice rather than per request, and would
// otherwise take GPU memory and stream time from the stages every request needs.
type voiceEncoder struct {
	m                   *Manifest
	rt                  *ort.Runtime
	tokenizer, speaker  *onnxrt.DynamicAdvancedSession
	tokenizerIn, spkrIn []string
	// mu runs one clip at a time: a burst of uploads then takes the CPU from the engine's LM loop
	// (its sampling and host work) no more than one clip's features and networks do.
	mu sync.Mutex
}

// newVoiceEncoder opens voice_encoder's networks, their input names read by position.
func newVoiceEncoder(m *Manifest, cfg tts.LoadConfig, o ort.Options) (*voiceEncoder, error) {
	spec := m.VoiceEncoder
	cpu := tts.LoadConfig{ORTLibrary: cfg.ORTLibrary, Provider: "cpu"}
	rt, err := ort.New(cpu, 0, ort.Options{IntraOpThreads: o.IntraOpThreads})
	if err != nil {
		return nil, fmt.Errorf("voice_encoder: %w", err)
	}
	e := &voiceEncoder{m: m, rt: rt}
	open := func(key, file string, wantIn int) (*onnxrt.DynamicAdvancedSession, []string, error) {
		path := m.Path(file)
		ins, outs, err := ort.ReadGraphIO(path)
		if err != nil {
			return nil, nil, fmt.Errorf("voice_encoder.%s: %s: %w", key, path, err)
		}
		if len(ins) < wantIn || len(outs) < 1 {
			return nil, nil, fmt.Errorf("voice_encoder.%s: %s has %d inputs and %d outputs, want %d inputs and an output", key, path, len(ins), len(outs), wantIn)
		}
		var names []string
		for _, in := range ins[:wantIn] {
			names = append(names, in.Name)
		}
		s, err := rt.Session("voice_"+key, path, names, []string{outs[0].Name})
		if err != nil {
			return nil, nil, fmt.Errorf("voice_encoder.%s: %w", key, err)
		}
		return s, names, nil
	}
	if e.tokenizer, e.tokenizerIn, err = open("speech_tokenizer", spec.SpeechTokenizer, 2); err == nil {
		e.speaker, e.spkrIn, err = open("speaker", spec.Speaker, 1)
	}
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *voiceEncoder) close() error {
	var errs []error
	for _, s := range []*onnxrt.DynamicAdvancedSession{e.tokenizer, e.speaker} {
		if s != nil {
			errs = append(errs, s.Destroy())
		}
	}
	e.rt.Close()
	return errors.Join(errs...)
}

// speechTokens runs the speech tokenizer on Whisper's log-mel, channel-major [128][frames].
func (e *voiceEncoder) speechTokens(feats []float32, frames int) ([]int64, error) {
	x, err := onnxrt.NewTensor(onnxrt.NewShape(1, clipfeat.WhisperBins, int64(frames)), feats)
	if err != nil {
		return nil, fmt.Errorf("speech tokenizer input: %w", err)
	}
	defer x.Destroy()
	n, err := onnxrt.NewTensor(onnxrt.NewShape(1), []int32{int32(frames)})
	if err != nil {
		return nil, fmt.Errorf("speech tokenizer input: %w", err)
	}
	defer n.Destroy()
	outs := []onnxrt.Value{nil}
	if err := e.tokenizer.Run([]onnxrt.Value{x, n}, outs); err != nil {
		return nil, fmt.Errorf("speech tokenizer: %w", err)
	}
	defer ort.Destroy(outs)
	// The published graph's tokens are int32; int64 is taken too.
	switch t := outs[0].(type) {
	case *onnxrt.Tensor[int32]:
		d := t.GetData()
		out := make([]int64, len(d))
		for i, v := range d {
			out[i] = int64(v)
		}
		return out, nil
	case *onnxrt.Tensor[int64]:
		return append([]int64(nil), t.GetData()...), nil
	}
	return nil, fmt.Errorf("speech tokenizer: output is %T, want int32 or int64 tokens", outs[0])
}

// embedding runs the speaker network on a mean-removed fbank, frame-major [frames][80].
func (e *voiceEncoder) embedding(fbank []float32, frames int) ([]float32, error) {
	x, err := onnxrt.NewTensor(onnxrt.NewShape(1, int64(frames), clipfeat.FbankBins), fbank)
	if err != nil {
		return nil, fmt.Errorf("speaker input: %w", err)
	}
	defer x.Destroy()
	outs := []onnxrt.Value{nil}
	if err := e.speaker.Run([]onnxrt.Value{x}, outs); err != nil {
		return nil, fmt.Errorf("speaker: %w", err)
	}
	defer ort.Destroy(outs)
	emb, err := ort.Floats(outs[0])
	if err != nil {
		return nil, fmt.Errorf("speaker: %w", err)
	}
	return append([]float32(nil), emb...), nil
}

// voiceText is a voice's prompt text from a clip's transcript: the voice encoder's prompt_text
// and the transcript, or a transcript that holds <|endofprompt|> whole (its own instruction).
func (m *Manifest) voiceText(transcript string) string {
	t := strings.TrimSpace(transcript)
	if strings.Contains(t, endOfPromptText) {
		return t
	}
	return m.VoiceEncoder.PromptText + t
}

// ExtractVoice makes a zero-shot voice prompt from a reference clip, as CosyVoice3's frontend
// does (docs/pipeline.md, "Voices").
func (e *Engine) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	return e.p.ExtractVoice(ctx, clip)
}

// ExtractVoice makes a zero-shot voice prompt from a reference clip: its silence trimmed, the
// speech tokens of the clip at 16 kHz, its speaker embedding, and its mel at 24 kHz, two frames a
// token.
func (p *Pipeline) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	m := p.m
	spec := m.VoiceEncoder
	if spec == nil || p.venc == nil {
		return tts.VoicePrompt{}, tts.Invalid(fmt.Sprintf("model %s does not make voices from reference audio", m.Name))
	}
	pcm, err := clipfeat.ClipSpeech(clip, minClipRate, spec.MinSeconds, spec.MaxSeconds)
	if err != nil {
		return tts.VoicePrompt{}, err
	}
	text := m.voiceText(clip.Text)
	e := p.venc
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return tts.VoicePrompt{}, err
	}
	x16 := clipfeat.Resample(pcm, clip.SampleRate, 16000)
	feats, frames := clipfeat.WhisperLogMel(x16)
	tokens, err := e.speechTokens(feats, frames)
	if err != nil {
		return tts.VoicePrompt{}, fmt.Errorf("voice_encoder: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return tts.VoicePrompt{}, err
	}
	fbank, fframes := clipfeat.KaldiFbank(x16)
	clipfeat.SubtractMean(fbank, clipfeat.FbankBins)
	emb, err := e.embedding(fbank, fframes)
	if err != nil {
		return tts.VoicePrompt{}, fmt.Errorf("voice_encoder: %w", err)
	}
	mel, _ := clipfeat.FlowMel(clipfeat.Resample(pcm, clip.SampleRate, 24000))
	tokens, mel = clipfeat.Align(tokens, mel, clipfeat.FlowBins)
	// What the networks give is the model's fault, not the clip's: plain errors.
	for i, t := range tokens {
		if t < 0 || t >= int64(m.LM.SpeechVocab) {
			return tts.VoicePrompt{}, fmt.Errorf("voice_encoder.speech_tokenizer: token %d at index %d is outside [0, lm.speech_vocab = %d)", t, i, m.LM.SpeechVocab)
		}
	}
	if len(emb) != m.Flow.EmbeddingDim {
		return tts.VoicePrompt{}, fmt.Errorf("voice_encoder.speaker: gives %d values, want flow.embedding_dim = %d", len(emb), m.Flow.EmbeddingDim)
	}
	if len(tokens) == 0 {
		return tts.VoicePrompt{}, tts.Invalid("the reference clip gives no speech tokens")
	}
	vp := tts.VoicePrompt{Text: text, SpeechTokens: tokens, Mel: mel, MelBins: m.Flow.MelBins, Embedding: emb}
	if _, err := m.promptVoice(&vp); err != nil {
		return tts.VoicePrompt{}, err
	}
	return vp, nil
}

// promptVoice checks a request's voice prompt against the manifest and makes the voice it speaks
// in; every error is the request's (tts.InvalidVoice).
func (m *Manifest) promptVoice(vp *tts.VoicePrompt) (*Voice, error) {
	bad := func(msg string, args ...any) error {
		return tts.InvalidVoice("voice prompt: " + fmt.Sprintf(msg, args...))
	}
	D, C, R := m.Flow.EmbeddingDim, m.Flow.MelBins, m.Flow.FramesPerToken
	if D == 0 {
		return nil, tts.InvalidVoice(fmt.Sprintf("model %s does not speak in voice prompts", m.Name))
	}
	if !utf8.ValidString(vp.Text) {
		return nil, bad("its text is not valid UTF-8")
	}
	if len(vp.Latents) > 0 {
		// A library voice made by a latent-space model, served now by this one.
		return nil, bad("it holds latents, a latent-space model's voice; model %s speaks in voices of speech tokens, mel and embedding", m.Name)
	}
	if vp.MelBins != C {
		return nil, bad("its mel has %d bins, the model's has %d", vp.MelBins, C)
	}
	n := len(vp.SpeechTokens)
	if n == 0 {
		return nil, bad("it has no speech tokens")
	}
	if len(vp.Mel) != R*n*C {
		return nil, bad("its mel holds %d values, want %d frames per token × %d tokens × %d bins = %d", len(vp.Mel), R, n, C, R*n*C)
	}
	if len(vp.Embedding) != D {
		return nil, bad("its embedding holds %d values, want %d", len(vp.Embedding), D)
	}
	for i, t := range vp.SpeechTokens {
		if t < 0 || t >= int64(m.LM.SpeechVocab) {
			return nil, bad("speech token %d at index %d is outside [0, %d)", t, i, m.LM.SpeechVocab)
		}
	}
	for _, xs := range [][]float32{vp.Mel, vp.Embedding} {
		for _, x := range xs {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, bad("it holds %v, not a finite number", x)
			}
		}
	}
	v := &Voice{Name: "prompt", Text: vp.Text, textIDs: m.textIDs(vp.Text), SpeechTokens: vp.SpeechTokens,
		Mel: frameMajorToChannels(vp.Mel, R*n, C), Embedding: vp.Embedding}
	// Room for a whole segment of text after the voice (text.split's max_tokens), bos and sos.
	room := 2
	if sp := m.Text.Split; sp != nil {
		room += sp.MaxTokens
	}
	if p, lim := len(v.textIDs)+n, m.LM.MaxPromptTokens; p+room > lim {
		return nil, bad("its text and speech tokens make %d prompt tokens, which with %d for the text leaves the LM's lm.max_prompt_tokens (%d) no room", p, room, lim)
	}
	if mf := m.Flow.MaxBatchFrames; mf > 0 {
		longest := m.alignTokens(n+m.longestFlowTokens()-m.longestPromptTokens()) * R
		if longest > mf {
			return nil, bad("%d speech tokens make flow runs of %d frames, more than flow.max_batch_frames (%d)", n, longest, mf)
		}
	}
	return v, nil
}

// instructText is the LM's prompt text for a request's instructions, CosyVoice3's instruct form:
// lm.default_prompt_text's instruction, the instructions, then <|endofprompt|>. ok is false for a
// manifest without lm.endofprompt or whose default prompt text has no <|endofprompt|>.
func (m *Manifest) instructText(instructions string) (s string, ok bool) {
	i := strings.LastIndex(m.LM.DefaultPromptText, endOfPromptText)
	if m.LM.EndOfPrompt == 0 || i < 0 {
		return "", false
	}
	return strings.TrimSpace(m.LM.DefaultPromptText[:i]) + " " + strings.TrimSpace(instructions) + endOfPromptText, true
}

// requestVoices are the voices a request speaks with: lm's text and speech tokens lead the LM's
// prompt, flow's tokens, mel and embedding condition the flow. A request's Prompt replaces its
// named voice; a name the model does not have and another family's prompt are the request's
// errors (tts.Description.CheckRequest). Instructions (with lm.endofprompt) replace the LM's
// voice with the instruction alone and keep the flow's, as CosyVoice3's instruct mode does (its
// LM then reads no prompt speech).
func (m *Manifest) requestVoices(req tts.Request) (lm, flow *Voice, err error) {
	if err := m.description().CheckRequest(req); err != nil {
		return nil, nil, err
	}
	flow = m.voice(req.Voice)
	if req.Prompt != nil {
		if flow, err = m.promptVoice(req.Prompt); err != nil {
			return nil, nil, err
		}
	}
	lm = flow
	if strings.TrimSpace(req.Instructions) != "" {
		if !utf8.ValidString(req.Instructions) {
			return nil, nil, tts.Invalid("instructions are not valid UTF-8")
		}
		if strings.Contains(req.Instructions, endOfPromptText) {
			return nil, nil, tts.Invalid("instructions may not hold " + endOfPromptText)
		}
		if s, ok := m.instructText(req.Instructions); ok {
			lm = &Voice{Name: "instructions", Text: s, textIDs: m.textIDs(s)}
		}
	}
	return lm, flow, nil
}
