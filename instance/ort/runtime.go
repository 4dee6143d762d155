package ort

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"

	"github.com/voxmux/voxmux/instance/ort/iobind"
	"github.com/voxmux/voxmux/tts"

	onnxrt "github.com/yalue/onnxruntime_go"
)

// Options are the engine options every family has for its ONNX Runtime sessions; a family's
// Options embed them, so their keys sit beside the family's own under `engine:`.
type Options struct {
	// Profile is a path prefix for ONNX Runtime's per-session profiles; empty: no profiling.
	Profile string `json:"profile"`
	// IntraOpThreads is ONNX Runtime's intra_op_num_threads; 0: ONNX Runtime's default.
	IntraOpThreads int `json:"intra_op_num_threads"`
}

// Validate checks the options; the error is a *tts.OptionError.
func (o Options) Validate() error {
	if o.IntraOpThreads < 0 {
		return &tts.OptionError{Key: "intra_op_num_threads", Msg: fmt.Sprintf("%d is not a thread count", o.IntraOpThreads)}
	}
	return nil
}

// TelemetryEnv, set to 1 in voxmux's environment, lets ONNX Runtime's telemetry run (its events,
// a device id under $HOME/.cache/Microsoft/DeveloperTools and a debug log in the temp folder);
// by default it is off.
const TelemetryEnv = "VOXMUX_ORT_TELEMETRY"

// Runtime owns the ONNX Runtime environment and the session options of one instance process,
// on one device.
type Runtime struct {
	// profile is the path prefix of ONNX Runtime's per-session profiles; empty: no profiling.
	profile  string
	opts     *onnxrt.SessionOptions
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
	library string
}

