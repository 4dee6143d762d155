package staged

import (
	"cmp"
	"fmt"
	"math"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Options are the staged family's engine options, set under a group's `engine:`
// (docs/pipeline.md, "Engine options") and checked when the config loads. The zero value of
// each is the default for the provider (resolveOptions); each field says what that is and why.
type Options struct {
	ort.Options
	// VocoderBatches are the batch sizes of the vocoder's fixed-shape sessions, rising. Unset
	// (nil): [1, 4, 16] on CUDA, where a vocoder fed chunks of every length would change shape on
	// nearly every run; none on the CPU. An empty list ([]) runs every shape in one session.
	VocoderBatches []int `json:"vocoder_batches"`
	// VocoderWindow is the most mel frames the vocoder runs in one item; longer items run as
	// overlapping windows. 0: the provider's default (on CUDA the longest of the engine's chunk
	// lengths up to 160 frames, on the CPU never split); NeverSplit (-1): never split.
	VocoderWindow int `json:"vocoder_window"`
	// LMStreamPriority is the CUDA stream priority of the LM's runs. Unset: high.
	LMStreamPriority StreamPriority `json:"lm_stream_priority"`
	// LMCUDAGraph is which of the LM's runs are CUDA graphs. Unset: on on CUDA with the shared
	// cache (a decode step 2-3× faster and a prefill of one prompt 3×, docs/benchmarks/RESULTS.md),
	// else off.
	LMCUDAGraph LMGraph `json:"lm_cuda_graph"`
	// FlowCUDAGraph is whether the flow's Euler steps are CUDA graphs. Unset: on on CUDA, off on
	// the CPU.
	FlowCUDAGraph FlowGraph `json:"flow_cuda_graph"`
	// VocoderCUDAGraph is accepted as off only: this family's vocoder runs uncaptured (a voxcpm
	// model's VAE decoder is the one captured).
	VocoderCUDAGraph VocoderGraph `json:"vocoder_cuda_graph"`
	// FlowWorkers is the number of flow batches that run at once, each in its own sessions, 1
	// to 8. 0: 2 on CUDA (P95 time to first audio at 64 streams 972 → 869 ms on an H100), 1 on
	// the CPU.
	FlowWorkers int `json:"flow_workers"`
	// FlowFirstWorker is whether one flow worker is kept for new streams' first chunks. Unset:
	// keep.
	FlowFirstWorker FirstWorker `json:"flow_first_worker"`
	// ExactBatches lets a flow or vocoder batch take only items of one length, so no item runs
	// padded and a request's audio does not depend on what runs beside it: on the CPU with
	// intra_op_num_threads 1, a seeded request beside others is byte-identical to it alone.
	// Off (the default), items within a third of each other's length share a batch: a chunk padded
	// to a longer one rounds ONNX Runtime's sums differently (about 5e-7 on models/tiny).
	ExactBatches bool `json:"exact_batches"`
	// FlowPromptCacheMB bounds, in MiB, the voice prompts' keys and values that a model with the
	// chunk-causal flow (flow.chunk_step) keeps between requests (docs/cosyvoice3.md, "Prompt
	// cache"); the least recently used voice goes first. 0: 8192 on CUDA (22 five-second voices of
	// CosyVoice3-0.5B at 360 MB each), 1024 on the CPU, at most a quarter of flow_kv_memory_mb.
	// Ignored without flow.chunk_step.
	FlowPromptCacheMB int `json:"flow_prompt_cache_mb"`
	// FlowKVMemoryMB bounds, in MiB, all the device memory a model with the chunk-causal flow
	// (flow.chunk_step) takes for keys and values: every stream's kept frames, the prompt cache
	// and each batch's padded past (docs/cosyvoice3.md, "Memory"). A batch that would pass it
	// waits for memory to free; a stream whose frames fit no more gives them up and computes them
	// again later. 0: on CUDA 40% of the group's gpu_memory_limit, or of the GPU where none is set
	// (24 GiB where the GPU's size cannot be read), lowered once the pipeline is loaded to what the
	// GPU has free less a quarter of it (Pipeline.fitFlowKV); 2048 on the CPU. The prompt cache's
	// default is then at most a quarter of it. Ignored without
	// flow.chunk_step.
	FlowKVMemoryMB int `json:"flow_kv_memory_mb"`
	// FlowChunkEmit is where a chunk-causal flow's chunks end. Unset: early.
	FlowChunkEmit ChunkEmit `json:"flow_chunk_emit"`
	// FlowChunkCUDAGraph is whether a chunk-causal flow's batches of up to flow_chunk_graph_rows
	// rows run in fixed shapes captured at load as CUDA graphs (docs/cosyvoice3.md, "CUDA
	// graphs"): on (fixed on the CPU), fixed (the same shapes uncaptured) or off (every batch in
	// its own shape). Unset: defaultChunkGraph (on on CUDA). Ignored without flow.chunk_step.
	FlowChunkCUDAGraph FlowGraph `json:"flow_chunk_cuda_graph"`
	// FlowChunkGraphRows is the most rows of a chunk-causal batch that runs in a fixed shape, 1 to
	// 16; larger batches run in their own shape. 0: 4.
	FlowChunkGraphRows int `json:"flow_chunk_graph_rows"`
	// LMMinTokensPerTextToken replaces the manifest's lm.min_tokens_per_text_token, the fewest
	// speech tokens a request's text token makes before the LM may end speech (CosyVoice's
	// min_token_text_ratio, 2). 0: the manifest's. A benchmark with random weights sets it: such
	// an LM ends speech as soon as it may, so its requests are as short as the minimum allows;
	// at 9 they are as long as English speech (docs/cosyvoice3.md, "Benchmarks"). With trained
	// weights a minimum above the model's own forces speech past its natural end.
	LMMinTokensPerTextToken float64 `json:"lm_min_tokens_per_text_token"`
}

// ChunkEmit is where the chunk-causal flow's chunks end (flow_chunk_emit).
type ChunkEmit string

const (
	// ChunkEmitEarly ends the first chunk after streaming.chunk_tokens' first entry (early first
	// audio, computed before its 50-frame chunk completes, so it may differ from CosyVoice's), then
	// every chunk on a chunk boundary.
	ChunkEmitEarly ChunkEmit = "early"
	// ChunkEmitCosyVoice ends every chunk on CosyVoice's own boundaries: the first hop padded so
	// that prompt and hop end on a chunk boundary, then every chunk boundary; every chunk then
	// equals CosyVoice's streaming run, but for the last, which CosyVoice's tts computes with full
	// attention (docs/cosyvoice3.md, "Chunk-causal flow").
	ChunkEmitCosyVoice ChunkEmit = "cosyvoice"
)

func (c *ChunkEmit) UnmarshalText(b []byte) (err error) {
	*c, err = engine.ParseEnum(b, ChunkEmitEarly, ChunkEmitCosyVoice)
	return err
}

// NeverSplit is the VocoderWindow that runs every vocoder item whole.
const NeverSplit = -1

// StreamPriority is the CUDA stream priority of the LM's runs (lm_stream_priority).
type StreamPriority string

const (
	// PriorityHigh runs the LM's short decode steps, on the path of every stream, ahead of the
	// flow's and vocoder's long batches on CUDA.
	PriorityHigh StreamPriority = "high"
	// PriorityNormal gives the LM an ordinary stream like the other stages.
	PriorityNormal StreamPriority = "normal"
)

func (p *StreamPriority) UnmarshalText(b []byte) (err error) {
	*p, err = engine.ParseEnum(b, PriorityHigh, PriorityNormal)
	return err
}

// LMGraph is which of the LM's runs are CUDA graphs (lm_cuda_graph).
type LMGraph string

const (
	// LMGraphOn runs the LM's decode steps and prefills as CUDA graphs.
	LMGraphOn LMGraph = "on"
	// LMGraphDecode runs the LM's decode steps as CUDA graphs, its prefills plainly.
	LMGraphDecode LMGraph = "decode"
	// LMGraphFixed runs decode steps and prefills in the graphs' fixed shapes without capturing
	// them, to tell the graphs' effect on results from the shapes'.
	LMGraphFixed LMGraph = "fixed"
	// LMGraphOff lets ONNX Runtime run every step in its own shape.
	LMGraphOff LMGraph = "off"
)

func (g *LMGraph) UnmarshalText(b []byte) (err error) {
	*g, err = engine.ParseEnum(b, LMGraphOn, LMGraphDecode, LMGraphOff, LMGraphFixed)
	return err
}

// decodeGraphs reports whether the LM's decode steps run as captured graphs.
func (g LMGraph) decodeGraphs() bool { return g == LMGraphOn || g == LMGraphDecode }

// fixedPrefills reports whether the LM's prefills run in the graphs' fixed shapes.
func (g LMGraph) fixedPrefills() bool { return g == LMGraphOn || g == LMGraphFixed }

// FlowGraph is whether the flow's Euler steps run as CUDA graphs (flow_cuda_graph).
type FlowGraph string

const (
	// FlowGraphOn runs each Euler step of a batch of a captured shape as a CUDA graph.
	FlowGraphOn FlowGraph = "on"
	// FlowGraphFixed runs the captured shapes without capturing them.
	FlowGraphFixed FlowGraph = "fixed"
	// FlowGraphOff runs every batch in its own shape.
	FlowGraphOff FlowGraph = "off"
)

func (g *FlowGraph) UnmarshalText(b []byte) (err error) {
	*g, err = engine.ParseEnum(b, FlowGraphOn, FlowGraphFixed, FlowGraphOff)
	return err
}

// VocoderGraph is vocoder_cuda_graph, which this family's uncaptured vocoder takes as off only.
type VocoderGraph string

// VocoderGraphOff runs the vocoder uncaptured.
const VocoderGraphOff VocoderGraph = "off"

func (g *VocoderGraph) UnmarshalText(b []byte) (err error) {
	if string(b) == "on" {
		return fmt.Errorf("the staged family's vocoder runs uncaptured; only voxcpm models capture theirs")
	}
	*g, err = engine.ParseEnum(b, VocoderGraphOff)
	return err
}

// FirstWorker is whether one flow worker is kept for new streams' first chunks
// (flow_first_worker).
type FirstWorker string

const (
	// FirstWorkerKeep keeps one of several flow workers for new streams' first chunks.
	FirstWorkerKeep FirstWorker = "keep"
	// FirstWorkerShare lets every worker take batches of later chunks: 4% more throughput at 128
	// streams on an H100, a longer wait for first audio.
	FirstWorkerShare FirstWorker = "share"
)

func (w *FirstWorker) UnmarshalText(b []byte) (err error) {
	*w, err = engine.ParseEnum(b, FirstWorkerKeep, FirstWorkerShare)
	return err
}

// Name is the family's name, the Kind of its descriptions.
func (Family) Name() string { return "staged" }

// OptionKeys are the keys of Options.
func (Family) OptionKeys() []string { return engine.OptionKeys(Options{}) }

// ParseOptions parses and checks a group's engine section.
func (Family) ParseOptions(section tts.EngineSection) (any, error) { return parseOptions(section) }

func parseOptions(section tts.EngineSection) (Options, error) {
	return engine.Parse[Options]("staged", section)
}

// Validate checks the options' ranges; the error is a *tts.OptionError naming the first bad one.
func (o Options) Validate() error {
	if err := o.Options.Validate(); err != nil {
		return err
	}
	for i, n := range o.VocoderBatches {
		if n < 1 {
			return &tts.OptionError{Key: "vocoder_batches", Msg: fmt.Sprintf("%d is not a batch size", n)}
		}
		if i > 0 && n <= o.VocoderBatches[i-1] {
			return &tts.OptionError{Key: "vocoder_batches", Msg: fmt.Sprintf("%v: batch sizes must rise", o.VocoderBatches)}
		}
	}
	if o.VocoderWindow < NeverSplit {
		return &tts.OptionError{Key: "vocoder_window", Msg: fmt.Sprintf("%d is not a number of mel frames (or -1: never split)", o.VocoderWindow)}
	}
	if o.FlowWorkers < 0 || o.FlowWorkers > 8 {
		return &tts.OptionError{Key: "flow_workers", Msg: fmt.Sprintf("%d is not a number of workers from 1 to 8", o.FlowWorkers)}
	}
	if o.FlowKVMemoryMB < 0 {
		return &tts.OptionError{Key: "flow_kv_memory_mb", Msg: fmt.Sprintf("%d is not a size in MiB", o.FlowKVMemoryMB)}
	}
	if o.FlowChunkGraphRows < 0 || o.FlowChunkGraphRows > 16 {
		return &tts.OptionError{Key: "flow_chunk_graph_rows", Msg: fmt.Sprintf("%d is not a number of rows from 1 to 16", o.FlowChunkGraphRows)}
	}
	if o.FlowPromptCacheMB < 0 {
		return &tts.OptionError{Key: "flow_prompt_cache_mb", Msg: fmt.Sprintf("%d is not a size in MiB", o.FlowPromptCacheMB)}
	}
	if !(o.LMMinTokensPerTextToken >= 0) || math.IsInf(o.LMMinTokensPerTextToken, 0) {
		return &tts.OptionError{Key: "lm_min_tokens_per_text_token", Msg: fmt.Sprintf("%v is not a number of speech tokens per text token (0 or more; 0: the manifest's)", o.LMMinTokensPerTextToken)}
	}
	return nil
}

// checkManifest checks the options that depend on the model: lm_min_tokens_per_text_token needs
// a manifest that bounds speech tokens per text token, and at most its maximum.
func (o Options) checkManifest(m *Manifest) error {
	if r := o.LMMinTokensPerTextToken; r > 0 {
		key := "lm_min_tokens_per_text_token"
		if m.LM.MaxTokensPerTextToken <= 0 {
			return &tts.OptionError{Key: key, Msg: "applies to a model whose manifest bounds speech tokens per text token (lm.max_tokens_per_text_token); this one bounds them per character"}
		}
		if r > m.LM.MaxTokensPerTextToken {
			return &tts.OptionError{Key: key, Msg: fmt.Sprintf("%v is more than the manifest's lm.max_tokens_per_text_token (%v)", r, m.LM.MaxTokensPerTextToken)}
		}
	}
	return nil
}

// options are the engine options resolved for a provider and a model: every default filled in.
type options struct {
	lmHighPriority bool
	lmGraph        LMGraph
	flowGraph      FlowGraph
	flowWorkers    int
	flowShare      bool
	vocoderBatches []int // the vocoder's fixed-shape batch sizes; none: one session takes every shape
	// vocoderWindow is the most mel frames the vocoder runs in one item, as Options.VocoderWindow:
	// 0 the vocoder's default window (defaultVocoderWindow), NeverSplit never split.
	vocoderWindow int
	exactBatches  bool // flow and vocoder batches of one item length (Options.ExactBatches)
	// promptCacheBytes bounds the chunk-causal flow's prompt cache (Options.FlowPromptCacheMB).
	promptCacheBytes int64
	// flowKVBytes bounds the chunk-causal flow's device memory (Options.FlowKVMemoryMB).
	flowKVBytes int64
	chunkEmit   ChunkEmit
	// chunkGraph is how the chunk-causal flow's small batches run (Options.FlowChunkCUDAGraph):
	// on only on CUDA; chunkGraphRows the most rows such a batch has.
	chunkGraph     FlowGraph
	chunkGraphRows int
	// minTokensPerTextToken is the LM's minimum speech tokens per text token: the option's, else
	// the manifest's lm.min_tokens_per_text_token.
	minTokensPerTextToken float64
}

// chunkGraphOnCUDA is flow_chunk_cuda_graph's default on CUDA: on. On an H100 (CosyVoice3-0.5B,
// float16) the captured chunk steps equal the uncaptured ones to 2.1e-4 relative rms, one row's
// flow run took 77.7 ms against 230.0 ms, and first audio at one stream came after 130 ms against
// 361 ms (TestChunkFlowGraphsOnGPU; docs/benchmarks/2026-12-07-h100-cosyvoice3-chunk-graphs/).
const chunkGraphOnCUDA = FlowGraphOn

// defaultChunkGraph is flow_chunk_cuda_graph's default: chunkGraphOnCUDA on CUDA, off on the CPU
// (nothing to capture; fixed shapes only pad).
func defaultChunkGraph(cuda bool) FlowGraph {
	if cuda {
		return chunkGraphOnCUDA
	}
	return FlowGraphOff
}

// flowKVBytes is the chunk-causal flow's memory bound (Options.FlowKVMemoryMB): the option's, else
// 40% of device (the bytes the flow's sessions may take on their GPU; 0: unknown), before fitFlowKV.
func flowKVBytes(o Options, cuda bool, device uint64) int64 {
	switch {
	case o.FlowKVMemoryMB > 0:
		return int64(o.FlowKVMemoryMB) << 20
	case !cuda:
		return 2048 << 20
	case device == 0:
		return 24 << 30
	}
	return int64(device) / 5 * 2
}

// setFlowKV sets the chunk-causal flow's memory bound for a GPU of device bytes (0: unknown) and
// keeps the prompt cache's default within a quarter of it.
func (r *options) setFlowKV(o Options, cuda bool, device uint64) {
	r.flowKVBytes = flowKVBytes(o, cuda, device)
	if o.FlowPromptCacheMB == 0 {
		r.promptCacheBytes = min(r.promptCacheBytes, r.flowKVBytes/4)
	}
}

func resolveOptions(o Options, cuda bool, m *Manifest) options {
	r := options{
		lmHighPriority:        o.LMStreamPriority != PriorityNormal,
		lmGraph:               o.LMCUDAGraph,
		flowGraph:             o.FlowCUDAGraph,
		flowWorkers:           o.FlowWorkers,
		flowShare:             o.FlowFirstWorker == FirstWorkerShare,
		vocoderBatches:        o.VocoderBatches,
		vocoderWindow:         o.VocoderWindow,
		exactBatches:          o.ExactBatches,
		chunkEmit:             o.FlowChunkEmit,
		chunkGraph:            cmp.Or(o.FlowChunkCUDAGraph, defaultChunkGraph(cuda)),
		chunkGraphRows:        cmp.Or(o.FlowChunkGraphRows, 4),
		minTokensPerTextToken: cmp.Or(o.LMMinTokensPerTextToken, m.LM.MinTokensPerTextToken),
	}
	mb := int64(o.FlowPromptCacheMB)
	if mb == 0 {
		mb = 1024
		if cuda {
			mb = 8192
		}
	}
	r.promptCacheBytes = mb << 20
	r.setFlowKV(o, cuda, 0)
	if r.lmGraph == "" {
		// The LM's graphs made a decode step 2-3× faster and a prefill of one prompt 3× faster
		// (docs/benchmarks/RESULTS.md); they need the shared cache.
		r.lmGraph = LMGraphOff
		if cuda && m.LM.Cache == "shared" {
			r.lmGraph = LMGraphOn
		}
	}
	if r.flowGraph == "" {
		r.flowGraph = FlowGraphOff
		if cuda {
			r.flowGraph = FlowGraphOn
		}
	}
	if r.chunkGraph == FlowGraphOn && !cuda {
		r.chunkGraph = FlowGraphFixed
	}
	if r.flowWorkers == 0 {
		r.flowWorkers = 1
		if cuda {
			// Two workers overlap one batch's kernel launches with another's kernels (H100,
			// docs/benchmarks/RESULTS.md).
			r.flowWorkers = 2
		}
	}
	if o.VocoderBatches == nil && cuda {
		// A vocoder fed chunks of every length changes shape on nearly every run.
		r.vocoderBatches = []int{1, 4, 16}
	}
	if r.vocoderWindow == 0 && !cuda {
		r.vocoderWindow = NeverSplit
	}
	return r
}
