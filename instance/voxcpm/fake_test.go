package voxcpm

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// fakeRunner stands for the graphs in the scheduler's tests. It keeps what the real caches keep,
// per slot: a value for every cache position and a VAE state, and computes each output from the
// slot's positions 0..n-1 alone, as the graphs do. A stream whose cache or state was not moved
// whole with it, or that read another stream's, gives other audio than it does alone.
type fakeRunner struct {
	m         *Manifest
	most      int
	kv        [][]float32 // [slot][position]
	state     [][]float32 // [slot][state_size]
	stepDelay time.Duration
	// decodeDelay makes each decode take that long; overlaps counts the decodes that ran while a
	// step did.
	decodeDelay time.Duration
	stepping    atomic.Bool
	overlaps    atomic.Int64
	mu          sync.Mutex
	// gate, when set, holds every step until it closes; gated is set once a step waits there.
	gate     chan struct{}
	gated    atomic.Bool
	calls    []string
	maxRows  int   // the most slots a step ran over
	failStep error // when set, steps fail with it
	closed   bool
	primed   map[int][]float32 // each slot's last priming context
}

// newFakeRunner makes a fake of most slots, all allocated now: the scheduler's goroutine uses kv
// while the VAE's uses state.
func newFakeRunner(m *Manifest, most int) *fakeRunner {
	f := &fakeRunner{m: m, most: most, primed: map[int][]float32{}}
	for range most {
		f.kv = append(f.kv, make([]float32, m.LM.MaxPositions))
		f.state = append(f.state, make([]float32, m.VAE.StateSize))
	}
	return f
}

func (f *fakeRunner) log(s string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(s, args...))
}

func (f *fakeRunner) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeRunner) reserve(n int) error {
	if n > f.most {
		return fmt.Errorf("fake: %d slots over %d", n, f.most)
	}
	return nil
}

// digest folds a slot's first n positions into one number.
func digest(xs []float32) float64 {
	var h float64
	for j, x := range xs {
		h += float64(x) * float64(j+1) * 0.37
	}
	return h
}

func (f *fakeRunner) muStop(s, n int) ([]float32, [2]float32) {
	h := digest(f.kv[s][:n])
	mu := make([]float32, f.m.DiTHidden)
	for k := range mu {
		mu[k] = float32(math.Sin(h + float64(k)))
	}
	return mu, [2]float32{0, float32(math.Sin(7*h) - 0.6)}
}

func sum(xs []float32) float64 {
	var s float64
	for _, x := range xs {
		s += float64(x)
	}
	return s
}

func (f *fakeRunner) prefill(from int, ps []*prompt, rows int) ([]prefilled, error) {
	lengths := make([]int, len(ps))
	for i, p := range ps {
		lengths[i] = p.length()
	}
	f.log("prefill %d %d %v", from, rows, lengths)
	if from+rows > len(f.kv) || rows < len(ps) {
		return nil, fmt.Errorf("fake: prefill of %d prompts in %d rows into slots from %d of %d", len(ps), rows, from, len(f.kv))
	}
	PD := f.m.patchFloats()
	out := make([]prefilled, len(ps))
	for i, p := range ps {
		s := from + i
		ids, textMask, feat, featMask := f.m.prefillInputs(p)
		for t := range ids {
			f.kv[s][t] = float32(float64(ids[t])*0.01*float64(textMask[t]) + sum(feat[t*PD:(t+1)*PD])*0.1*float64(featMask[t]) + 0.001*float64(t))
		}
		out[i].mu, out[i].stop = f.muStop(s, len(ids))
	}
	// Placeholder rows write into their slots, as the graph's do: a stream there would read it.
	for s := from + len(ps); s < from+rows; s++ {
		for j := range f.kv[s] {
			f.kv[s][j] = float32(math.NaN())
		}
	}
	return out, nil
}

func (f *fakeRunner) prime(s int, context []float32) error {
	f.log("prime %d %d", s, len(context))
	f.primed[s] = context
	for j := range f.state[s] {
		f.state[s][j] = float32(sum(context) * float64(j+1) * 0.01)
	}
	return nil
}

