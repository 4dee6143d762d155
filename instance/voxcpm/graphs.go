package voxcpm

import (
	"fmt"
	"math"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// runner runs the graphs over the slots' caches and VAE states. The scheduler goroutine calls
// its LM side (reserve, prefill, step, move) and one other goroutine at a time its VAE side
// (prime, decode, moveStates): the two share no memory. The engine's tests run the scheduler over
// a fake one.
type runner interface {
	// reserve makes room for slots [0, n).
	reserve(n int) error
	// prefill runs prompts ps into slots [from, from+len(ps)) in one run of rows rows (at least
	// len(ps)), right-padded, and returns each one's patch 0 mu and stop logits. The rows past
	// len(ps) are placeholders, which write into slots [from+len(ps), from+rows): those must be
	// free.
	prefill(from int, ps []*prompt, rows int) ([]prefilled, error)
	// prime sets slot s's VAE state: zeros, or (context: whole patches) the state after decoding
	// context, its audio dropped.
	prime(s int, context []float32) error
	// step runs the step graph over slots [0, in.n).
	step(in *stepIn) (*stepOut, error)
	// decode runs the VAE decoder over slots [0, n), their latents patch ([n][patch_size][feat_dim],
	// the step's), and returns the audio, [n][patch_size·chunk_size], valid until the next decode.
	decode(n int, patch []float32) ([]float32, error)
	// move moves streams' caches down into free slots.
	move(moves []slotMove) error
	// moveStates moves streams' VAE states down into free slots.
	moveStates(moves []slotMove) error
	close() error
}

// prefilled is a prompt's prefill: patch 0's condition and stop logits.
type prefilled struct {
	mu   []float32 // [dit_hidden]
	stop [2]float32
}

// stepIn is one step's inputs for slots [0, n): free slots have zeros and length 0.
type stepIn struct {
	n       int
	mu      []float32 // [n][dit_hidden]
	cond    []float32 // [n][patch_size][feat_dim]
	noise   []float32 // [n][feat_dim][patch_size]
	cfg     []float32 // [n]
	seqlens []int32   // [n]: each slot's length before the step
}

func newStepIn(m *Manifest, n int) *stepIn {
	return &stepIn{n: n, mu: make([]float32, n*m.DiTHidden), cond: make([]float32, n*m.patchFloats()),
		noise: make([]float32, n*m.patchFloats()), cfg: make([]float32, n), seqlens: make([]int32, n)}
}

// stepOut is a step's outputs for slots [0, n).
type stepOut struct {
	patch    []float32 // [n][patch_size][feat_dim]
	nextMu   []float32 // [n][dit_hidden]
	nextStop []float32 // [n][2]
}

// graphs runs the export's graphs through I/O binding, their caches and VAE states on the
// device they compute on.
type graphs struct {
	m               *Manifest
	prefillS, stepS *iobind.Session
	c               *iobind.SlotCache
	v               *vaeGraphs
	past, present   []string
	// sg is set when steps run in fixed shapes (lm_cuda_graph); nil: each step its own shape.
	sg *stepGraphs
}

var _ runner = (*graphs)(nil)

// openGraphs opens the prefill, step and VAE decoder graphs on rt's device, with caches for at
// most slots streams (and prefillSpare slots more, for prefills' placeholder rows), the step and
// the VAE decoder run as modes says (resolveModes). It runs every prefill shape a scheduler of
// slots streams makes up to 256 positions once (warmPrefill).
func openGraphs(m *Manifest, rt *ort.Runtime, slots int, modes graphModes) (_ *graphs, err error) {
	mode := modes.step
	g := &graphs{m: m}
	g.past, g.present = m.cacheNames()
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	open := func(key, file, name string, graphs bool) (*iobind.Session, error) {
		p := rt.Placement()
		p.Profile = rt.ProfilePrefix(name)
		p.CUDAGraph = p.CUDA && graphs
		s, err := iobind.Open(m.Path(file), p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		return s, nil
	}
	if g.prefillS, err = open("graphs.prefill", m.Graphs.Prefill, "voxcpm_prefill", false); err != nil {
		return nil, err
	}
	buckets := engine.Buckets(slots)
	rows := max(buckets[len(buckets)-1], slots+prefillSpare)
	if g.v, err = openVAE(m, rt, rows, buckets, modes); err != nil {
		return nil, err
	}
	if mode == StepGraphOff {
		if g.stepS, err = open("graphs.step", m.Graphs.Step, "voxcpm_step", false); err != nil {
			return nil, err
		}
		if g.c, err = newCaches(m, g.stepS, rows, false); err != nil {
			return nil, err
		}
		if err := g.checkPrefill(); err != nil {
			return nil, err
		}
		return g, g.warmPrefillOn(rt, slots)
	}
	g.sg = &stepGraphs{thread: ort.NewThread()}
	err = g.sg.thread.Do(func() (err error) {
		g.stepS, err = open("graphs.step", m.Graphs.Step, "voxcpm_step", mode == StepGraphOn)
		return err
	})
	if err != nil {
		return nil, err
	}
	if g.c, err = newCaches(m, g.stepS, rows, true); err != nil {
		return nil, err
	}
	if err := g.openStepGraphs(buckets); err != nil {
		return nil, fmt.Errorf("graphs.step (lm_cuda_graph %s): %w", mode, err)
	}
	if err := g.checkPrefill(); err != nil {
		return nil, err
	}
	return g, g.warmPrefillOn(rt, slots)
}

// checkPrefill checks that prefill.onnx takes each row's outputs at its own last position, which
// the engine's right-padded prefills need: an export from before batched prefills took them at
// the batch's last position, a padding position, and would give every request wrong audio. A
// one-position prompt alone and padded to prefillStep positions must give the same mu, within a
// tenth of its largest value: float16 rounding is far less, the position of a padded row's last
// token far more. No stream is in the caches yet.
func (g *graphs) checkPrefill() error {
	m := g.m
	if err := g.c.Reserve(1); err != nil {
		return fmt.Errorf("prefill check: %w", err)
	}
	p := []*prompt{{ids: []int64{*m.Tokenizer.AudioStart}}}
	var mus [2][]float32
	for i, T := range []int{1, prefillStep} {
		ids, textMask, feat, featMask, seqlens := m.prefillBatch(p, 1, T)
		mu, _, err := g.runPrefill(0, 1, T, ids, textMask, feat, featMask, seqlens)
		if err != nil {
			return fmt.Errorf("prefill check: %w", err)
		}
		mus[i] = mu
	}
	var scale, diff float64
	for i, x := range mus[0] {
		scale = max(scale, math.Abs(float64(x)))
		diff = max(diff, math.Abs(float64(x)-float64(mus[1][i])))
	}
	if !(diff <= 0.1*scale) {
		return fmt.Errorf("graphs.prefill: %s gives a prompt padded to %d positions a mu %g from its mu alone (largest value %g): it does not take each row's outputs at its own last position (seqlens_k); export it again with scripts/voxcpm/export.py (docs/voxcpm.md)",
			m.Path(m.Graphs.Prefill), prefillStep, diff, scale)
	}
	return nil
}

// warmPrefillOn warms the prefill shapes on a GPU. The CPU has no comparable cost of a first run
// to save, and a full-size export's prefills there take seconds each (the tiny export's 64 shapes
// took 0.9 s on two cores).
func (g *graphs) warmPrefillOn(rt *ort.Runtime, slots int) error {
	if !rt.CUDA() {
		return nil
	}
	return g.warmPrefill(slots)
}

// warmPrefillPositions bounds the prefill lengths warmed at load.
const warmPrefillPositions = 256

// warmPrefill runs a prefill of every shape the scheduler of slots streams makes up to
// warmPrefillPositions positions (a power of two rows up to prefillGroup, whole prefillSteps)
// once, so that requests do not pay ONNX Runtime's cost of a shape's first run (on an H100, 40-60
// ms more for the staged family's LM prefills). No stream is in the caches yet.
func (g *graphs) warmPrefill(slots int) error {
	most := prefillRows(min(prefillGroup, slots))
	for B := 1; B <= most; B *= 2 {
		if err := g.c.Reserve(B); err != nil {
			return fmt.Errorf("prefill warm-up: %w", err)
		}
		for T := prefillStep; T <= min(warmPrefillPositions, g.m.LM.MaxPositions); T += prefillStep {
			ids, textMask, feat, featMask, seqlens := g.m.prefillBatch(nil, B, T)
			if _, _, err := g.runPrefill(0, B, T, ids, textMask, feat, featMask, seqlens); err != nil {
				return fmt.Errorf("prefill warm-up, %d rows of %d positions: %w", B, T, err)
			}
		}
	}
	return nil
}

func (g *graphs) reserve(n int) error { return g.c.Reserve(n) }

func (g *graphs) move(moves []slotMove) error { return g.c.Move(moves) }

func (g *graphs) moveStates(moves []slotMove) error { return g.v.move(moves) }

func (g *graphs) prime(s int, context []float32) error { return g.v.prime(s, context) }

func (g *graphs) decode(n int, patch []float32) ([]float32, error) { return g.v.decode(n, patch) }

// hostInput is a graph input made from host data.
type hostInput struct {
	name  string
	shape []int64
	data  any
}

// hostTensors makes host tensors of inputs into in; the caller releases held.
func hostTensors(in map[string]*iobind.Tensor, held *[]*iobind.Tensor, inputs ...hostInput) error {
	for _, h := range inputs {
		t, err := iobind.Host(h.shape, h.data)
		if err != nil {
			return fmt.Errorf("input %s: %w", h.name, err)
		}
		*held = append(*held, t)
		in[h.name] = t
	}
	return nil
}

// bindCache adds cache views as past inputs and, written in place, present outputs.
func (g *graphs) bindCache(in map[string]*iobind.Tensor, outs []iobind.Output, cache []*iobind.Tensor) []iobind.Output {
	for i, v := range cache {
		in[g.past[i]] = v
		outs = append(outs, iobind.Output{Name: g.present[i], Into: v})
	}
	return outs
}

func (g *graphs) prefill(from int, ps []*prompt, rows int) ([]prefilled, error) {
	m := g.m
	n := 0
	for _, p := range ps {
		n = max(n, p.length())
	}
	if len(ps) == 0 || rows < len(ps) || n > m.LM.MaxPositions {
		return nil, fmt.Errorf("prefill: %d prompts of up to %d positions in %d rows (lm.max_positions %d)", len(ps), n, rows, m.LM.MaxPositions)
	}
	T := m.prefillLength(n)
	if err := g.c.Reserve(from + rows); err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	ids, textMask, feat, featMask, seqlens := m.prefillBatch(ps, rows, T)
	mu, stop, err := g.runPrefill(from, rows, T, ids, textMask, feat, featMask, seqlens)
	if err != nil {
		return nil, err
	}
	H := m.DiTHidden
	out := make([]prefilled, len(ps))
	for b := range out {
		out[b].mu = mu[b*H : (b+1)*H : (b+1)*H]
		copy(out[b].stop[:], stop[2*b:])
	}
	return out, nil
}

// runPrefill runs the prefill graph over slots [from, from+B), B rows of T positions, and returns
// mu [B][dit_hidden] and the stop logits [B][2]. total_sequence_length is T: GroupQueryAttention
// then reads the rows as first prompts, each of its own length seqlens_k[b] + 1, right-padded (it
// refuses a batch of several tokens per row otherwise).
func (g *graphs) runPrefill(from, B, T int, ids []int64, textMask, feat, featMask []float32, seqlens []int32) (mu, stop []float32, err error) {
	m := g.m
	cache, err := g.c.Views(from, B)
	if err != nil {
		return nil, nil, fmt.Errorf("prefill: %w", err)
	}
	var held []*iobind.Tensor
	defer func() { release(held); release(cache) }()
	in := map[string]*iobind.Tensor{}
	b, t := int64(B), int64(T)
	err = hostTensors(in, &held,
		hostInput{"text_ids", []int64{b, t}, ids},
		hostInput{"text_mask", []int64{b, t}, textMask},
		hostInput{"feat", []int64{b, t, int64(m.PatchSize), int64(m.FeatDim)}, feat},
		hostInput{"feat_mask", []int64{b, t}, featMask},
		hostInput{"seqlens_k", []int64{b}, seqlens},
		hostInput{"total_sequence_length", []int64{}, []int32{int32(T)}})
	if err != nil {
		return nil, nil, fmt.Errorf("prefill: %w", err)
	}
	outs := g.bindCache(in, []iobind.Output{{Name: "mu", Host: true}, {Name: "stop_logits", Host: true}}, cache)
	res, err := g.prefillS.Run(in, outs)
	if err != nil {
		return nil, nil, fmt.Errorf("prefill: %w", err)
	}
	defer release(res)
	if mu, err = floats(res[0], B*m.DiTHidden, "prefill: mu"); err != nil {
		return nil, nil, err
	}
	if stop, err = floats(res[1], 2*B, "prefill: stop_logits"); err != nil {
		return nil, nil, err
	}
	return mu, stop, nil
}

// floats reads a host output of want values.
func floats(t *iobind.Tensor, want int, what string) ([]float32, error) {
	v, err := t.Float32s()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(v) != want {
		return nil, fmt.Errorf("%s has %d values (shape %v), want %d", what, len(v), t.Shape, want)
	}
	return v, nil
}

func (g *graphs) step(in *stepIn) (*stepOut, error) {
	if g.sg != nil {
		return g.stepFixed(in)
	}
	m := g.m
	n := in.n
	B, P, D := int64(n), int64(m.PatchSize), int64(m.FeatDim)
	// The largest length after the step (seqlens_k is each length after it, minus one).
	total := int32(1)
	for _, s := range in.seqlens {
		total = max(total, s+1)
	}
	if int(total) > m.LM.MaxPositions {
		return nil, fmt.Errorf("step: a stream needs %d positions, over lm.max_positions (%d)", total, m.LM.MaxPositions)
	}
	cache, err := g.c.Views(0, n)
	if err != nil {
		return nil, fmt.Errorf("step: %w", err)
	}
	var held []*iobind.Tensor
	defer func() { release(held); release(cache) }()
	inputs := map[string]*iobind.Tensor{}
	err = hostTensors(inputs, &held,
		hostInput{"mu", []int64{B, int64(m.DiTHidden)}, in.mu},
		hostInput{"cond", []int64{B, P, D}, in.cond},
		hostInput{"noise", []int64{B, D, P}, in.noise},
		hostInput{"cfg_value", []int64{B}, in.cfg},
		hostInput{"seqlens_k", []int64{B}, in.seqlens},
		hostInput{"total_sequence_length", []int64{}, []int32{total}})
	if err != nil {
		return nil, fmt.Errorf("step: %w", err)
	}
	outs := g.bindCache(inputs, []iobind.Output{{Name: "patch", Host: true}, {Name: "next_mu", Host: true},
		{Name: "next_stop_logits", Host: true}}, cache)
	res, err := g.stepS.Run(inputs, outs)
	if err != nil {
		return nil, fmt.Errorf("step: %w", err)
	}
	defer release(res)
	out := &stepOut{}
	if out.patch, err = floats(res[0], n*m.patchFloats(), "step: patch"); err != nil {
		return nil, err
	}
	if out.nextMu, err = floats(res[1], n*m.DiTHidden, "step: next_mu"); err != nil {
		return nil, err
	}
	if out.nextStop, err = floats(res[2], 2*n, "step: next_stop_logits"); err != nil {
		return nil, err
	}
	return out, nil
}

func (g *graphs) close() error {
	g.sg.close()
	if g.c != nil {
		g.c.Release()
	}
	g.v.close()
	if g.prefillS != nil {
		g.prefillS.Close()
	}
	var thread *ort.Thread
	if g.sg != nil {
		thread = g.sg.thread
	}
	if g.stepS != nil {
		thread.Do(func() error { g.stepS.Close(); return nil })
	}
	thread.Close()
	return nil
}
