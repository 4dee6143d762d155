package voxcpm

import "github.com/voxmux/voxmux/tts"

// promptVoice checks a request's voice prompt (a library or cloned voice: a clip's transcript
// and AudioVAE latents) and makes the voice it speaks in; every error is the request's.
func (m *Manifest) promptVoice(vp *tts.VoicePrompt) (*voice, error) {
	v, err := m.voiceOf("prompt", vp)
	if err != nil {
		return nil, tts.InvalidVoice("voice prompt: " + err.Error())
	}
	return v, nil
}
