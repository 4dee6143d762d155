package voxcpm

import (
	"strings"
	"testing"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// The engine section parses into typed options (decode is the step graph on, the step being the
// only graph per patch); values outside an enum and keys of the staged family are refused naming
// the key.
func TestParseOptions(t *testing.T) {
	o, err := parseOptions(tts.EngineSection(`{"lm_cuda_graph": "decode", "vocoder_cuda_graph": "off", "vocoder_batches": [], "vocoder_precision": "float16"}`))
	if err != nil || o.LMCUDAGraph != StepGraphOn || o.VocoderCUDAGraph != VAEGraphOff || !o.plainVAE() || o.VocoderPrecision != engine.Float16 {
		t.Fatalf("parsed %+v, %v", o, err)
	}
	if o, err = parseOptions(tts.EngineSection(`{"vocoder_sessions": "per_batch"}`)); err != nil || o.VocoderSessions != VAESessionsPerBatch {
		t.Fatalf("parsed %+v, %v", o, err)
	}
	for section, want := range map[string]string{
		`{"lm_cuda_graph": "yes"}`:                                      `engine.lm_cuda_graph: "yes" is not one of [on decode fixed off]`,
		`{"vocoder_cuda_graph": 1}`:                                     "engine.vocoder_cuda_graph: 1 is not a string",
		`{"vocoder_precision": "half"}`:                                 `engine.vocoder_precision: "half" is not one of [float32 float16]`,
		`{"flow_workers": 2}`:                                           "engine.flow_workers: unknown key; the voxcpm family's keys are " + strings.Join(Family{}.OptionKeys(), ", "),
		`{"vocoder_batches": [1, 4]}`:                                   "engine.vocoder_batches: [1 4]: voxcpm's VAE decoder runs in the step's batch sizes; only [] (every batch in its own shape) applies",
		`{"vocoder_sessions": "each"}`:                                  `engine.vocoder_sessions: "each" is not one of [shared per_batch]`,
		`{"vocoder_sessions": "per_batch", "vocoder_batches": []}`:      "engine.vocoder_sessions: per_batch runs each of the VAE decoder's fixed batch sizes in its own session, which vocoder_batches: [] turns off",
		`{"vocoder_sessions": "per_batch", "vocoder_cuda_graph": "on"}`: "engine.vocoder_sessions: per_batch is for the uncaptured decoder; with vocoder_cuda_graph: on each batch size is already planned once, at its capture",
	} {
		if _, err := parseOptions(tts.EngineSection(section)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", section, err, want)
		}
	}
}
