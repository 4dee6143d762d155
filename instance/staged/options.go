package staged

import "github.com/voxmux/voxmux/tts"

// options are the engine options (tts.EngineOptions, checked when the config loaded) resolved
// for a provider: every default filled in.
type options struct {
	lmHighPriority bool
	lmGraph        string // on, decode, fixed, off
	flowGraph      string // on, fixed, off
	flowWorkers    int
	flowShare      bool
	vocoderBatches []int // the vocoder's fixed-shape batch sizes; none: one session takes every shape
	// vocoderWindow is the most mel frames the vocoder runs in one item; 0: never split; -1:
	// defaultVocoderWindow.
	vocoderWindow int
	exactBatches  bool // flow and vocoder batches of one item length (tts.EngineOptions.ExactBatches)
}

func resolveOptions(o tts.EngineOptions, cuda bool, m *Manifest) options {
	r := options{
		lmHighPriority: o.LMStreamPriority != "normal",
		lmGraph:        o.LMCUDAGraph,
		flowGraph:      o.FlowCUDAGraph,
		flowWorkers:    o.FlowWorkers,
		flowShare:      o.FlowFirstWorker == "share",
		vocoderBatches: o.VocoderBatches,
		exactBatches:   o.ExactBatches,
	}
	if r.lmGraph == "" {
		// The LM's graphs made a decode step 2-3× faster and a prefill of one prompt 3× faster
		// (docs/benchmarks/RESULTS.md); they need the shared cache.
		r.lmGraph = "off"
		if cuda && m.LM.Cache == "shared" {
			r.lmGraph = "on"
		}
	}
	if r.flowGraph == "" {
		r.flowGraph = "off"
		if cuda {
			r.flowGraph = "on"
		}
	}
	if r.flowWorkers == 0 {
		r.flowWorkers = 1
		if cuda {
			// Two workers overlap one batch's kernel launches with another's kernels (H100,
			// docs/benchmarks/RESULTS.md).
			r.flowWorkers = 2
		}
	}
	if !o.VocoderBatchesSet && len(o.VocoderBatches) == 0 && cuda {
		// A vocoder fed chunks of every length changes shape on nearly every run.
		r.vocoderBatches = []int{1, 4, 16}
	}
	switch {
	case o.VocoderWindow == -1:
		r.vocoderWindow = 0
	case o.VocoderWindow > 0:
		r.vocoderWindow = o.VocoderWindow
	case cuda:
		r.vocoderWindow = -1
	}
	return r
}
