package voxcpm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	onnxrt "github.com/yalue/onnxruntime_go"

	"github.com/voxmux/voxmux/instance/clipfeat"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Limits of a reference clip, once its leading and trailing silence is trimmed.
const (
	minClipSeconds = 3
	maxClipSeconds = 30
	// minClipRate is the lowest sample rate a clip may have: upsampled from less, the clip has
	// too little of the band a 44.1 kHz voice is heard in.
	minClipRate = 16000
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

func newVoiceEncoder(m *Manifest, cfg tts.LoadConfig, o ort.Options) (*voiceEncoder, error) {
	cpu := tts.LoadConfig{ORTLibrary: cfg.ORTLibrary, Provider: "cpu"}
	rt, err := ort.New(cpu, 0, ort.Options{IntraOpThreads: o.IntraOpThreads})
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
	pcm, err := clipfeat.ClipSpeech(clip, minClipRate, minClipSeconds, maxClipSeconds)
	if err != nil {
		return tts.VoicePrompt{}, err
	}
	text := cleanText(clip.Text)
	e.enc.mu.Lock()
	defer e.enc.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return tts.VoicePrompt{}, err
	}
	audio := padPatches(clipfeat.Resample(pcm, clip.SampleRate, m.SampleRate), m.patchSamples())
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
