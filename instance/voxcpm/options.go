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
	// LMCUDAGraph is how the step graph runs. Unset: off, as on an H100 the captured step
	// replays NaN (docs/benchmarks/2026-11-27-h100-voxcpm/), which the load-time check refuses.
	LMCUDAGraph StepGraph `json:"lm_cuda_graph"`
	// VocoderCUDAGraph is whether the VAE decoder runs its fixed batch sizes as CUDA graphs
	// captured at load, its convolutions planned by cuDNN's exhaustive search once per size. Unset:
	// what LMCUDAGraph says (on captures the decoder too).
	VocoderCUDAGraph VAEGraph `json:"vocoder_cuda_graph"`
	// VocoderBatches takes [] only: the VAE decoder then runs every batch in its own shape rather
	// than in the step's batch sizes, as the staged family's vocoder does with []. Unset (nil):
	// the step's batch sizes.
	VocoderBatches []int `json:"vocoder_batches"`
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
	return nil
}

// plainVAE reports whether the VAE decoder runs every batch in its own shape rather than in the
// step's buckets: vocoder_batches set to [].
func (o Options) plainVAE() bool { return o.VocoderBatches != nil && len(o.VocoderBatches) == 0 }
