package piper

import (
	"testing"

	"github.com/voxmux/voxmux/instance/engine/enginetest"
	"github.com/voxmux/voxmux/tts"
)

// The voice rule (tts.Request.Voice): a name the model does not have is an invalid request about
// "voice" that names it and lists the model's voices; a voice prompt, which no Piper voice speaks
// in, is refused naming the family that made it and piper. Nothing is spoken either way.
func TestPiperVoiceRule(t *testing.T) {
	r, d := openTinyPiper(t, tinyPiperDir)
	staged := &tts.VoicePrompt{Text: "hi", SpeechTokens: []int64{1, 2}, Mel: []float32{1, 2}, MelBins: 1, Embedding: []float32{1}}
	for _, c := range []struct {
		req  tts.Request
		want []string
	}{
		{tts.Request{Text: "Hi.", Voice: "carol"}, append([]string{`"carol"`}, d.Voices...)},
		{tts.Request{Text: "Hi.", Voice: "ALICE"}, append([]string{`"ALICE"`}, d.Voices...)}, // names are exact here
		{tts.Request{Text: "Hi.", Voice: "alice", Prompt: staged}, []string{"staged family", "piper family"}},
	} {
		enginetest.CheckVoiceRefused(t, r, c.req, c.want...)
	}
}
