package staged

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/tts"
)

// voicedClip is secs seconds of a voice-like signal at rate: harmonics of a gliding 110–170 Hz
// pitch under a syllable-rate (4 Hz) envelope, with a little noise; deterministic.
func voicedClip(secs float64, rate int) []float32 {
	n := int(secs * float64(rate))
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]float32, n)
	phase := 0.0
	for i := range out {
		t := float64(i) / float64(rate)
		f0 := 140 + 30*math.Sin(2*math.Pi*0.7*t)
		phase += 2 * math.Pi * f0 / float64(rate)
		var v float64
		for h := 1; h <= 12; h++ {
			v += math.Sin(float64(h)*phase) / float64(h)
		}
		env := 0.55 + 0.45*math.Sin(2*math.Pi*4*t)
		out[i] = float32(0.25*env*v + 0.01*r.NormFloat64())
	}
	return out
}

func extract(t *testing.T, e *Engine, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return e.ExtractVoice(ctx, clip)
}

const cloneTranscript = "A sentence said in the reference clip."

// A 5 s clip gives about 25 speech tokens a second, two mel frames a token and a 192-value
// embedding; the voice's text is the manifest's prompt text and the transcript. The same clip
// with a second and a half of silence on each side gives the same voice within a token or two.
func TestTinyCosyVoice3ExtractVoice(t *testing.T) {
	e := tinyCV3Engine(t)
	m := e.p.m
	if d := m.description(); !d.Cloning || !d.Instructions {
		t.Fatalf("description %+v, want Cloning and Instructions", d)
	}
	clip := voicedClip(5, 24000)
	vp, err := extract(t, e, tts.VoiceClip{PCM: clip, SampleRate: 24000, Text: " " + cloneTranscript})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(vp.SpeechTokens); n < 120 || n > 126 {
		t.Errorf("%d speech tokens from 5 s, want about 125", n)
	}
	if vp.MelBins != 80 || len(vp.Mel) != 2*len(vp.SpeechTokens)*80 {
		t.Errorf("mel of %d values in %d bins for %d tokens, want 2 frames of 80 a token", len(vp.Mel), vp.MelBins, len(vp.SpeechTokens))
	}
	if len(vp.Embedding) != 192 {
		t.Errorf("embedding of %d values, want 192", len(vp.Embedding))
	}
	if want := m.VoiceEncoder.PromptText + cloneTranscript; vp.Text != want {
		t.Errorf("text %q, want %q", vp.Text, want)
	}
	// A transcript with its own instruction is taken whole.
	own := "Speak slowly.<|endofprompt|>" + cloneTranscript
	if vp2, err := extract(t, e, tts.VoiceClip{PCM: clip, SampleRate: 24000, Text: own}); err != nil || vp2.Text != own {
		t.Errorf("transcript with <|endofprompt|>: text %q (%v), want %q", vp2.Text, err, own)
	}
	silence := make([]float32, 36000)
	padded := slices.Concat(silence, clip, silence)
	vpPad, err := extract(t, e, tts.VoiceClip{PCM: padded, SampleRate: 24000, Text: cloneTranscript})
	if err != nil {
		t.Fatal(err)
	}
	if d := len(vpPad.SpeechTokens) - len(vp.SpeechTokens); d < -2 || d > 2 {
		t.Errorf("with 1.5 s of silence each side: %d speech tokens, want %d ± 2 (silence trimmed)", len(vpPad.SpeechTokens), len(vp.SpeechTokens))
	}
	// Other rates are resampled: a 48 kHz clip gives as many tokens.
	vp48, err := extract(t, e, tts.VoiceClip{PCM: voicedClip(5, 48000), SampleRate: 48000, Text: cloneTranscript})
	if err != nil {
		t.Fatal(err)
	}
	if d := len(vp48.SpeechTokens) - len(vp.SpeechTokens); d < -1 || d > 1 {
		t.Errorf("48 kHz: %d speech tokens, want %d ± 1", len(vp48.SpeechTokens), len(vp.SpeechTokens))
	}
}

func wantInvalid(t *testing.T, what string, err error, msg string) {
	t.Helper()
	var te *tts.Error
	if !errors.As(err, &te) || te.Kind != tts.ErrInvalid {
		t.Errorf("%s: %v, want an invalid-request error", what, err)
		return
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("%s: %q, want it to say %q", what, err, msg)
	}
}

// Clips outside the length window once trimmed, below 16 kHz, empty, not finite or without a
// transcript are the request's fault, and the error says why.
func TestTinyCosyVoice3ExtractVoiceInvalid(t *testing.T) {
	e := tinyCV3Engine(t)
	nan := voicedClip(4, 24000)
	nan[100] = float32(math.NaN())
	for _, c := range []struct {
		what string
		clip tts.VoiceClip
		msg  string
	}{
		{"2 s", tts.VoiceClip{PCM: voicedClip(2, 24000), SampleRate: 24000, Text: cloneTranscript}, "is 2.00 s long once its leading and trailing silence is trimmed (2.00 s in all); a voice needs 3 to 30 s"},
		{"40 s", tts.VoiceClip{PCM: voicedClip(40, 16000), SampleRate: 16000, Text: cloneTranscript}, "is 40.00 s long"},
		{"silent", tts.VoiceClip{PCM: make([]float32, 24000*5), SampleRate: 24000, Text: cloneTranscript}, "is 0.00 s long"},
		{"8 kHz", tts.VoiceClip{PCM: voicedClip(5, 8000), SampleRate: 8000, Text: cloneTranscript}, "sample rate is 8000 Hz; a voice needs 16000 Hz or more"},
		{"empty text", tts.VoiceClip{PCM: voicedClip(5, 24000), SampleRate: 24000, Text: "  "}, "transcript is empty"},
		{"no audio", tts.VoiceClip{SampleRate: 24000, Text: cloneTranscript}, "holds no audio"},
		{"NaN", tts.VoiceClip{PCM: nan, SampleRate: 24000, Text: cloneTranscript}, "sample 100 is NaN"},
	} {
		_, err := extract(t, e, c.clip)
		wantInvalid(t, c.what, err, c.msg)
	}
}

