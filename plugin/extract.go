package plugin

import (
	"context"
	"fmt"

	"github.com/voxmux/voxmux/tts"
)

// ExtractVoice computes a voice prompt on the current process (router.VoiceExtractor). It ends
// with the process's life, as a synthesis does.
func (m *Member) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	m.mu.Lock()
	inst, proc, life, state := m.inst, m.proc, m.life, m.status.State
	m.mu.Unlock()
	if inst == nil || state != tts.StateReady || proc.Exited() {
		return tts.VoicePrompt{}, &tts.Error{Kind: tts.ErrNotReady, Msg: fmt.Sprintf("instance %s is %s", m.spec.Name, state)}
	}
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	defer stop()
	return inst.ExtractVoice(rctx, clip)
}
