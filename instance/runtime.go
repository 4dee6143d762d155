package instance

import (
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/instance/iobind"

	ort "github.com/yalue/onnxruntime_go"
)

// runtime owns the ONNX Runtime environment and the session options of one instance process.
type runtime struct {
	lmPriority bool // the LM on a high-priority CUDA stream (provider option lm_stream_priority)
	// profile is the path prefix of ONNX Runtime's per-session profiles (provider option
	// profile); empty: no profiling.
	profile  string
	opts     *ort.SessionOptions
	provider string
	device   int
	// cudaOpts are the CUDA provider options in force, for sessions made outside onnxruntime_go.
	cudaOpts map[string]string
	// convSearchSet: provider_options chose cudnn_conv_algo_search, for every session.
	convSearchSet bool
	// sdpaSet: provider_options chose sdpa_kernel (ONNX Runtime's attention kernels), for every
	// session.
	sdpaSet bool
	// nhwcSet: provider_options chose prefer_nhwc (channels-last convolutions), for every session.
	nhwcSet bool
	intraOp int // intra_op_num_threads, 0: ONNX Runtime's default
	// vocoderBatches are the batch sizes of the vocoder's fixed-shape sessions (provider option
	// vocoder_batches); none: one session takes every shape.
	vocoderBatches []int
	// vocoderWindow is provider option vocoder_window: the most mel frames the vocoder runs
	// in one item; longer items run as overlapping windows. 0: never split; -1: the default
	// for the provider (defaultVocoderWindow).
	vocoderWindow int
	// flowWorkers is the number of flow batches that run at once, each in its own sessions
	// (provider option flow_workers).
	flowWorkers int
	// flowShare is provider option flow_first_worker "share": every flow worker takes batches of
	// later chunks, rather than one being kept for first chunks (flowLanes).
	flowShare bool
	// lmGraph is provider option lm_cuda_graph: "decode" runs the LM's decode steps as CUDA
	// graphs, "on" its decode steps and prefills; "fixed" runs both in the graphs' fixed shapes
	// without capturing them (to tell the graphs' effect on results from the shapes'); "off" lets
	// ONNX Runtime run any shape; empty: lmGraphMode decides.
	lmGraph string
	// flowGraph is provider option flow_cuda_graph, for a manifest with a flow step graph: "on"
	// runs each Euler step of a batch of a bucket's shape as a CUDA graph, "fixed" runs the
	// buckets' shapes without capturing them, "off" runs every batch in its own shape; empty:
	// flowGraphMode decides.
	flowGraph string
	library   string
}

