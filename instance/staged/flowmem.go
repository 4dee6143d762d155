package staged

import (
	"fmt"
	"sync"

	"github.com/voxmux/voxmux/tts"
)

// flowMemory bounds the device memory of the chunk-causal flow (flow.chunk_step) engine-wide:
// every stream's kept keys and values, the prompt cache's voices and each batch's padded past and
// present (engine option flow_kv_memory_mb; docs/cosyvoice3.md, "Memory"). A kept frame costs
// steps × 4 × kv_layers × kv_width values (1.8 MB for CosyVoice3-0.5B in float16), so a few
// dozen long streams fill a GPU; unbounded, they starved the LM of memory. The flow loop reserves
// what a batch will allocate before starting it (admit) and a batch that does not fit waits; runs
// turn their reservation into allocations (flowGrant.take), and the allocations come back when
// freed. used + reserved never passes the limit, so neither do the bytes allocated. Safe for
// concurrent use.
type flowMemory struct {
	mu       sync.Mutex
	limit    int64
	used     int64 // allocated now
	reserved int64 // promised to batches under way, not yet allocated
	peak     int64
	waits    uint64 // times a batch waited for memory
	preempts uint64 // streams whose kept frames were dropped for room, to compute again
	// freed wakes the flow loop when memory comes back.
	freed chan struct{}
}

func newFlowMemory(limit int64) *flowMemory {
	return &flowMemory{limit: limit, freed: make(chan struct{}, 1)}
}

// setLimit changes the bound (before any stream runs).
func (m *flowMemory) setLimit(n int64) {
	m.mu.Lock()
	m.limit = n
	m.mu.Unlock()
}

// reserve promises n bytes to a batch, if they fit.
func (m *flowMemory) reserve(n int64) (*flowGrant, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used+m.reserved+n > m.limit {
		return nil, false
	}
	m.reserved += n
	return &flowGrant{m: m, left: n}, true
}

// free gives back n allocated bytes.
func (m *flowMemory) free(n int64) {
	if n == 0 {
		return
	}
	m.mu.Lock()
	m.used -= n
	m.mu.Unlock()
	select {
	case m.freed <- struct{}{}:
	default:
	}
}

// stats are the bytes allocated now, the peak since the engine started and the limit.
func (m *flowMemory) stats() tts.FlowMemoryStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return tts.FlowMemoryStats{Bytes: m.used, Peak: m.peak, Limit: m.limit, Waits: m.waits, Preemptions: m.preempts}
}

func (m *flowMemory) waited() {
	m.mu.Lock()
	m.waits++
	m.mu.Unlock()
}

func (m *flowMemory) preempted() {
	m.mu.Lock()
	m.preempts++
	m.mu.Unlock()
}

// flowGrant is one batch's reservation. A nil grant takes from what is free (a voice computed
// outside a batch, tests).
type flowGrant struct {
	m    *flowMemory
	left int64
}

// take allocates n bytes out of the reservation, or out of what is free beyond it.
func (g *flowGrant) take(m *flowMemory, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	from := int64(0)
	if g != nil {
		from = min(n, g.left)
	}
	if extra := n - from; extra > 0 && m.used+m.reserved+extra > m.limit {
		return fmt.Errorf("chunk flow: %d bytes of keys and values would pass engine.flow_kv_memory_mb (%d of %d bytes in use)", n, m.used+m.reserved, m.limit)
	}
	if g != nil {
		g.left -= from
		m.reserved -= from
	}
	m.used += n
	m.peak = max(m.peak, m.used)
	return nil
}

// done returns what the batch did not allocate.
func (g *flowGrant) done() {
	if g == nil {
		return
	}
	g.m.mu.Lock()
	g.m.reserved -= g.left
	g.left = 0
	g.m.mu.Unlock()
	select {
	case g.m.freed <- struct{}{}:
	default:
	}
}
