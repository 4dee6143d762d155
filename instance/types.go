// Package instance is what runs inside an inference instance: the pipeline manifest, the
// ONNX Runtime stages (LM, flow, vocoder) and the streaming synthesis of one request.
package instance

import "time"

// Request is one synthesis request as the router hands it to an instance.
type Request struct {
	ID    string
	Text  string
	Voice string
	Speed float32
	// Seed picks the flow's starting noise; equal requests with equal seeds give equal audio.
	Seed uint64
	// Instructions (OpenAI's: tone, accent, pace) reach only models whose Description says
	// they take them.
	Instructions string
}

// Chunk is a piece of mono float32 audio, in order.
type Chunk struct {
	PCM        []float32
	SampleRate int
	Index      int
}

// LoadConfig tells an instance what to load.
type LoadConfig struct {
	Manifest        string
	Provider        string // "cpu" or "cuda"
	ORTLibrary      string
	ProviderOptions map[string]string
	MaxInflight     int
	// Placement is "replicated" (a pipeline on every visible GPU) or "split" (LM on GPU 0, flow
	// and vocoder on GPU 1); empty means replicated.
	Placement string
	// GPUMemoryLimit caps the CUDA arena per GPU: bytes ("8GiB") or a fraction of the device ("0.4").
	GPUMemoryLimit string
}

// Info describes a loaded instance.
type Info struct {
	Model      string
	SampleRate int
	Voices     []string
	Provider   string
	// CUDAVisibleDevices is the value the instance process saw.
	CUDAVisibleDevices string
	PID                int
	// GPUs are the CUDA devices the instance process saw.
	GPUs []GPU
}

// Health is an instance's own view of itself.
type Health struct {
	Ready    bool
	Message  string
	Inflight int
	// Stages count the batched runs of each pipeline stage since the process started (empty for
	// models whose runner does not batch).
	Stages []StageStats
}

// StageStats counts one stage's runs: Items/Batches is its mean batch size.
type StageStats struct {
	Stage   string // lm_prefill, lm_decode, flow, vocoder
	Batches uint64 // runs of the stage's graph
	Items   uint64 // requests (sequences, chunks) those runs carried
	Busy    time.Duration
	// Wait sums the time each item waited for the stage before a run took it (a prefill's
	// prompts from their arrival; 0 for the decode steps, which every running sequence joins).
	// Over an interval, its growth divided by the interval's length is the mean queue.
	Wait time.Duration
}

// ErrorKind tells the router what to do with a failed request.
type ErrorKind int

const (
	ErrInternal ErrorKind = iota // the instance failed; another instance may succeed
	ErrInvalid                   // the request itself is bad; retrying will not help
	ErrBusy                      // the instance is at its max_inflight
	ErrNotReady                  // the instance cannot serve (not loaded, shutting down)
)

// Error is an instance failure of a known kind.
type Error struct {
	Kind ErrorKind
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// State is where a supervised instance (or a group of them) is in its life.
type State string

// States of instances and groups.
const (
	StateStarting   State = "starting"
	StateReady      State = "ready"
	StateDraining   State = "draining"
	StateRestarting State = "restarting"
	StateUnhealthy  State = "unhealthy"
	StateFailed     State = "failed"
	StateStopped    State = "stopped"
)

// Status is a supervised instance as operators see it.
type Status struct {
	Name      string
	State     State
	PID       int
	GPUs      []GPU
	Restarts  int
	Failures  int
	Since     time.Time // when the current state began
	LastError string
}