// newRuntime loads libonnxruntime and prepares session options for the provider. ONNX Runtime's
// environment is per process, so an instance process loads exactly one pipeline.
func newRuntime(cfg LoadConfig, device int) (*runtime, error) {
	if cfg.ORTLibrary == "" {
		return nil, fmt.Errorf("onnxruntime: no library path given")
	}
	if !ort.IsInitialized() {
		ort.SetSharedLibraryPath(cfg.ORTLibrary)
		if err := ort.InitializeEnvironment(ort.WithLogLevelError()); err != nil {
			return nil, fmt.Errorf("onnxruntime: cannot load %s: %w", cfg.ORTLibrary, err)
		}
	}
	r := &runtime{lmPriority: true, provider: cfg.Provider, device: device, library: cfg.ORTLibrary, flowWorkers: 1}
	flowSet := false
	rest := map[string]string{}
	vocSet := false
	vocWindowSet := false
	for k, v := range cfg.ProviderOptions {
		switch k {
		case "vocoder_batches":
			vocSet = true
			var err error
			if r.vocoderBatches, err = parseBatches(v); err != nil {
				return nil, fmt.Errorf("provider option vocoder_batches: %w", err)
			}
		case "vocoder_window":
			vocWindowSet = true
			if v == "off" {
				r.vocoderWindow = 0
				break
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("provider option vocoder_window: %q is not a number of mel frames (or off)", v)
			}
			r.vocoderWindow = n
		case "profile":
			if v == "" {
				return nil, fmt.Errorf("provider option profile: give a path prefix for the profile files")
			}
			r.profile = v
		case "lm_stream_priority":
			if v != "high" && v != "normal" {
				return nil, fmt.Errorf("provider option lm_stream_priority: %q is not high or normal", v)
			}
			r.lmPriority = v == "high"
		case "lm_cuda_graph":
			if v != "on" && v != "decode" && v != "off" && v != "fixed" {
				return nil, fmt.Errorf("provider option lm_cuda_graph: %q is not on, decode, off or fixed", v)
			}
			r.lmGraph = v
		case "flow_cuda_graph":
			if v != "on" && v != "fixed" && v != "off" {
				return nil, fmt.Errorf("provider option flow_cuda_graph: %q is not on, fixed or off", v)
			}
			r.flowGraph = v
		case "flow_workers":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 8 {
				return nil, fmt.Errorf("provider option flow_workers: %q is not a number of workers from 1 to 8", v)
			}
			r.flowWorkers, flowSet = n, true
		case "flow_first_worker":
			if v != "keep" && v != "share" {
				return nil, fmt.Errorf("provider option flow_first_worker: %q is not keep or share", v)
			}
			r.flowShare = v == "share"
		case "intra_op_num_threads":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("provider option intra_op_num_threads: %q is not a thread count", v)
			}
			r.intraOp = n
		default:
			rest[k] = v
		}
	}
	switch cfg.Provider {
	case "cpu", "":
		if len(rest) > 0 {
			return nil, fmt.Errorf("provider cpu: unknown provider options %v", keys(rest))
		}
	case "cuda":
		// The instance sees only its group's GPUs (CUDA_VISIBLE_DEVICES), so device 0 is the group's first GPU.
		// DEFAULT: ONNX Runtime 1.29 plans every convolution again (cuDNN frontend) whenever a
		// session's input shape changes, which streaming chunks keep doing; DEFAULT's fallback
		// engines plan in about a millisecond, EXHAUSTIVE's heuristics in about a second, and
		// HEURISTIC failed to initialise for a dilated convolution of the benchmark vocoder (cuDNN
		// 9.14, H200). Fixed-shape sessions use EXHAUSTIVE (fixedShapeSession). provider_options
		// can choose another.
		// cudnn_conv1d_pad_to_nc1d: the vocoder's 1-D convolutions as [N,C,1,D] for cuDNN rather
		// than [N,C,D,1] ran its chunks up to 1.5× faster and the server 5% faster (H100,
		// docs/benchmarks/RESULTS.md, session 11).
		o := map[string]string{"device_id": strconv.Itoa(device), "cudnn_conv_algo_search": "DEFAULT",
			"cudnn_conv1d_pad_to_nc1d": "1"}
		maps.Copy(o, rest)
		if cfg.GPUMemoryLimit != "" {
			limit, err := memoryLimit(cfg.GPUMemoryLimit, device)
			if err != nil {
				return nil, err
			}
			o["gpu_mem_limit"] = strconv.FormatUint(limit, 10)
		}
		r.cudaOpts = o
		_, r.convSearchSet = rest["cudnn_conv_algo_search"]
		_, r.sdpaSet = rest["sdpa_kernel"]
		_, r.nhwcSet = rest["prefer_nhwc"]
		if !vocSet {
			// A vocoder fed chunks of every length changes shape on nearly every run.
			r.vocoderBatches = []int{1, 4, 16}
		}
		if !vocWindowSet {
			r.vocoderWindow = -1
		}
		if !flowSet {
			// Measured on an H100 (docs/benchmarks/RESULTS.md, session 8).
			r.flowWorkers = 2
		}
	default:
		return nil, fmt.Errorf("provider %q is not one of cpu, cuda", cfg.Provider)
	}
	opts, err := r.sessionOptions(nil)
	if err != nil {
		return nil, err
	}
	r.opts = opts
	return r, nil
}

