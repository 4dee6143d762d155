package router

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/voxmux/voxmux/instance"
)

// Synthesizer is what the router needs of an instance.
type Synthesizer interface {
	Synthesize(ctx context.Context, req instance.Request, emit func(instance.Chunk) error) error
}

// Backend is one instance as the router balances over it. The router counts in-flight requests
// itself, for the whole life of each audio stream.
type Backend struct {
	Name     string
	Group    string
	Synth    Synthesizer
	Capacity int

	inflight atomic.Int64
	ready    atomic.Bool
}

// SetReady puts the backend in or out of rotation.
func (b *Backend) SetReady(v bool) { b.ready.Store(v) }

// Ready reports whether the backend is in rotation.
func (b *Backend) Ready() bool { return b.ready.Load() }

// Inflight is the number of requests the router has on the backend now.
func (b *Backend) Inflight() int { return int(b.inflight.Load()) }

// Model describes what the pool serves.
type Model struct {
	Name       string
	SampleRate int
	Voices     []string
}

// Pool is the set of backends the router balances over.
type Pool struct {
	mu       sync.RWMutex
	backends []*Backend
	model    Model
}

// NewPool makes a pool serving model.
func NewPool(m Model) *Pool { return &Pool{model: m} }

// Model returns what the pool serves.
func (p *Pool) Model() Model { return p.model }

// Add puts b in the pool (not in rotation until SetReady).
func (p *Pool) Add(b *Backend) {
	p.mu.Lock()
	p.backends = append(p.backends, b)
	p.mu.Unlock()
}

// Backends lists the pool's backends.
func (p *Pool) Backends() []*Backend {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]*Backend(nil), p.backends...)
}

// AnyReady reports whether at least one backend is in rotation.
func (p *Pool) AnyReady() bool {
	for _, b := range p.Backends() {
		if b.Ready() {
			return true
		}
	}
	return false
}

// acquire picks the ready backend with the fewest in-flight requests relative to its capacity,
// skipping exclude, and counts the request on it. It returns nil when no backend is ready or all
// are full (full reports which).
func (p *Pool) acquire(exclude *Backend) (b *Backend, full bool) {
	p.mu.Lock() // exclusive, so two requests never both take a backend's last slot
	defer p.mu.Unlock()
	var best *Backend
	var bestLoad float64
	for _, c := range p.backends {
		if c == exclude || !c.Ready() {
			continue
		}
		n := c.inflight.Load()
		if int(n) >= c.Capacity {
			full = true
			continue
		}
		load := float64(n) / float64(c.Capacity)
		if best == nil || load < bestLoad {
			best, bestLoad = c, load
		}
	}
	if best == nil {
		return nil, full
	}
	best.inflight.Add(1)
	return best, false
}

func (b *Backend) release() { b.inflight.Add(-1) }