// A request with an extracted Prompt speaks in it: audio unlike voice default's, the same twice.
// A malformed prompt is the request's fault. Instructions change what the LM reads, so the audio.
func TestTinyCosyVoice3SpeakInPrompt(t *testing.T) {
	e := tinyCV3Engine(t)
	vp, err := extract(t, e, tts.VoiceClip{PCM: voicedClip(5, 24000), SampleRate: 24000, Text: cloneTranscript})
	if err != nil {
		t.Fatal(err)
	}
	def := synth(t, e, tts.Request{Text: tinyCV3Text, Voice: "default", Seed: 7})
	req := tts.Request{Text: tinyCV3Text, Voice: "default", Seed: 7, Prompt: &vp}
	cloned := synth(t, e, req)
	if len(cloned) == 0 || slices.Equal(cloned, def) {
		t.Fatalf("the prompt gave %d samples, the same as voice default's: %v", len(cloned), slices.Equal(cloned, def))
	}
	// Within float rounding: when the LM runs ahead of the flow, two chunks of a stream may share
	// a padded flow batch.
	sameSpeech(t, "the same prompt and seed, twice", cloned, synth(t, e, req))
	instructed := synth(t, e, tts.Request{Text: tinyCV3Text, Voice: "default", Seed: 7, Prompt: &vp, Instructions: "Speak cheerfully."})
	if slices.Equal(instructed, cloned) {
		t.Error("instructions did not change the audio")
	}
	bad := func(f func(p *tts.VoicePrompt)) *tts.VoicePrompt {
		p := vp
		p.SpeechTokens, p.Mel, p.Embedding = slices.Clone(vp.SpeechTokens), slices.Clone(vp.Mel), slices.Clone(vp.Embedding)
		f(&p)
		return &p
	}
	for _, c := range []struct {
		what   string
		prompt *tts.VoicePrompt
		msg    string
	}{
		{"short mel", bad(func(p *tts.VoicePrompt) { p.Mel = p.Mel[:len(p.Mel)-80] }), "its mel holds"},
		{"mel bins", bad(func(p *tts.VoicePrompt) { p.MelBins = 100 }), "its mel has 100 bins"},
		{"embedding", bad(func(p *tts.VoicePrompt) { p.Embedding = p.Embedding[:10] }), "its embedding holds 10 values, want 192"},
		{"token range", bad(func(p *tts.VoicePrompt) { p.SpeechTokens[3] = 6561 }), "speech token 6561 at index 3"},
		{"no tokens", bad(func(p *tts.VoicePrompt) { p.SpeechTokens, p.Mel = nil, nil }), "no speech tokens"},
		{"latents", bad(func(p *tts.VoicePrompt) { p.Latents, p.LatentDim = []float32{1, 2}, 2 }), "holds latents, a latent-space model's voice"},
		{"too long", bad(func(p *tts.VoicePrompt) {
			for len(p.SpeechTokens) < 1100 {
				p.SpeechTokens = append(p.SpeechTokens, p.SpeechTokens...)
				p.Mel = append(p.Mel, p.Mel...)
			}
		}), "lm.max_prompt_tokens"},
	} {
		err := e.Synthesize(context.Background(), tts.Request{Text: tinyCV3Text, Seed: 7, Prompt: c.prompt}, func(tts.Chunk) error { return nil })
		wantInvalid(t, c.what, err, c.msg)
	}
	err = e.Synthesize(context.Background(), tts.Request{Text: tinyCV3Text, Instructions: "a<|endofprompt|>"}, func(tts.Chunk) error { return nil })
	wantInvalid(t, "instructions with <|endofprompt|>", err, "may not hold")
}

// The instance service hands ExtractVoice to the staged runner.
func TestTinyCosyVoice3ServiceExtractVoice(t *testing.T) {
	tinyCV3Engine(t) // skips without the model
	s := instance.NewService(instance.Families{Family{}}, func(string) string { return "" })
	defer s.Close()
	if _, err := s.Load(context.Background(), tts.LoadConfig{Manifest: tinyCV3, Provider: "cpu", ORTLibrary: ortLibrary(t)}); err != nil {
		t.Fatal(err)
	}
	vp, err := s.ExtractVoice(context.Background(), tts.VoiceClip{PCM: voicedClip(4, 16000), SampleRate: 16000, Text: cloneTranscript})
	if err != nil || len(vp.SpeechTokens) == 0 {
		t.Fatalf("service ExtractVoice: %d tokens, %v", len(vp.SpeechTokens), err)
	}
}
