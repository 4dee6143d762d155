package tts

import "time"

// Health is an instance's own view of itself.
type Health struct {
	Ready    bool
	Message  string
	Inflight int
	// Stages count the batched runs of each pipeline stage since the process started (empty for
	// models whose runner does not batch).
	Stages []StageStats
	// Cancels are the requests cancelled while the engine still worked on them (zero for models
	// whose runner does not count them).
	Cancels CancelStats
	// PromptCache is a chunk-causal flow's voice prompt cache (zero for models without one).
	PromptCache PromptCacheStats
	// FlowMemory is a chunk-causal flow's device memory for keys and values (zero for models
	// without one).
	FlowMemory FlowMemoryStats
}

// FlowMemoryStats are a chunk-causal flow's device memory figures (docs/cosyvoice3.md, "Memory"):
// the bytes of keys and values allocated now (streams' kept frames, the prompt cache's voices and
// batches' padded past), the most since the engine started, the engine's bound on them
// (flow_kv_memory_mb), how many times a batch waited for memory, and how many streams had their
// kept frames dropped for room and computed again.
type FlowMemoryStats struct {
	Bytes, Peak, Limit int64
	Waits, Preemptions uint64
}

// CancelStats sums what cancelled requests cost an engine: Count requests were cancelled (their
// client left, their WebSocket context closed) while a stage still held them, and Freeing sums
// the time from each cancel until no stage held it any more: engine time spent on audio nobody
// will hear.
type CancelStats struct {
	Count      uint64
	Freeing    time.Duration
	MaxFreeing time.Duration
}

// PromptCacheStats are a chunk-causal flow's voice prompt cache's figures (docs/cosyvoice3.md,
// "Prompt cache"): requests that found their voice's keys and values kept (Hits) or computed them
// (Misses), voices dropped for room (Evictions), and what it holds now (Bytes, Voices).
type PromptCacheStats struct {
	Hits, Misses, Evictions uint64
	Bytes                   int64
	Voices                  int
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
