package voxcpm

import (
	"fmt"

	"github.com/voxmux/voxmux/tts"
)

// promptVoice checks a request's voice prompt (a library or cloned voice: a clip's transcript
// and AudioVAE latents) and makes the voice it speaks in; every error is the request's.
func (m *Manifest) promptVoice(vp *tts.VoicePrompt) (*voice, error) {
	bad := func(msg string, args ...any) error {
		return tts.Invalid("voice prompt: " + fmt.Sprintf(msg, args...))
	}
	if len(vp.Latents) == 0 {
		return nil, bad("it holds no latents: model %s speaks in voices made from its own AudioVAE's latents", m.Name)
	}
	if vp.LatentDim != m.FeatDim {
		return nil, bad("its latents have %d values a frame, the model's have %d (feat_dim)", vp.LatentDim, m.FeatDim)
	}
	if PD := m.patchFloats(); len(vp.Latents)%PD != 0 {
		return nil, bad("its latents hold %d values, not a whole number of patches of patch_size (%d) × feat_dim (%d)", len(vp.Latents), m.PatchSize, m.FeatDim)
	}
	v := &voice{name: "prompt", text: vp.Text, latents: vp.Latents, patches: len(vp.Latents) / m.patchFloats()}
	if err := m.checkVoice(v); err != nil {
		return nil, bad("%v", err)
	}
	return v, nil
}
