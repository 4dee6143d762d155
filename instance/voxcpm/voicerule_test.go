package voxcpm

import (
	"testing"

	"github.com/voxmux/voxmux/instance/engine/enginetest"
	"github.com/voxmux/voxmux/tts"
)

// The voice rule (tts.Request.Voice): a name the export does not have is an invalid request
// about "voice" that names it and lists the model's voices (not the built-in voice, as a guess);
// a CosyVoice3 (staged family) voice prompt is refused naming both families, not blamed on the
// text. Nothing is spoken.
func TestVoxCPMVoiceRule(t *testing.T) {
	e := tinyEngine(t, 1)
	staged := &tts.VoicePrompt{Text: "hi", SpeechTokens: []int64{1, 2}, Mel: []float32{1, 2}, MelBins: 1, Embedding: []float32{1}}
	d := e.m.description()
	for _, c := range []struct {
		req  tts.Request
		want []string
	}{
		{tts.Request{Text: "hi", Voice: "alloy"}, append([]string{`"alloy"`}, d.Voices...)},
		{tts.Request{Text: "hi", Prompt: staged}, []string{"staged family", "voxcpm family"}},
	} {
		enginetest.CheckVoiceRefused(t, e, c.req, c.want...)
	}
	for _, v := range d.Voices[:1] {
		if r := run(t, e, tts.Request{Text: "hi", Voice: v, Seed: 1}); r.err != nil || len(r.chunks) == 0 {
			t.Errorf("voice %q: %v, %d chunks", v, r.err, len(r.chunks))
		}
	}
}
