package voxcpm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"unicode/utf8"

	onnxrt "github.com/yalue/onnxruntime_go"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/voicefeat"
	"github.com/voxmux/voxmux/tts"
)

// Limits of a reference clip, once its leading and trailing silence is trimmed.
const (
	minClipSeconds = 3
	maxClipSeconds = 30
	// minClipRate is the lowest sample rate a clip may have: upsampled from less, the clip has
	// too little of the band a 44.1 kHz voice is heard in.
	minClipRate = 16000
	// silenceDB is how far under the clip's peak a frame's RMS is silence, for trimming.
	silenceDB = 50
)

// voiceEncoder runs vae_encoder.onnx. It runs on the CPU whatever the engine's provider: it runs
// once per voice, not per request, and would otherwise take device memory and time from the
// streams.
type voiceEncoder struct {
	m  *Manifest
	rt *ort.Runtime
	s  *onnxrt.DynamicAdvancedSession
	// mu runs one clip at a time, so a burst of uploads takes no more CPU from the scheduler than
	// one clip does.
	mu sync.Mutex
}

func newVoiceEncoder(m *Manifest, cfg tts.LoadConfig) (*voiceEncoder, error) {
	cpu := tts.LoadConfig{ORTLibrary: cfg.ORTLibrary, Provider: "cpu", Engine: tts.EngineOptions{IntraOpThreads: cfg.Engine.IntraOpThreads}}
	rt, err := ort.New(cpu, 0)
	if err != nil {
		return nil, fmt.Errorf("graphs.vae_encoder: %w", err)
	}
	s, err := rt.Session("voxcpm_vae_encoder", m.Path(m.Graphs.VAEEncoder), []string{"audio"}, []string{"latent"})
	if err != nil {
		rt.Close()
		return nil, fmt.Errorf("graphs.vae_encoder: %w", err)
	}
	return &voiceEncoder{m: m, rt: rt, s: s}, nil
}

func (e *voiceEncoder) close() error {
	err := e.s.Destroy()
	e.rt.Close()
	return err
}

// encode runs the encoder over audio at the model's rate, a whole number of patches long, and
// returns its latents, [frames][feat_dim].
func (e *voiceEncoder) encode(audio []float32) ([]float32, error) {
	x, err := onnxrt.NewTensor(onnxrt.NewShape(1, int64(len(audio))), audio)
	if err != nil {
		return nil, fmt.Errorf("vae_encoder input: %w", err)
	}
	defer x.Destroy()
	outs := []onnxrt.Value{nil}
	if err := e.s.Run([]onnxrt.Value{x}, outs); err != nil {
		return nil, fmt.Errorf("vae_encoder: %w", err)
	}
	defer ort.Destroy(outs)
	lat, err := ort.Floats(outs[0])
	if err != nil {
		return nil, fmt.Errorf("vae_encoder: %w", err)
	}
	if want := len(audio) / e.m.ChunkSize * e.m.FeatDim; len(lat) != want {
		return nil, fmt.Errorf("vae_encoder: latent has %d values (shape %v), want %d samples / chunk_size (%d) × feat_dim (%d) = %d",
			len(lat), outs[0].GetShape(), len(audio), e.m.ChunkSize, e.m.FeatDim, want)
	}
	return append([]float32(nil), lat...), nil
}

// ExtractVoice makes a voice prompt from a reference clip: the clip's silence trimmed, resampled
// to the model's rate, left-padded with zeros to a whole number of patches (as the reference
// does) and encoded by the AudioVAE; its transcript is the prompt's text.
func (e *Engine) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	m := e.m
	if e.enc == nil {
		return tts.VoicePrompt{}, tts.Invalid(fmt.Sprintf("model %s does not make voices from reference audio (its export has no graphs.vae_encoder)", m.Name))
	}
	if len(clip.PCM) == 0 {
		return tts.VoicePrompt{}, tts.Invalid("the reference clip holds no audio")
	}
	if clip.SampleRate < minClipRate {
		return tts.VoicePrompt{}, tts.Invalid(fmt.Sprintf("the reference clip's sample rate is %d Hz; a voice needs %d Hz or more", clip.SampleRate, minClipRate))
	}
	for i, v := range clip.PCM {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return tts.VoicePrompt{}, tts.Invalid(fmt.Sprintf("the reference clip's sample %d is %v, not a finite number", i, v))
		}
	}
	if !utf8.ValidString(clip.Text) {
		return tts.VoicePrompt{}, tts.Invalid("the reference clip's transcript is not valid UTF-8")
	}
	text := cleanText(clip.Text)
	if text == "" {
		return tts.VoicePrompt{}, tts.Invalid("the reference clip's transcript is empty; give the words said in the clip")
	}
	pcm := trimSilence(clip.PCM, clip.SampleRate)
	secs := float64(len(pcm)) / float64(clip.SampleRate)
	if secs < minClipSeconds || secs > maxClipSeconds {
		return tts.VoicePrompt{}, tts.Invalid(fmt.Sprintf("the reference clip is %.2f s long once its leading and trailing silence is trimmed (%.2f s in all); a voice needs %d to %d s",
			secs, float64(len(clip.PCM))/float64(clip.SampleRate), minClipSeconds, maxClipSeconds))
	}
	e.enc.mu.Lock()
	defer e.enc.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return tts.VoicePrompt{}, err
	}
	audio := padPatches(voicefeat.Resample(pcm, clip.SampleRate, m.SampleRate), m.patchSamples())
	lat, err := e.enc.encode(audio)
	if err != nil {
		return tts.VoicePrompt{}, err
	}
	vp := tts.VoicePrompt{Text: text, Latents: lat, LatentDim: m.FeatDim}
	if _, err := m.promptVoice(&vp); err != nil {
		// What the encoder gives is the model's fault, not the clip's.
		var te *tts.Error
		if errors.As(err, &te) {
			err = errors.New(te.Msg)
		}
		return tts.VoicePrompt{}, fmt.Errorf("vae_encoder: %w", err)
	}
	return vp, nil
}

// padPatches left-pads audio with zeros to a whole number of patches of n samples.
func padPatches(audio []float32, n int) []float32 {
	pad := (n - len(audio)%n) % n
	if pad == 0 {
		return audio
	}
	return append(make([]float32, pad, pad+len(audio)), audio...)
}

// trimSilence cuts the clip's leading and trailing silence: 10 ms frames whose RMS is more than
// silenceDB under the clip's peak sample, keeping 20 ms beside the speech so that soft onsets and
// endings stay whole. A silent clip comes back empty.
func trimSilence(pcm []float32, rate int) []float32 {
	var peak float64
	for _, v := range pcm {
		peak = max(peak, math.Abs(float64(v)))
	}
	if peak == 0 {
		return nil
	}
	floor := peak * math.Pow(10, -silenceDB/20.0)
	n := max(rate/100, 1)
	loud := func(f int) bool {
		seg := pcm[f*n : min((f+1)*n, len(pcm))]
		var s float64
		for _, v := range seg {
			s += float64(v) * float64(v)
		}
		return math.Sqrt(s/float64(len(seg))) >= floor
	}
	frames := (len(pcm) + n - 1) / n
	first, last := 0, frames-1
	for first < frames && !loud(first) {
		first++
	}
	if first == frames {
		return nil
	}
	for last > first && !loud(last) {
		last--
	}
	from := max(first-2, 0) * n
	to := min((last+3)*n, len(pcm))
	return pcm[from:to]
}
