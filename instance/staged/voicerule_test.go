package staged

import (
	"testing"

	"github.com/voxmux/voxmux/instance/engine/enginetest"
	"github.com/voxmux/voxmux/tts"
)

// The voice rule (tts.Request.Voice): a name the manifest does not list is an invalid request
// about "voice" that names it and lists the model's voices (not the first voice, as a guess); a
// voice prompt made by the voxcpm family is refused naming both families. Nothing is spoken.
func TestStagedVoiceRule(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	t.Cleanup(func() { e.Close() })
	latent := &tts.VoicePrompt{Text: "hi", Latents: []float32{1, 2, 3, 4}, LatentDim: 2}
	for _, c := range []struct {
		req  tts.Request
		want []string
	}{
		{tts.Request{Text: "hi", Voice: "alloy"}, append([]string{`"alloy"`, `"tiny"`}, e.p.m.Voices...)},
		{tts.Request{Text: "hi", Prompt: latent}, []string{"voxcpm family", "staged family"}},
	} {
		enginetest.CheckVoiceRefused(t, e, c.req, c.want...)
	}
	// The model's voice and the empty name (its first) speak.
	for _, v := range []string{"", e.p.m.Voices[0]} {
		if pcm := synth(t, e, tts.Request{Text: "hi", Voice: v, Seed: 1}); len(pcm) == 0 {
			t.Errorf("voice %q spoke nothing", v)
		}
	}
}
