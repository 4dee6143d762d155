package staged

import (
	"github.com/voxmux/voxmux/instance/engine"
)

// Report is the engine's stage counts and cancels, and the first audio of its requests since the
// last report (or FirstAudio call).
func (e *Engine) Report() engine.Report {
	fa := e.FirstAudio()
	out := make([]engine.FirstAudio, len(fa))
	for i, f := range fa {
		out[i] = f.parts()
	}
	return engine.Report{Stages: e.Stats(), Cancels: e.CancelStats(), FirstAudio: out}
}

// parts names f's parts for the instance's log (engine.SummarizeFirstAudio).
func (f FirstAudio) parts() engine.FirstAudio {
	return engine.FirstAudio{{Name: "prefill", Took: f.Prefill}, {Name: "decode", Took: f.Decode},
		{Name: "flow", Took: f.Flow}, {Name: "vocoder", Took: f.Vocoder}}
}

// firstAudioSummary gives the median and 95th percentile of each part of the time to first audio
// and of their sum, in ms.
func firstAudioSummary(fa []FirstAudio) string {
	parts := make([]engine.FirstAudio, len(fa))
	for i, f := range fa {
		parts[i] = f.parts()
	}
	return engine.SummarizeFirstAudio(parts)
}
