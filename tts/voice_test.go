package tts

import (
	"errors"
	"strings"
	"testing"
)

// The voice rule: "" and the model's voices pass; another name is an invalid request about
// "voice" that quotes it (bounded) and lists the model's voices; another family's prompt is
// refused naming both families.
func TestVoiceRule(t *testing.T) {
	d := Description{Kind: "staged", Name: "cv3", Voices: []string{"default", "bench"}}
	for _, ok := range []string{"", "default", "bench"} {
		if err := d.CheckVoice(ok); err != nil {
			t.Errorf("CheckVoice(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"alloy", "Default", strings.Repeat("x", 300)} {
		err := d.CheckVoice(bad)
		var e *Error
		if !errors.As(err, &e) || e.Kind != ErrInvalid || e.Param != "voice" ||
			!strings.Contains(e.Msg, "default, bench") || !strings.Contains(e.Msg, `"cv3"`) {
			t.Errorf("CheckVoice(%.10q…): %#v", bad, err)
			continue
		}
		if len(e.Msg) > 200 || !strings.Contains(e.Msg, bad[:min(len(bad), maxVoiceQuote)]) {
			t.Errorf("CheckVoice(%.10q…) quotes it unbounded or not at all: %s", bad, e.Msg)
		}
	}

	staged := &VoicePrompt{Text: "hi", SpeechTokens: []int64{1}, Mel: []float32{1}, MelBins: 1, Embedding: []float32{1}}
	latent := &VoicePrompt{Text: "hi", Latents: []float32{1, 2}, LatentDim: 2}
	if f := staged.Family(); f != "staged" {
		t.Errorf("speech tokens: family %q", f)
	}
	if f := latent.Family(); f != "voxcpm" {
		t.Errorf("latents: family %q", f)
	}
	if f := (&VoicePrompt{Text: "hi"}).Family(); f != "" {
		t.Errorf("neither: family %q", f)
	}
	if err := d.CheckRequest(Request{Voice: "not a voice", Prompt: staged}); err != nil {
		t.Errorf("with a prompt of its family, Voice is a label: %v", err)
	}
	err := d.CheckRequest(Request{Prompt: latent})
	var e *Error
	if !errors.As(err, &e) || e.Kind != ErrInvalid || e.Param != "voice" ||
		!strings.Contains(e.Msg, "voxcpm family") || !strings.Contains(e.Msg, "staged family") {
		t.Errorf("another family's prompt: %#v", err)
	}
}