// New loads libonnxruntime and prepares session options for cfg's provider on device, with the
// family's ONNX Runtime options o. ONNX Runtime's environment is per process, so an instance
// process loads exactly one model.
func New(cfg tts.LoadConfig, device int, o Options) (*Runtime, error) {
	if cfg.ORTLibrary == "" {
		return nil, fmt.Errorf("onnxruntime: no library path given")
	}
	if !onnxrt.IsInitialized() {
		telemetry := os.Getenv(TelemetryEnv) == "1"
		if !telemetry {
			// Read by the runtime when its environment is created: without it the runtime writes
			// a device id and an event queue under $HOME/.cache/Microsoft and a mat-debug log in
			// the temp folder, whatever DisableTelemetryEvents says later. cgo passes Setenv on
			// to the C environment.
			if err := os.Setenv("ORT_DISABLE_TELEMETRY", "1"); err != nil {
				return nil, fmt.Errorf("onnxruntime: turn telemetry off: %w", err)
			}
		}
		onnxrt.SetSharedLibraryPath(cfg.ORTLibrary)
		if err := onnxrt.InitializeEnvironment(onnxrt.WithLogLevelError()); err != nil {
			return nil, fmt.Errorf("onnxruntime: cannot load %s: %w", cfg.ORTLibrary, err)
		}
		if !telemetry {
			if err := onnxrt.DisableTelemetry(); err != nil {
				return nil, fmt.Errorf("onnxruntime: turn telemetry off: %w", err)
			}
		}
	}
	r := &Runtime{provider: cfg.Provider, device: device, library: cfg.ORTLibrary,
		profile: o.Profile, intraOp: o.IntraOpThreads}
	rest := cfg.ProviderOptions
	switch cfg.Provider {
	case "cpu", "":
		if len(rest) > 0 {
			return nil, fmt.Errorf("provider cpu: unknown provider options %v", slices.Sorted(maps.Keys(rest)))
		}
	case "cuda":
		// The instance sees only its group's GPUs (CUDA_VISIBLE_DEVICES), so device 0 is the group's first GPU.
		// DEFAULT: ONNX Runtime 1.29 plans every convolution again (cuDNN frontend) whenever a
		// session's input shape changes, which streaming chunks keep doing; DEFAULT's fallback
		// engines plan in about a millisecond, EXHAUSTIVE's heuristics in about a second, and
		// HEURISTIC failed to initialise for a dilated convolution of the benchmark vocoder (cuDNN
		// 9.14, H200). Fixed-shape sessions use EXHAUSTIVE (FixedShapeSession). provider_options
		// can choose another.
		// cudnn_conv1d_pad_to_nc1d: the vocoder's 1-D convolutions as [N,C,1,D] for cuDNN rather
		// than [N,C,D,1] ran its chunks up to 1.5× faster and the server 5% faster (H100,
		// docs/benchmarks/RESULTS.md).
		o := map[string]string{"device_id": strconv.Itoa(device), "cudnn_conv_algo_search": "DEFAULT",
			"cudnn_conv1d_pad_to_nc1d": "1"}
		maps.Copy(o, rest)
		if !cfg.GPUMemoryLimit.IsZero() {
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

// CUDA reports whether the runtime's sessions run on a GPU.
func (r *Runtime) CUDA() bool { return r.provider == "cuda" }

// Device is the CUDA device the runtime's sessions run on (0 on the CPU).
func (r *Runtime) Device() int { return r.device }

// DeviceMemory is the memory its sessions may take on their GPU: the group's gpu_memory_limit
// where set, else the device's size; 0 on the CPU or where neither is known.
func (r *Runtime) DeviceMemory() uint64 {
	if !r.CUDA() {
		return 0
	}
	if l, err := strconv.ParseUint(r.cudaOpts["gpu_mem_limit"], 10, 64); err == nil && l > 0 {
		return l
	}
	for _, g := range CUDADevices() {
		if g.Index == r.device {
			return g.MemoryTotal
		}
	}
	return 0
}

// sessionOptions makes session options for the runtime's provider, its CUDA provider options
// replaced by those in cuda.
func (r *Runtime) sessionOptions(cuda map[string]string) (*onnxrt.SessionOptions, error) {
	return r.newOptions(r.intraOp, r.provider == "cuda", cuda)
}

// newOptions makes session options with threads intra-op threads (0: ONNX Runtime's default) and,
// when onCUDA, the CUDA provider with the runtime's options replaced by those in cuda.
func (r *Runtime) newOptions(threads int, onCUDA bool, cuda map[string]string) (_ *onnxrt.SessionOptions, err error) {
	opts, err := onnxrt.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("onnxruntime: session options: %w", err)
	}
	defer func() {
		if err != nil {
			opts.Destroy()
		}
	}()
	if threads > 0 {
		if err := opts.SetIntraOpNumThreads(threads); err != nil {
			return nil, fmt.Errorf("onnxruntime: intra_op_num_threads: %w", err)
		}
	}
	if !onCUDA {
		return opts, nil
	}
	p, err := onnxrt.NewCUDAProviderOptions()
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
func (r *Runtime) Session(name, file string, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	return r.load(r.opts, name, file, inputs, outputs)
}

// fixedShapeSession loads file, with the CUDA provider options cuda, for a session that only
// ever sees one input shape. On CUDA its convolutions use cudnn_conv_algo_search EXHAUSTIVE (ONNX
// Runtime 1.29: cuDNN frontend's heuristics mode B): planning costs over a second per shape, paid
// once here, and the engines it picks ran the benchmark vocoder 3× faster than DEFAULT's fallback
// ones. provider_options' own cudnn_conv_algo_search wins.
func (r *Runtime) FixedShapeSession(cuda map[string]string, name, file string, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	o := r.FixedShapeCUDAOptions()
	if o == nil {
		return r.SessionWith(cuda, name, file, inputs, outputs)
	}
	maps.Copy(o, cuda)
	return r.SessionWith(o, name, file, inputs, outputs)
}

// FixedShapeCUDAOptions are the CUDA provider options of a session whose convolutions see each of
// their input shapes planned once (FixedShapeSession, or captured graphs): cuDNN's exhaustive
// search. nil on the CPU or when provider_options choose the search.
func (r *Runtime) FixedShapeCUDAOptions() map[string]string {
	if r.provider != "cuda" || r.convSearchSet {
		return nil
	}
	return map[string]string{"cudnn_conv_algo_search": "EXHAUSTIVE"}
}

// vocoderCUDAOptions are the vocoder sessions' own CUDA provider options: prefer_nhwc, so that
// ONNX Runtime runs the convolutions channels-last, the layout of cuDNN's fastest float16 kernels.
// It ran the benchmark vocoder's batches of 32 chunks, and of 16 long ones, 14–19% faster, and the
// server 2–4% faster (H100, voxmux 15f3f2f against 808a4e3). The vocoder's sessions
// alone: the flow's step graphs, given it, get layout nodes that ONNX Runtime leaves to the CPU,
// and then cannot be captured. provider_options' own prefer_nhwc wins, for every session.
func (r *Runtime) VocoderCUDAOptions() map[string]string {
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
func (r *Runtime) FlowCUDAOptions() map[string]string {
	if r.provider != "cuda" || r.sdpaSet {
		return nil
	}
	return map[string]string{"sdpa_kernel": efficientAttention}
}

// flowSession loads one of the flow's graphs with flowCUDAOptions.
func (r *Runtime) FlowSession(name, file string, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	return r.SessionWith(r.FlowCUDAOptions(), name, file, inputs, outputs)
}

// sessionWith loads file with the shared options' CUDA provider options replaced by cuda; with
// none, it uses the shared options.
func (r *Runtime) SessionWith(cuda map[string]string, name, file string, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	if len(cuda) == 0 {
		return r.Session(name, file, inputs, outputs)
	}
	opts, err := r.sessionOptions(cuda)
	if err != nil {
		return nil, err
	}
	defer opts.Destroy()
	return r.load(opts, name, file, inputs, outputs)
}

func (r *Runtime) load(opts *onnxrt.SessionOptions, name, file string, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	return r.open(opts, name, file, func() (*onnxrt.DynamicAdvancedSession, error) {
		return onnxrt.NewDynamicAdvancedSession(file, inputs, outputs, opts)
	})
}

// open makes a session with opts through create, profiled when the runtime profiles; what names
// the graph (its file, or the name of one held in memory) in an error.
func (r *Runtime) open(opts *onnxrt.SessionOptions, name, what string, create func() (*onnxrt.DynamicAdvancedSession, error)) (*onnxrt.DynamicAdvancedSession, error) {
	if r.profile != "" {
		// Profiling is switched on for this session alone: ONNX Runtime names a profile by prefix
		// and second, and sessions made in the same second from shared options would collide.
		if err := opts.EnableProfiling(r.ProfilePrefix(name)); err != nil {
			return nil, fmt.Errorf("onnxruntime: profile: %w", err)
		}
		defer opts.DisableProfiling()
	}
	s, err := create()
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", what, err)
	}
	return s, nil
}

// profilePrefix is where the session called name writes its profile ("" when not profiling).
// ONNX Runtime adds the time and ".json", and writes the file when the session is released.
func (r *Runtime) ProfilePrefix(name string) string {
	if r.profile == "" {
		return ""
	}
	return r.profile + name
}

// placement is where sessions made through iobind compute.
func (r *Runtime) Placement() iobind.Placement {
	return iobind.Placement{CUDA: r.provider == "cuda", Device: r.device, ProviderOptions: r.cudaOpts}
}

// flowPlacement is where a flow session made through iobind runs (name tells its profile apart),
// with the flow's CUDA options; graphs: its runs may capture CUDA graphs.
func (r *Runtime) FlowPlacement(name string, graphs bool) iobind.Placement {
	p := r.Placement()
	if o := r.FlowCUDAOptions(); len(o) > 0 {
		p.ProviderOptions = maps.Clone(p.ProviderOptions)
		maps.Copy(p.ProviderOptions, o)
	}
	p.CUDAGraph = p.CUDA && graphs
	p.Profile = r.ProfilePrefix(name)
	return p
}

// lmPlacement is where the LM runs: its decode steps are short and on the path of every stream,
// so on CUDA they go ahead of the flow's and vocoder's long batches unless configured otherwise.
// graphs: the steps run as CUDA graphs (lm_cuda_graph on).
func (r *Runtime) LMPlacement(graphs, highPriority bool) iobind.Placement {
	p := r.Placement()
	p.HighPriority = p.CUDA && highPriority
	p.CUDAGraph = p.CUDA && graphs
	p.Profile = r.ProfilePrefix("lm")
	return p
}

func (r *Runtime) Close() {
	if r.opts != nil {
		r.opts.Destroy()
	}
}

// memoryLimit turns a limit into bytes for device.
func memoryLimit(l tts.MemoryLimit, device int) (uint64, error) {
	if l.Fraction == 0 {
		return l.Bytes, nil
	}
	for _, g := range CUDADevices() {
		if g.Index == device {
			return uint64(l.Fraction * float64(g.MemoryTotal)), nil
		}
	}
	return 0, fmt.Errorf("gpu_memory_limit %g: cannot read the size of GPU %d to take a fraction of it", l.Fraction, device)
}

// SessionFromData loads a graph held in memory (one a model family edited after reading it) with
// the shared options; name tells its profile apart.
func (r *Runtime) SessionFromData(name string, data []byte, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	return r.loadData(r.opts, name, data, inputs, outputs)
}

// SessionFromDataWith loads a graph held in memory with the shared options' CUDA provider options
// replaced by cuda; with none, it uses the shared options.
func (r *Runtime) SessionFromDataWith(cuda map[string]string, name string, data []byte, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	if len(cuda) == 0 {
		return r.SessionFromData(name, data, inputs, outputs)
	}
	opts, err := r.sessionOptions(cuda)
	if err != nil {
		return nil, err
	}
	defer opts.Destroy()
	return r.loadData(opts, name, data, inputs, outputs)
}

// CPUSessionFromData loads a graph held in memory on ONNX Runtime's CPU provider, whatever the
// runtime's provider, with threads intra-op threads (0: ONNX Runtime's default, one a physical
// core); name tells its profile apart. Its inputs and outputs are host tensors, as those of every
// session made here, so its outputs can feed a CUDA session directly.
func (r *Runtime) CPUSessionFromData(threads int, name string, data []byte, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	opts, err := r.newOptions(threads, false, nil)
	if err != nil {
		return nil, err
	}
	defer opts.Destroy()
	return r.loadData(opts, name, data, inputs, outputs)
}

func (r *Runtime) loadData(opts *onnxrt.SessionOptions, name string, data []byte, inputs, outputs []string) (*onnxrt.DynamicAdvancedSession, error) {
	return r.open(opts, name, name, func() (*onnxrt.DynamicAdvancedSession, error) {
		return onnxrt.NewDynamicAdvancedSessionWithONNXData(data, inputs, outputs, opts)
	})
}