func (f *fakeRunner) step(in *stepIn) (*stepOut, error) {
	f.log("step %d", in.n)
	if f.failStep != nil {
		return nil, f.failStep
	}
	if in.n > len(f.kv) {
		return nil, fmt.Errorf("fake: step over %d slots of %d", in.n, len(f.kv))
	}
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		f.gated.Store(true)
		<-gate
	}
	f.stepping.Store(true)
	time.Sleep(f.stepDelay)
	f.stepping.Store(false)
	f.mu.Lock()
	f.maxRows = max(f.maxRows, in.n)
	f.mu.Unlock()
	m := f.m
	H, PD := m.DiTHidden, m.patchFloats()
	out := &stepOut{patch: make([]float32, in.n*PD), nextMu: make([]float32, in.n*H), nextStop: make([]float32, 2*in.n)}
	for b := range in.n {
		mu, cond, noise := in.mu[b*H:(b+1)*H], in.cond[b*PD:(b+1)*PD], in.noise[b*PD:(b+1)*PD]
		pos := int(in.seqlens[b])
		f.kv[b][pos] = float32(sum(mu)*0.1 + sum(cond)*0.01 + sum(noise)*0.001 + float64(in.cfg[b]))
		patch := out.patch[b*PD : (b+1)*PD]
		for j := range patch {
			patch[j] = float32(math.Tanh(float64(mu[j%H]) + 0.5*float64(noise[j]) + 0.1*float64(cond[j])*float64(in.cfg[b])))
		}
		nm, ns := f.muStop(b, pos+1)
		copy(out.nextMu[b*H:], nm)
		copy(out.nextStop[2*b:], ns[:])
	}
	return out, nil
}

func (f *fakeRunner) decode(n int, patches []float32) ([]float32, error) {
	f.log("decode %d", n)
	S, PD := f.m.patchSamples(), f.m.patchFloats()
	if len(patches) != n*PD {
		return nil, fmt.Errorf("fake: decode of %d rows given %d latent values", n, len(patches))
	}
	if f.decodeDelay > 0 {
		time.Sleep(f.decodeDelay / 2)
		if f.stepping.Load() {
			f.overlaps.Add(1)
		}
		time.Sleep(f.decodeDelay / 2)
	}
	audio := make([]float32, n*S)
	for b := range n {
		st, patch := f.state[b], patches[b*PD:(b+1)*PD]
		for k := range S {
			audio[b*S+k] = 0.5*patch[k%len(patch)] + st[k%len(st)]
		}
		p := sum(patch)
		for j := range st {
			st[j] = float32(0.5*float64(st[j]) + p*float64(j+1)*0.01)
		}
	}
	return audio, nil
}

func (f *fakeRunner) move(moves []slotMove) error {
	for _, mv := range moves {
		f.log("move %d %d", mv.From, mv.To)
		copy(f.kv[mv.To][:mv.Positions], f.kv[mv.From][:mv.Positions])
		// What a real slot holds past a stream's length is stale: make it so.
		for j := mv.Positions; j < len(f.kv[mv.To]); j++ {
			f.kv[mv.To][j] = float32(math.NaN())
		}
	}
	return nil
}

func (f *fakeRunner) moveStates(moves []slotMove) error {
	for _, mv := range moves {
		f.log("move states %d %d", mv.From, mv.To)
		copy(f.state[mv.To], f.state[mv.From])
	}
	return nil
}

func (f *fakeRunner) close() error {
	f.closed = true
	return nil
}

// byteTokenizer makes an id per byte, for tests.
type byteTokenizer struct{}

func (byteTokenizer) Encode(s string) []int64 {
	out := make([]int64, len(s))
	for i := range len(s) {
		out[i] = int64(s[i])
	}
	return out
}

// fakeManifest is a small model's manifest with no files behind it.
func fakeManifest() *Manifest {
	start := int64(101)
	m := &Manifest{Kind: Kind, Name: "fake", SampleRate: 44100, DType: "float32", PatchSize: 2, FeatDim: 3,
		ChunkSize: 5, DiTHidden: 4,
		Tokenizer:  TokenizerSpec{AudioStart: &start},
		LM:         LMSpec{Layers: 1, ResidualLayers: 1, KVHeads: 1, HeadDim: 2, MaxPositions: 96},
		Generation: GenerationSpec{Timesteps: 2, CFGValue: 2, MinLen: 2, MaxLen: 40, LenRatio: 1},
		VAE:        VAESpec{StateSize: 3, ContextPatches: 2},
		voiceNames: []string{defaultVoice},
	}
	return m
}
