package router

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// Synthesizer is what the router needs of an instance.
type Synthesizer interface {
	Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error
}

// Member is a supervised instance: a Synthesizer whose process comes and goes.
type Member interface {
	Synthesizer
	Status() tts.Status
	Changed() <-chan struct{}
	Restart(ctx context.Context) error
}

// Backend is one instance as the router balances over it. The router counts in-flight requests
// itself, for the whole life of each audio stream.
type Backend struct {
	Name     string
	Synth    Synthesizer
	Capacity int
	// Member, when set, is the supervised instance behind Synth; its state drives readiness.
	Member Member

	group    *Group
	inflight atomic.Int64
	ready    atomic.Bool
}

// SetReady marks the instance itself ready or not (its group may still keep it out of rotation).
func (b *Backend) SetReady(v bool) { b.ready.Store(v) }

// Ready reports whether the backend is in rotation: the instance is ready and its group is open.
func (b *Backend) Ready() bool { return b.ready.Load() && (b.group == nil || b.group.open()) }

// Inflight is the number of requests the router has on the backend now.
func (b *Backend) Inflight() int { return int(b.inflight.Load()) }

// GroupName is the name of the backend's group.
func (b *Backend) GroupName() string {
	if b.group == nil {
		return ""
	}
	return b.group.Name
}

// Model describes what the pool serves.
type Model struct {
	Name       string
	SampleRate int
	Voices     []string
	// NativeSpeed is true when the model applies the request's speed itself.
	NativeSpeed bool
	// Instructions is true when the model follows a request's "instructions".
	Instructions bool
	// Cloning is true when the model makes voices from reference clips and speaks in them.
	Cloning bool
	// Attribution is the credit the licences of the model's voices ask for (shown on the status
	// page and in GET /v1/models), "" for none.
	Attribution string
	// Family is the model's family (tts.Description.Kind). A library voice speaks only with a
	// model of the family that made it; "" (unknown) refuses none.
	Family string
}

// QueueOptions bound the wait for a free instance.
type QueueOptions struct {
	Size    int
	Timeout time.Duration
}

// Pool is the set of backends the router balances over, with the queue of requests waiting for
// a free one.
type Pool struct {
	model Model
	queue QueueOptions

	mu       sync.Mutex
	groups   []*Group
	backends []*Backend
	waiters  []*waiter
	rnd      *rand.Rand // breaks ties between equally loaded backends
}

type waiter struct {
	exclude *Backend
	got     chan *Backend // buffered: dispatch never blocks
}

// NewPool makes a pool serving model.
func NewPool(m Model, q QueueOptions) *Pool {
	if q.Timeout == 0 {
		q.Timeout = 30 * time.Second
	}
	return &Pool{model: m, queue: q, rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// Model returns what the pool serves.
func (p *Pool) Model() Model { return p.model }

// AddGroup adds a group and its backends. Backends with a Member follow its state.
func (p *Pool) AddGroup(g *Group) {
	p.mu.Lock()
	p.groups = append(p.groups, g)
	for _, b := range g.Backends {
		b.group = g
		p.backends = append(p.backends, b)
	}
	g.pool = p
	p.mu.Unlock()
	for _, b := range g.Backends {
		if b.Member != nil {
			go p.follow(b)
		}
	}
}

// Add puts a backend outside any group in the pool (tests, single instances).
func (p *Pool) Add(b *Backend) {
	p.mu.Lock()
	p.backends = append(p.backends, b)
	p.mu.Unlock()
}

// follow keeps b's readiness equal to its member's; it runs for the pool's life.
func (p *Pool) follow(b *Backend) {
	for {
		ch := b.Member.Changed()
		b.SetReady(b.Member.Status().State == tts.StateReady)
		p.Dispatch()
		<-ch
	}
}

// Groups lists the pool's groups.
func (p *Pool) Groups() []*Group {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Group(nil), p.groups...)
}

// Group finds a group by name.
func (p *Pool) Group(name string) *Group {
	for _, g := range p.Groups() {
		if g.Name == name {
			return g
		}
	}
	return nil
}

// Backends lists the pool's backends.
func (p *Pool) Backends() []*Backend {
	p.mu.Lock()
	defer p.mu.Unlock()
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

// QueueLen is the number of requests waiting for a free instance.
func (p *Pool) QueueLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiters)
}

// Errors of Acquire.
var (
	errNoneReady    = errors.New("no instance is ready")
	errQueueFull    = errors.New("every instance is busy and the queue is full")
	errQueueTimeout = errors.New("timed out waiting for a free instance")
)

// Acquire takes a slot on the ready backend with the fewest in-flight requests relative to its
// capacity (skipping exclude). When every ready backend is full the request waits in a bounded
// FIFO queue; a full queue fails at once, a long wait fails after the queue timeout.
func (p *Pool) Acquire(ctx context.Context, exclude *Backend) (*Backend, error) {
	p.mu.Lock()
	b, full := p.pickLocked(exclude)
	if b != nil {
		p.mu.Unlock()
		return b, nil
	}
	if !full {
		p.mu.Unlock()
		return nil, errNoneReady
	}
	if len(p.waiters) >= p.queue.Size {
		p.mu.Unlock()
		return nil, errQueueFull
	}
	w := &waiter{exclude: exclude, got: make(chan *Backend, 1)}
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()

	t := time.NewTimer(p.queue.Timeout)
	defer t.Stop()
	var err error
	select {
	case b := <-w.got:
		return b, nil
	case <-t.C:
		err = errQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.mu.Lock()
	for i, x := range p.waiters {
		if x == w {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	select {
	case b := <-w.got: // a slot arrived as we gave up: hand it on
		p.Release(b)
	default:
	}
	return nil, err
}

// Release returns a slot taken by Acquire and hands it to the first waiter.
func (p *Pool) Release(b *Backend) {
	p.mu.Lock()
	b.inflight.Add(-1)
	p.dispatchLocked()
	p.mu.Unlock()
}

// Dispatch hands free slots to waiters (after a backend became ready).
func (p *Pool) Dispatch() {
	p.mu.Lock()
	p.dispatchLocked()
	p.mu.Unlock()
}

func (p *Pool) dispatchLocked() {
	for len(p.waiters) > 0 {
		w := p.waiters[0]
		b, _ := p.pickLocked(w.exclude)
		if b == nil {
			return
		}
		p.waiters = p.waiters[1:]
		w.got <- b
	}
}

// pickLocked picks and counts a backend; full reports that ready backends exist but are full.
func (p *Pool) pickLocked(exclude *Backend) (best *Backend, full bool) {
	best, full = leastLoaded(p.backends, func(c *Backend) bool { return c == exclude || !c.Ready() }, p.rnd)
	if best == nil {
		return nil, full
	}
	best.inflight.Add(1)
	return best, false
}
