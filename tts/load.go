package tts

// LoadConfig tells an instance what to load.
type LoadConfig struct {
	Manifest   string
	Provider   string // "cpu" or "cuda"
	ORTLibrary string
	// ProviderOptions go to ONNX Runtime's execution provider as they are (CUDA provider
	// options such as cudnn_conv_algo_search); the engine's own switches are in Engine.
	ProviderOptions map[string]string
	// Engine is the group's `engine:` section, checked when the config loaded by the family that
	// serves the model, which parses it again in Open.
	Engine      EngineSection
	MaxInflight int
	// Placement is "replicated" (a pipeline on every visible GPU) or "split" (LM on GPU 0, flow
	// and vocoder on GPU 1); empty means replicated.
	Placement string
	// GPUMemoryLimit caps the CUDA arena per GPU; the zero value leaves ONNX Runtime's default.
	GPUMemoryLimit MemoryLimit
}

// Info is what a loaded instance reports of itself: where it runs, so the router can show and
// check placement.
type Info struct {
	// CUDAVisibleDevices is the value the instance process saw.
	CUDAVisibleDevices string
	// GPUs are the CUDA devices the instance process saw.
	GPUs []GPU
}

// GPU is a CUDA device as an instance process sees it (after CUDA_VISIBLE_DEVICES).
type GPU struct {
	// Index is the device's ordinal inside the process (0 is the group's first GPU).
	Index       int
	UUID        string
	Name        string
	MemoryTotal uint64
}
