package staged

import (
	"time"

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
	r := engine.Report{Stages: e.Stats(), Cancels: e.CancelStats(), FirstAudio: out}
	if e.p.prompts != nil {
		r.PromptCache = e.p.prompts.stats()
	}
	if e.p.flowMem != nil {
		r.FlowMemory = e.p.flowMem.stats()
	}
	return r
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

// The marks on a request's way to its first audio.
const (
	markArrived = iota // handed to the LM loop
	markPrefill        // prompt prefilled
	markQueued         // first chunk of speech tokens handed to the flow
	markMel            // first chunk's mel handed to the vocoder
	numMarks
)

// FirstAudio is where one request's first audio spent its time: waiting for the LM loop and
// prefilling its prompt, decoding the first chunk's speech tokens, waiting for and running the
// flow, waiting for and running the vocoder.
type FirstAudio struct {
	Prefill, Decode, Flow, Vocoder time.Duration
}

// FirstAudio returns what requests' first audio spent its time on since the last call.
func (e *Engine) FirstAudio() []FirstAudio {
	e.firstMu.Lock()
	defer e.firstMu.Unlock()
	out := e.firstAudio
	e.firstAudio = nil
	return out
}

// firstAudioOut records s's first audio, which leaves now.
func (e *Engine) firstAudioOut(s *stream) {
	m := s.marks
	f := FirstAudio{Prefill: m[markPrefill].Sub(m[markArrived]), Decode: m[markQueued].Sub(m[markPrefill]),
		Flow: m[markMel].Sub(m[markQueued]), Vocoder: time.Since(m[markMel])}
	e.firstMu.Lock()
	defer e.firstMu.Unlock()
	if len(e.firstAudio) < firstAudioKept {
		e.firstAudio = append(e.firstAudio, f)
	}
}
