package instance

import (
	"fmt"
	"strconv"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/instance/iobind"

	ort "github.com/yalue/onnxruntime_go"
)

// runtime owns the ONNX Runtime environment and the session options of one instance process.
type runtime struct {
	lmPriority bool // the LM on a high-priority CUDA stream (provider option lm_stream_priority)
	opts       *ort.SessionOptions
	provider   string
	device     int
	// cudaOpts are the CUDA provider options in force, for sessions made outside onnxruntime_go.
	cudaOpts map[string]string
	library  string
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
	opts, err := ort.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("onnxruntime: session options: %w", err)
	}
	rest := map[string]string{}
	lmPriority := true
	for k, v := range cfg.ProviderOptions {
		switch k {
		case "lm_stream_priority":
			if v != "high" && v != "normal" {
				opts.Destroy()
				return nil, fmt.Errorf("provider option lm_stream_priority: %q is not high or normal", v)
			}
			lmPriority = v == "high"
		case "intra_op_num_threads":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				opts.Destroy()
				return nil, fmt.Errorf("provider option intra_op_num_threads: %q is not a thread count", v)
			}
			if err := opts.SetIntraOpNumThreads(n); err != nil {
				opts.Destroy()
				return nil, fmt.Errorf("onnxruntime: intra_op_num_threads: %w", err)
			}
		default:
			rest[k] = v
		}
	}
	var cudaOpts map[string]string
	switch cfg.Provider {
	case "cpu", "":
		if len(rest) > 0 {
			opts.Destroy()
			return nil, fmt.Errorf("provider cpu: unknown provider options %v", keys(rest))
		}
	case "cuda":
		cuda, err := ort.NewCUDAProviderOptions()
		if err != nil {
			opts.Destroy()
			return nil, fmt.Errorf("cuda provider cannot be loaded (is libonnxruntime_providers_cuda.so beside %s, with CUDA 13 and cuDNN 9 on the library path?): %w", cfg.ORTLibrary, err)
		}
		defer cuda.Destroy()
		// The instance sees only its group's GPUs (CUDA_VISIBLE_DEVICES), so device 0 is the group's first GPU.
		// DEFAULT (a fixed algorithm): with EXHAUSTIVE, ONNX Runtime's default, cuDNN benchmarks
		// every convolution again for each new frame count, which streaming chunks keep producing;
		// HEURISTIC failed to initialise cuDNN's frontend for a dilated convolution of the
		// benchmark vocoder (ORT 1.29, cuDNN 9.14, H200). provider_options can choose another.
		o := map[string]string{"device_id": strconv.Itoa(device), "cudnn_conv_algo_search": "DEFAULT"}
		for k, v := range rest {
			o[k] = v
		}
		if cfg.GPUMemoryLimit != "" {
			limit, err := memoryLimit(cfg.GPUMemoryLimit, device)
			if err != nil {
				opts.Destroy()
				return nil, err
			}
			o["gpu_mem_limit"] = strconv.FormatUint(limit, 10)
		}
		if err := cuda.Update(o); err != nil {
			opts.Destroy()
			return nil, fmt.Errorf("cuda provider cannot be loaded with options %v (is libonnxruntime_providers_cuda.so beside %s, with CUDA 13 and cuDNN 9 on the library path? scripts/install-onnxruntime.sh --gpu installs it): %w", o, cfg.ORTLibrary, err)
		}
		cudaOpts = o
		if err := opts.AppendExecutionProviderCUDA(cuda); err != nil {
			opts.Destroy()
			return nil, fmt.Errorf("cuda provider cannot be loaded (is libonnxruntime_providers_cuda.so beside %s, with CUDA 13 and cuDNN 9 on the library path?): %w", cfg.ORTLibrary, err)
		}
	default:
		opts.Destroy()
		return nil, fmt.Errorf("provider %q is not one of cpu, cuda", cfg.Provider)
	}
	return &runtime{lmPriority: lmPriority, opts: opts, provider: cfg.Provider, device: device, cudaOpts: cudaOpts, library: cfg.ORTLibrary}, nil
}

func (r *runtime) session(file string, inputs, outputs []string) (*ort.DynamicAdvancedSession, error) {
	s, err := ort.NewDynamicAdvancedSession(file, inputs, outputs, r.opts)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", file, err)
	}
	return s, nil
}

// placement is where sessions made through iobind compute.
func (r *runtime) placement() iobind.Placement {
	return iobind.Placement{CUDA: r.provider == "cuda", Device: r.device, ProviderOptions: r.cudaOpts}
}

// lmPlacement is where the LM runs: its decode steps are short and on the path of every stream,
// so on CUDA they go ahead of the flow's and vocoder's long batches unless configured otherwise.
func (r *runtime) lmPlacement() iobind.Placement {
	p := r.placement()
	p.HighPriority = p.CUDA && r.lmPriority
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