// sessionOptions makes session options for the runtime's provider, its CUDA provider options
// replaced by those in cuda.
func (r *runtime) sessionOptions(cuda map[string]string) (_ *ort.SessionOptions, err error) {
	opts, err := ort.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("onnxruntime: session options: %w", err)
	}
	defer func() {
		if err != nil {
			opts.Destroy()
		}
	}()
	if r.intraOp > 0 {
		if err := opts.SetIntraOpNumThreads(r.intraOp); err != nil {
			return nil, fmt.Errorf("onnxruntime: intra_op_num_threads: %w", err)
		}
	}
	if r.provider != "cuda" {
		return opts, nil
	}
	p, err := ort.NewCUDAProviderOptions()
	if err != nil {
		return nil, fmt.Errorf("cuda provider cannot be loaded (is libonnxruntime_providers_cuda.so beside %s, with CUDA 13 and cuDNN 9 on the library path?): %w", r.library, err)
	}
	defer p.Destroy()
	o := maps.Clone(r.cudaOpts)
	maps.Copy(o, cuda)
	if err := p.Update(o); err != nil {
		return nil, fmt.Errorf("cuda provider cannot be loaded with options %v (is libonnxruntime_providers_cuda.so beside %s, with CUDA 13 and cuDNN 9 on the library path? scripts/install-onnxruntime.sh --gpu installs it): %w", o, r.library, err)
	}
	if err := opts.AppendExecutionProviderCUDA(p); err != nil {
		return nil, fmt.Errorf("cuda provider cannot be loaded (is libonnxruntime_providers_cuda.so beside %s, with CUDA 13 and cuDNN 9 on the library path?): %w", r.library, err)
	}
	return opts, nil
}

// session loads file with the shared options; name tells its profile apart from the others'.
func (r *runtime) session(name, file string, inputs, outputs []string) (*ort.DynamicAdvancedSession, error) {
	return r.load(r.opts, name, file, inputs, outputs)
}

// fixedShapeSession loads file, with the CUDA provider options cuda, for a session that only
// ever sees one input shape. On CUDA its convolutions use cudnn_conv_algo_search EXHAUSTIVE (ONNX
// Runtime 1.29: cuDNN frontend's heuristics mode B): planning costs over a second per shape, paid
// once here, and the engines it picks ran the benchmark vocoder 3× faster than DEFAULT's fallback
// ones. provider_options' own cudnn_conv_algo_search wins.
func (r *runtime) fixedShapeSession(cuda map[string]string, name, file string, inputs, outputs []string) (*ort.DynamicAdvancedSession, error) {
	if r.provider != "cuda" || r.convSearchSet {
		return r.sessionWith(cuda, name, file, inputs, outputs)
	}
	o := map[string]string{"cudnn_conv_algo_search": "EXHAUSTIVE"}
	maps.Copy(o, cuda)
	return r.sessionWith(o, name, file, inputs, outputs)
}

// vocoderCUDAOptions are the vocoder sessions' own CUDA provider options: prefer_nhwc, so that
// ONNX Runtime runs the convolutions channels-last, the layout of cuDNN's fastest float16 kernels.
// It ran the benchmark vocoder's batches of 32 chunks, and of 16 long ones, 14–19% faster, and the
// server 2–4% faster (H100, docs/benchmarks/RESULTS.md, session 14). The vocoder's sessions
// alone: the flow's step graphs, given it, get layout nodes that ONNX Runtime leaves to the CPU,
// and then cannot be captured. provider_options' own prefer_nhwc wins, for every session.
func (r *runtime) vocoderCUDAOptions() map[string]string {
	if r.provider != "cuda" || r.nhwcSet {
		return nil
	}
	return map[string]string{"prefer_nhwc": "1"}
}

// efficientAttention is sdpa_kernel's value for ONNX Runtime's memory-efficient attention
// (AttentionBackend EFFICIENT_ATTENTION) alone, the unfused kernels left as the fallback.
const efficientAttention = "2"

// flowCUDAOptions are the flow sessions' own CUDA provider options. Left to choose, ONNX Runtime
// 1.29 ran the DiT's attention, which has a bias, through cuDNN's fused attention: slower at every
// shape measured, and it builds a cuDNN graph for each new shape, which a server's batches keep
// bringing (H100, bench stages: flow 32×15 223 → 98 ms fixed, 16×100 388 → 229 ms with a new
// length every run). provider_options' own sdpa_kernel wins.
func (r *runtime) flowCUDAOptions() map[string]string {
	if r.provider != "cuda" || r.sdpaSet {
		return nil
	}
	return map[string]string{"sdpa_kernel": efficientAttention}
}

// flowSession loads one of the flow's graphs with flowCUDAOptions.
func (r *runtime) flowSession(name, file string, inputs, outputs []string) (*ort.DynamicAdvancedSession, error) {
	return r.sessionWith(r.flowCUDAOptions(), name, file, inputs, outputs)
}

