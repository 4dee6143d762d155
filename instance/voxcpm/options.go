package voxcpm

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Options are the voxcpm family's engine options, set under a group's `engine:`
// (docs/voxcpm.md, "Engine options") and checked when the config loads. The zero value of each is
// the default for the provider (resolveModes).
type Options struct {
	ort.Options
	// LMCUDAGraph is how the step graph runs. Unset: on with the CUDA provider (the captured step
	// ran 45 → 12 ms at one stream and 142 → 33 ms at 128 on an H100,
	// docs/benchmarks/2026-12-07-h100-voxcpm-step-graph/), falling back to off with a warning
	// when the load-time check finds a replay that differs from a plain run (an export from an
	// older exporter); off on the CPU.
	LMCUDAGraph StepGraph `json:"lm_cuda_graph"`
	// VocoderCUDAGraph is whether the VAE decoder runs its fixed batch sizes as CUDA graphs
	// captured at load, its convolutions planned by cuDNN's exhaustive search once per size. Unset:
	// off. VoxCPM 1.5's decoder faults when captured so on an H100 (CUDA error 716, misaligned
	// address, at 8, 128 and 256 slots); with cudnn_conv_algo_search DEFAULT its buckets capture
	// and replay as plain runs (TestGPUVAECapture, 8 slots), so the fault comes with an algorithm
	// the exhaustive search picks.
	VocoderCUDAGraph VAEGraph `json:"vocoder_cuda_graph"`
	// VocoderBatches takes [] only: the VAE decoder then runs every batch in its own shape rather
	// than in the step's batch sizes, as the staged family's vocoder does with []. Unset (nil):
	// the step's batch sizes.
	VocoderBatches []int `json:"vocoder_batches"`
	// VocoderSessions is how many ONNX Runtime sessions the uncaptured VAE decoder runs in:
	// "per_batch", a session for each of the step's batch sizes, each seeing one shape, so planned
	// once at load with cuDNN's exhaustive search on CUDA and never again; or "shared", one for
	// every batch size, its convolutions planned by the runtime's cudnn_conv_algo_search (DEFAULT
	// unless provider_options say otherwise), which ONNX Runtime plans again at every change of
	// batch size. Each per-batch session holds its own copy of the decoder's weights and its own
	// memory arena. Unset: per_batch on CUDA for groups of at most perBatchVAESlots streams (on an
	// H100 a one-row decode took 3.9 ms against 40.4 ms shared, 128 rows 58 against 180 ms),
	// shared for larger groups and on the CPU.
	VocoderSessions VAESessions `json:"vocoder_sessions"`
	// VocoderPrecision is the float type the VAE decoder computes in: "float32" (the default), or
	// "float16", the decoder graph converted in memory (vae.go), its inputs and outputs (the
	// carried state included) staying float32.
	VocoderPrecision engine.Precision `json:"vocoder_precision"`
}

// StepGraph is how the step graph runs (lm_cuda_graph).
type StepGraph string

const (
	// StepGraphOn runs the step in fixed batch sizes captured as CUDA graphs and replayed (on the
	// CPU, which has no graphs to capture, as StepGraphFixed). The config value decode means the
	// same: the step is the only graph that runs per patch.
	StepGraphOn StepGraph = "on"
	// StepGraphFixed runs the step in the same fixed batch sizes, bound once, without capturing.
	StepGraphFixed StepGraph = "fixed"
	// StepGraphOff runs every step in its own shape through ONNX Runtime.
	StepGraphOff StepGraph = "off"
)

func (g *StepGraph) UnmarshalText(b []byte) error {
	v, err := engine.ParseEnum(b, StepGraphOn, "decode", StepGraphFixed, StepGraphOff)
	if v == "decode" {
		v = StepGraphOn
	}
	*g = v
	return err
}

// VAEGraph is whether the VAE decoder runs as CUDA graphs (vocoder_cuda_graph).
type VAEGraph string

const (
	// VAEGraphOn captures the decoder's fixed batch sizes as CUDA graphs (on CUDA only).
	VAEGraphOn VAEGraph = "on"
	// VAEGraphOff runs the decoder uncaptured.
	VAEGraphOff VAEGraph = "off"
)

func (g *VAEGraph) UnmarshalText(b []byte) (err error) {
	*g, err = engine.ParseEnum(b, VAEGraphOn, VAEGraphOff)
	return err
}

// VAESessions is how many sessions the uncaptured VAE decoder runs in (vocoder_sessions).
type VAESessions string

const (
	// VAESessionsShared runs every batch size in one session.
	VAESessionsShared VAESessions = "shared"
	// VAESessionsPerBatch runs each batch size in a session of its own.
	VAESessionsPerBatch VAESessions = "per_batch"
)

func (v *VAESessions) UnmarshalText(b []byte) (err error) {
	*v, err = engine.ParseEnum(b, VAESessionsShared, VAESessionsPerBatch)
	return err
}

// Name is the family's name, the Kind of its descriptions.
func (Family) Name() string { return Kind }

// OptionKeys are the keys of Options.
func (Family) OptionKeys() []string { return engine.OptionKeys(Options{}) }

// ParseOptions parses and checks a group's engine section.
func (Family) ParseOptions(section tts.EngineSection) (any, error) { return parseOptions(section) }

func parseOptions(section tts.EngineSection) (Options, error) {
	return engine.Parse[Options](Kind, section)
}

// Validate checks the options together; the error is a *tts.OptionError naming the first bad
// one.
func (o Options) Validate() error {
	if err := o.Options.Validate(); err != nil {
		return err
	}
	if len(o.VocoderBatches) > 0 {
		return &tts.OptionError{Key: "vocoder_batches",
			Msg: fmt.Sprintf("%v: voxcpm's VAE decoder runs in the step's batch sizes; only [] (every batch in its own shape) applies", o.VocoderBatches)}
	}
	if o.plainVAE() && o.VocoderCUDAGraph == VAEGraphOn {
		return &tts.OptionError{Key: "vocoder_cuda_graph",
			Msg: "on captures the VAE decoder's fixed batch sizes, which vocoder_batches: [] turns off"}
	}
	if o.VocoderSessions == VAESessionsPerBatch {
		if o.plainVAE() {
			return &tts.OptionError{Key: "vocoder_sessions",
				Msg: "per_batch runs each of the VAE decoder's fixed batch sizes in its own session, which vocoder_batches: [] turns off"}
		}
		if o.VocoderCUDAGraph == VAEGraphOn {
			return &tts.OptionError{Key: "vocoder_sessions",
				Msg: "per_batch is for the uncaptured decoder; with vocoder_cuda_graph: on each batch size is already planned once, at its capture"}
		}
	}
	return nil
}

// plainVAE reports whether the VAE decoder runs every batch in its own shape rather than in the
// step's buckets: vocoder_batches set to [].
func (o Options) plainVAE() bool { return o.VocoderBatches != nil && len(o.VocoderBatches) == 0 }
