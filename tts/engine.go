package tts

import "fmt"

// EngineOptions are the engine's own switches for one group, set under `engine:` in a group's
// config and checked when the config loads (Validate). The zero value is the engine's default for
// the provider; each field says what that default is and why.
type EngineOptions struct {
	// VocoderBatches are the batch sizes of the vocoder's fixed-shape sessions, rising. Unset:
	// [1, 4, 16] on CUDA, where a vocoder fed chunks of every length would change shape on nearly
	// every run; none on the CPU. An empty list ([]) runs every shape in one session.
	VocoderBatches []int `yaml:"vocoder_batches"`
	// VocoderBatchesSet tells an empty VocoderBatches ([]) from an unset one.
	VocoderBatchesSet bool `yaml:"-"`
	// VocoderWindow is the most mel frames the vocoder runs in one item; longer items run as
	// overlapping windows. 0: the provider's default; -1: never split.
	VocoderWindow int `yaml:"vocoder_window"`
	// Profile is a path prefix for ONNX Runtime's per-session profiles; empty: no profiling.
	Profile string `yaml:"profile"`
	// LMStreamPriority is "high" (the default: the LM's short decode steps, on the path of every
	// stream, go ahead of the flow's and vocoder's long batches on CUDA) or "normal".
	LMStreamPriority string `yaml:"lm_stream_priority"`
	// LMCUDAGraph is "decode" (the LM's decode steps run as CUDA graphs), "on" (its decode steps
	// and prefills), "fixed" (both in the graphs' fixed shapes without capturing them, to tell the
	// graphs' effect on results from the shapes'), or "off". Empty: "on" on CUDA with the shared
	// cache, else "off".
	LMCUDAGraph string `yaml:"lm_cuda_graph"`
	// FlowCUDAGraph is "on" (each Euler step of a batch of a captured shape runs as a CUDA graph),
	// "fixed" (the captured shapes, run without capturing) or "off". Empty: "on" on CUDA, "off"
	// on the CPU.
	FlowCUDAGraph string `yaml:"flow_cuda_graph"`
	// VocoderCUDAGraph is "on" (a voxcpm model's VAE decoder runs its fixed batch sizes as CUDA
	// graphs captured at load, its convolutions planned by cuDNN's exhaustive search once per
	// size) or "off". Empty: what lm_cuda_graph says ("on" captures the decoder too). The staged
	// family's vocoder runs uncaptured and refuses "on".
	VocoderCUDAGraph string `yaml:"vocoder_cuda_graph"`
	// FlowWorkers is the number of flow batches that run at once, each in its own sessions, 1
	// to 8. 0: 2 on CUDA (P95 time to first audio at 64 streams 972 → 869 ms on an H100), 1 on
	// the CPU.
	FlowWorkers int `yaml:"flow_workers"`
	// FlowFirstWorker is "keep" (the default: with several flow workers, one is kept for new
	// streams' first chunks) or "share" (every worker takes batches of later chunks: 4% more
	// throughput at 128 streams on an H100, a longer wait for first audio).
	FlowFirstWorker string `yaml:"flow_first_worker"`
	// IntraOpThreads is ONNX Runtime's intra_op_num_threads; 0: ONNX Runtime's default.
	IntraOpThreads int `yaml:"intra_op_num_threads"`
	// ExactBatches lets a flow or vocoder batch take only items of one length, so no item runs
	// padded and a request's audio does not depend on what runs beside it: on the CPU with
	// intra_op_num_threads 1, a seeded request beside others is byte-identical to it alone.
	// Off (the default), items within a third of each other's length share a batch: a chunk padded
	// to a longer one rounds ONNX Runtime's sums differently (about 5e-7 on models/tiny).
	ExactBatches bool `yaml:"exact_batches"`

	// PiperBatch is the most sentences of one Piper voice run as one graph run, 1 to 1024 (1: no
	// batching). 0: 64 on CUDA, 1 on the CPU (docs/piper.md, "Batching").
	PiperBatch int `yaml:"piper_batch"`
	// PiperWorkers is how many graph runs of one Piper voice run at once, 1 to 256. 0: 2 on CUDA
	// (one run's host work overlaps the other's kernels), max_inflight on the CPU.
	PiperWorkers int `yaml:"piper_workers"`
	// PiperQueue is how many sentences may wait per Piper voice before requests are refused as
	// busy (HTTP 429), 1 to 1048576. 0: 1024.
	PiperQueue int `yaml:"piper_queue"`
}

// OptionError is an invalid engine option: Key is its name under `engine:`.
type OptionError struct {
	Key string
	Msg string
}

func (e *OptionError) Error() string { return "engine." + e.Key + ": " + e.Msg }

// Validate checks every option; the error is an *OptionError naming the first bad one.
func (o EngineOptions) Validate() error {
	for i, n := range o.VocoderBatches {
		if n < 1 {
			return &OptionError{"vocoder_batches", fmt.Sprintf("%d is not a batch size", n)}
		}
		if i > 0 && n <= o.VocoderBatches[i-1] {
			return &OptionError{"vocoder_batches", fmt.Sprintf("%v: batch sizes must rise", o.VocoderBatches)}
		}
	}
	if o.VocoderWindow < -1 {
		return &OptionError{"vocoder_window", fmt.Sprintf("%d is not a number of mel frames (or -1: never split)", o.VocoderWindow)}
	}
	if err := oneOf("lm_stream_priority", o.LMStreamPriority, "high", "normal"); err != nil {
		return err
	}
	if err := oneOf("lm_cuda_graph", o.LMCUDAGraph, "on", "decode", "off", "fixed"); err != nil {
		return err
	}
	if err := oneOf("flow_cuda_graph", o.FlowCUDAGraph, "on", "fixed", "off"); err != nil {
		return err
	}
	if err := oneOf("vocoder_cuda_graph", o.VocoderCUDAGraph, "on", "off"); err != nil {
		return err
	}
	if o.FlowWorkers < 0 || o.FlowWorkers > 8 {
		return &OptionError{"flow_workers", fmt.Sprintf("%d is not a number of workers from 1 to 8", o.FlowWorkers)}
	}
	if err := oneOf("flow_first_worker", o.FlowFirstWorker, "keep", "share"); err != nil {
		return err
	}
	if o.IntraOpThreads < 0 {
		return &OptionError{"intra_op_num_threads", fmt.Sprintf("%d is not a thread count", o.IntraOpThreads)}
	}
	for _, r := range []struct {
		key     string
		v, most int
	}{{"piper_batch", o.PiperBatch, 1024}, {"piper_workers", o.PiperWorkers, 256}, {"piper_queue", o.PiperQueue, 1 << 20}} {
		if r.v < 0 || r.v > r.most {
			return &OptionError{r.key, fmt.Sprintf("%d is not a number from 1 to %d", r.v, r.most)}
		}
	}
	return nil
}

func oneOf(key, v string, allowed ...string) error {
	if v == "" {
		return nil
	}
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return &OptionError{key, fmt.Sprintf("%q is not one of %v", v, allowed)}
}