// sessionWith loads file with the shared options' CUDA provider options replaced by cuda; with
// none, it uses the shared options.
func (r *runtime) sessionWith(cuda map[string]string, name, file string, inputs, outputs []string) (*ort.DynamicAdvancedSession, error) {
	if len(cuda) == 0 {
		return r.session(name, file, inputs, outputs)
	}
	opts, err := r.sessionOptions(cuda)
	if err != nil {
		return nil, err
	}
	defer opts.Destroy()
	return r.load(opts, name, file, inputs, outputs)
}

func (r *runtime) load(opts *ort.SessionOptions, name, file string, inputs, outputs []string) (*ort.DynamicAdvancedSession, error) {
	if r.profile != "" {
		// Profiling is switched on for this session alone: ONNX Runtime names a profile by prefix
		// and second, and sessions made in the same second from shared options would collide.
		if err := opts.EnableProfiling(r.profilePrefix(name)); err != nil {
			return nil, fmt.Errorf("onnxruntime: profile: %w", err)
		}
		defer opts.DisableProfiling()
	}
	s, err := ort.NewDynamicAdvancedSession(file, inputs, outputs, opts)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", file, err)
	}
	return s, nil
}

// parseBatches reads "1,4,16" (ascending batch sizes) or "off".
func parseBatches(v string) ([]int, error) {
	if v == "off" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of batch sizes like 1,4,16 (or off)", v)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("%q: batch sizes must rise", v)
		}
		out = append(out, n)
	}
	return out, nil
}

// profilePrefix is where the session called name writes its profile ("" when not profiling).
// ONNX Runtime adds the time and ".json", and writes the file when the session is released.
func (r *runtime) profilePrefix(name string) string {
	if r.profile == "" {
		return ""
	}
	return r.profile + name
}

// placement is where sessions made through iobind compute.
func (r *runtime) placement() iobind.Placement {
	return iobind.Placement{CUDA: r.provider == "cuda", Device: r.device, ProviderOptions: r.cudaOpts}
}

// lmGraphMode is lm_cuda_graph for m's LM: as configured, else on where the graphs can run (CUDA,
// the shared cache): they made a decode step 2-3× faster and a prefill of one prompt 3× faster
// (docs/benchmarks/RESULTS.md).
func (r *runtime) lmGraphMode(m *Manifest) string {
	switch {
	case r.lmGraph != "":
		return r.lmGraph
	case r.provider == "cuda" && m.LM.Cache == "shared":
		return "on"
	}
	return "off"
}

// flowGraphMode is flow_cuda_graph: as configured, else on with CUDA, off on the CPU.
func (r *runtime) flowGraphMode() string {
	switch {
	case r.flowGraph != "":
		return r.flowGraph
	case r.provider == "cuda":
		return "on"
	}
	return "off"
}

// flowPlacement is where a flow session made through iobind runs (name tells its profile apart),
// with the flow's CUDA options; graphs: its runs may capture CUDA graphs.
func (r *runtime) flowPlacement(name string, graphs bool) iobind.Placement {
	p := r.placement()
	if o := r.flowCUDAOptions(); len(o) > 0 {
		p.ProviderOptions = maps.Clone(p.ProviderOptions)
		maps.Copy(p.ProviderOptions, o)
	}
	p.CUDAGraph = p.CUDA && graphs
	p.Profile = r.profilePrefix(name)
	return p
}

// lmPlacement is where the LM runs: its decode steps are short and on the path of every stream,
// so on CUDA they go ahead of the flow's and vocoder's long batches unless configured otherwise.
// graphs: the steps run as CUDA graphs (lm_cuda_graph on).
func (r *runtime) lmPlacement(graphs bool) iobind.Placement {
	p := r.placement()
	p.HighPriority = p.CUDA && r.lmPriority
	p.CUDAGraph = p.CUDA && graphs
	p.Profile = r.profilePrefix("lm")
	return p
}

func (r *runtime) close() {
	if r.opts != nil {
		r.opts.Destroy()
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// memoryLimit turns "8GiB", "1000" or a fraction like "0.4" into bytes for device.
func memoryLimit(s string, device int) (uint64, error) {
	b, frac, err := config.ParseMemoryLimit(s)
	if err != nil {
		return 0, fmt.Errorf("gpu_memory_limit: %w", err)
	}
	if frac == 0 {
		return b, nil
	}
	for _, g := range CUDADevices() {
		if g.Index == device {
			return uint64(frac * float64(g.MemoryTotal)), nil
		}
	}
	return 0, fmt.Errorf("gpu_memory_limit %s: cannot read the size of GPU %d to take a fraction of it", s, device)
}
