package staged

import (
	"fmt"
	"log/slog"
	"math/rand/v2"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// chunkGraphs runs the chunk-causal flow's small batches in fixed shapes (flow_chunk_cuda_graph;
// docs/cosyvoice3.md, "CUDA graphs"): at one stream a step of flow_chunk.onnx launches some 500
// kernels, and their launches, not their work, set its time. A bucket is B rows, P past frames
// and N new frames; a batch runs in the smallest bucket that holds its rows, its longest past and
// its most new frames, padded as the uncaptured run pads (a row's past beyond its own and new
// frames beyond its own are masked, padding rows are all masked). With captured graphs each
// bucket's step is captured at load, checked once against an uncaptured run of the same inputs,
// and each Euler step of a batch is one replay.
//
// A graph replays at the addresses it was captured with, so every bucket's inputs and outputs are
// views at offset 0 of one buffer per tensor, sized for the largest bucket and never moved: the
// buckets together take one largest bucket's memory, counted in flowMemory for as long as the
// flow runs. The captured buckets run in a session of their own (a second copy of the DiT's
// weights) in which nothing is allocated after the captures: ONNX Runtime's intermediate tensors
// live in the session's arena, which a replay writes where its capture did, so a stream's kept
// frames allocated there later could be overwritten. Graphs are captured at load, not when a
// batch first needs one: a capture forbids other threads' CUDA calls (the LM's, the vocoder's)
// while it lasts.
type chunkGraphs struct {
	m    *Manifest
	sess *iobind.Session // the buckets' runs: a session of their own (capture), else the flow's
	own  bool            // sess is chunkGraphs' own, closed with it
	// capture: the buckets' steps are CUDA graphs; thread runs every call of sess then.
	capture bool
	thread  *ort.Thread
	elem    iobind.Elem
	// rows and news are the buckets' batch sizes and new frames, rising; pasts[B] the past frames
	// of the buckets of B rows, rising.
	rows, news []int
	pasts      map[int][]int
	buckets    map[[3]int]*chunkBucket
	// The shared buffers, zeroed once: every bucket's tensors are views at their start.
	past, present, in, work, start *iobind.Tensor
	mem                            *flowMemory
	bytes                          int64 // what the buffers take, counted in mem
}

// chunkBucket is one fixed shape's views and bound run.
type chunkBucket struct {
	B, P, N int
	id      int  // the CUDA graph's, or iobind.NoGraph
	plain   bool // its capture differed from an uncaptured run: batches of its shape run uncaptured

	past, present, in, work, start, xNext *iobind.Tensor
	inOff, workOff                        []int64
	inputs                                map[string]*iobind.Tensor
	outputs                               []iobind.Output
	views                                 []*iobind.Tensor
	run                                   *iobind.Bound
}

func (b *chunkBucket) release() {
	b.run.Close()
	for i := len(b.views) - 1; i >= 0; i-- {
		b.views[i].Release()
	}
}

// chunkGraphMostPast bounds the buckets' past frames (41 s at 50 frames a second): each past
// length is a capture at load, and a batch that reads a longer past computes enough for its
// launches to matter less.
const chunkGraphMostPast = 2048

// chunkGraphNews are the buckets' new frames for m's chunk schedule: whole chunks, up to the most
// a stream's first chunk computes over any voice prompt length (with emit, its chunks' ends).
// Every later chunk computes at most one chunk; one that computes again frames its stream gave up
// for room runs uncaptured.
func (m *Manifest) chunkGraphNews(emit ChunkEmit) []int {
	f := m.Flow
	CF, R, la := f.ChunkFrames, f.FramesPerToken, max(f.LookaheadTokens, 0)
	per := CF / R
	most := CF
	for P := la + per; P < la+2*per; P++ { // every prompt length modulo a chunk
		c := m.ChunkSize(0)
		if emit == ChunkEmitCosyVoice {
			c = (per-P%per)%per + per
		}
		most = max(most, (P+c)*R-m.voiceFrames(P*R))
	}
	var out []int
	for n := CF; n < most+CF; n += CF {
		out = append(out, n)
	}
	return out
}

// chunkGraphPasts are the buckets' past frames up to most: every chunk up to 8, then at most an
// eighth more than the frames a batch reads (a stream's past grows a chunk at a time).
func chunkGraphPasts(CF, most int) []int {
	var out []int
	for p := CF; p <= most; {
		out = append(out, p)
		next := p + CF
		if p >= 8*CF {
			next = max(next, (p+p/8)/CF*CF)
		}
		p = next
	}
	return out
}

// chunkGraphRows are the buckets' batch sizes up to rows: powers of two, and rows.
func chunkGraphRows(rows int) []int {
	var out []int
	for b := 1; b < rows; b *= 2 {
		out = append(out, b)
	}
	return append(out, rows)
}

// newChunkGraphs makes the buckets of s's flow and, with capture, captures and checks each one's
// step. Their buffers take at most a sixteenth of the flow's memory bound (flow_kv_memory_mb).
func newChunkGraphs(rt *ort.Runtime, s *flowChunks, opt options) (*chunkGraphs, error) {
	m := s.m
	f := m.Flow
	g := &chunkGraphs{m: m, sess: s.step, elem: s.elem, mem: s.mem, capture: opt.chunkGraph == FlowGraphOn && rt.CUDA(),
		rows: chunkGraphRows(opt.chunkGraphRows), news: m.chunkGraphNews(opt.chunkEmit), pasts: map[int][]int{},
		buckets: map[[3]int]*chunkBucket{}}
	fb := s.frameBytes()
	Bm, Nm := g.rows[len(g.rows)-1], g.news[len(g.news)-1]
	_, inBytes := chunkLayout(m.chunkIn(Bm, Nm))
	_, workBytes := chunkLayout(m.chunkWork(Bm, Nm))
	other := int64(Bm*Nm)*fb + inBytes + workBytes + int64(Bm)*8
	budget := s.mem.limit/16 - other
	pastBytes := int64(0)
	for _, B := range g.rows {
		most := chunkGraphMostPast
		if budget > 0 {
			most = int(min(int64(most), budget/(int64(B)*fb)))
		} else {
			most = 0
		}
		if ps := chunkGraphPasts(f.ChunkFrames, most); len(ps) > 0 {
			g.pasts[B] = ps
			pastBytes = max(pastBytes, int64(B*ps[len(ps)-1])*fb)
		}
	}
	if len(g.pasts) == 0 {
		slog.Warn("chunk flow: engine.flow_kv_memory_mb leaves no room for fixed-shape runs; every batch runs in its own shape", "flow_kv_memory_mb", s.mem.limit>>20)
		return nil, nil
	}
	g.bytes = pastBytes + other
	if err := (*flowGrant)(nil).take(s.mem, g.bytes); err != nil {
		return nil, err
	}
	err := g.open(rt, s, fb, pastBytes, inBytes, workBytes, Bm, Nm)
	if err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

func (g *chunkGraphs) open(rt *ort.Runtime, s *flowChunks, fb, pastBytes, inBytes, workBytes int64, Bm, Nm int) error {
	m, f := g.m, g.m.Flow
	if g.capture {
		g.thread = ort.NewThread()
		err := g.thread.Do(func() (err error) {
			g.sess, err = iobind.Open(m.Path(f.ChunkStep), rt.FlowPlacement("flow_chunk_graph", true))
			return err
		})
		if err != nil {
			return fmt.Errorf("flow chunk step, CUDA graphs: %w", err)
		}
		g.own = true
	}
	var err error
	kv := int64(f.KVLayers * 4 * f.KVWidth)
	alloc := func(shape []int64, e iobind.Elem) (t *iobind.Tensor) {
		if err == nil {
			t, err = g.sess.Alloc(shape, e)
		}
		return t
	}
	g.past = alloc([]int64{pastBytes / fb, kv}, g.elem)
	g.present = alloc([]int64{int64(Bm * Nm), kv}, g.elem)
	g.in = alloc([]int64{inBytes / 4}, iobind.Float32)
	g.work = alloc([]int64{workBytes / 4}, iobind.Float32)
	g.start = alloc([]int64{int64(Bm)}, iobind.Int64)
	if err != nil {
		return fmt.Errorf("flow chunk step, fixed shapes: %w", err)
	}
	for _, B := range g.rows {
		for _, N := range g.news {
			for _, P := range g.pasts[B] {
				if err := g.newBucket(B, P, N); err != nil {
					return fmt.Errorf("flow chunk step, %d rows of %d past and %d new frames: %w", B, P, N, err)
				}
			}
		}
	}
	if g.capture {
		slog.Info("chunk flow: CUDA graphs captured", "buckets", len(g.buckets), "rows", g.rows, "new_frames", g.news,
			"most_past_frames", g.pasts[g.rows[0]][len(g.pasts[g.rows[0]])-1], "buffer_bytes", g.bytes)
	}
	return nil
}

// newBucket makes bucket (B, P, N): its views and bound run, and with capture its graph, checked.
func (g *chunkGraphs) newBucket(B, P, N int) error {
	m, f := g.m, g.m.Flow
	b := &chunkBucket{B: B, P: P, N: N, id: iobind.NoGraph}
	if g.capture {
		b.id = len(g.buckets) + 1
	}
	g.buckets[[3]int{B, P, N}] = b
	var err error
	view := func(t *iobind.Tensor, off int64, shape []int64) *iobind.Tensor {
		if err != nil {
			return nil
		}
		var v *iobind.Tensor
		if v, err = g.sess.View(t, off, shape); err == nil {
			b.views = append(b.views, v)
		}
		return v
	}
	kvShape := func(frames int) []int64 {
		return []int64{int64(B), int64(frames), int64(f.KVLayers), 4, int64(f.KVWidth)}
	}
	inParts, workParts := m.chunkIn(B, N), m.chunkWork(B, N)
	var inBytes, workBytes int64
	b.inOff, inBytes = chunkLayout(inParts)
	b.workOff, workBytes = chunkLayout(workParts)
	b.past = view(g.past, 0, kvShape(P))
	b.present = view(g.present, 0, kvShape(N))
	b.in = view(g.in, 0, []int64{inBytes / 4})
	b.work = view(g.work, 0, []int64{workBytes / 4})
	b.start = view(g.start, 0, []int64{int64(B)})
	b.inputs = map[string]*iobind.Tensor{m.Tensor("past_kv"): b.past, m.Tensor("start"): b.start}
	for _, i := range []int{inMask, inMu, inCond, inEmbedding, inCFG} {
		b.inputs[m.Tensor(inParts[i].name)] = view(b.in, b.inOff[i], inParts[i].shape)
	}
	for _, i := range []int{workX, workXNext, workT, workDT} {
		v := view(b.work, b.workOff[i], workParts[i].shape)
		if i == workXNext {
			b.xNext = v
		} else {
			b.inputs[m.Tensor(workParts[i].name)] = v
		}
	}
	if err != nil {
		return err
	}
	b.outputs = []iobind.Output{{Name: m.Tensor("x_next"), Into: b.xNext}, {Name: m.Tensor("present_kv"), Into: b.present}}
	if g.capture {
		b.run, err = g.sess.Bind(b.inputs, b.outputs, b.id)
	} else {
		b.run, err = g.sess.BindQueued(b.inputs, b.outputs)
	}
	if err != nil || !g.capture {
		return err
	}
	// Three runs: ONNX Runtime captures on the third with the graph's ID. The inputs are the last
	// bucket's or zeros; what the runs write is never read.
	for range 3 {
		if err := g.thread.Do(b.run.Run); err != nil {
			return err
		}
	}
	return g.check(b)
}

// check compares a replay of bucket b's graph with an uncaptured run of the same inputs, once:
// some of ONNX Runtime's CUDA kernels pass their arguments through a host buffer that only the
// capture fills, and their graphs replay garbage without an error. A bucket whose replay differs
// runs uncaptured from then on, with a warning.
func (g *chunkGraphs) check(b *chunkBucket) error {
	rng := rand.New(rand.NewPCG(uint64(b.B), uint64(b.P*1000+b.N)))
	in := make([]float32, b.in.Bytes()/4)
	for i := range in {
		in[i] = float32(rng.NormFloat64())
	}
	inParts := g.m.chunkIn(b.B, b.N)
	part := func(i int) []float32 {
		n := int64(1)
		for _, d := range inParts[i].shape {
			n *= d
		}
		return in[b.inOff[i]/4 : b.inOff[i]/4+n]
	}
	for _, i := range []int{inMask, inCFG} {
		for j := range part(i) {
			part(i)[j] = 1
		}
	}
	work := make([]float32, b.work.Bytes()/4)
	for i := range work {
		work[i] = float32(rng.NormFloat64())
	}
	work[b.workOff[workT]/4] = 0.5
	work[b.workOff[workDT]/4] = 0.1
	for i := 1; i < b.B; i++ {
		work[b.workOff[workT]/4+int64(i)] = 0.5
	}
	start := make([]int64, b.B)
	for i := range start {
		start[i] = int64(b.P * (i + 1) / (b.B + 1))
	}
	// A float32 past is random; a float16 one stays zero (the host has no float16 to upload).
	var pastVals []float32
	if g.elem == iobind.Float32 {
		pastVals = make([]float32, b.past.Bytes()/4)
		for i := range pastVals {
			pastVals[i] = float32(rng.NormFloat64())
		}
	}
	var out [2][]float32
	err := g.thread.Do(func() error {
		if pastVals != nil {
			if err := iobind.Upload(b.past, pastVals); err != nil {
				return err
			}
		} else if err := iobind.Zero(b.past); err != nil {
			return err
		}
		for k := range 2 {
			for _, u := range []struct {
				t *iobind.Tensor
				d any
			}{{b.in, in}, {b.work, work}, {b.start, start}} {
				if err := iobind.Upload(u.t, u.d); err != nil {
					return err
				}
			}
			if k == 0 {
				if err := b.run.Run(); err != nil {
					return err
				}
			} else {
				res, err := g.sess.RunGraph(b.inputs, b.outputs, iobind.NoGraph)
				release(res)
				if err != nil {
					return err
				}
			}
			out[k] = make([]float32, b.xNext.Bytes()/4)
			if err := iobind.Download(out[k], b.xNext); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("capture check: %w", err)
	}
	if rel := engine.RelRMS(out[0], out[1]); !(rel <= engine.ReplayTolerance) {
		b.plain = true
		slog.Warn("chunk flow: a CUDA graph's replay differs from an uncaptured run; batches of its shape run uncaptured (the graph has a kernel that cannot be captured: ONNX Runtime's Split into more than 32 outputs or Concat of unequal inputs; export it again, or set engine.flow_chunk_cuda_graph: off)",
			"rows", b.B, "past_frames", b.P, "new_frames", b.N, "relative_rms", rel)
	}
	return nil
}

// bucket is the bucket for a batch of B rows, the longest past P frames and the most new N
// frames: the smallest that holds it, or nil (the batch runs in its own shape).
func (g *chunkGraphs) bucket(B, P, N int) *chunkBucket {
	if g == nil {
		return nil
	}
	for _, bb := range g.rows {
		if bb < B {
			continue
		}
		for _, nn := range g.news {
			if nn < N {
				continue
			}
			for _, pp := range g.pasts[bb] {
				if pp >= P {
					if b := g.buckets[[3]int{bb, pp, nn}]; b != nil && !b.plain {
						return b
					}
					return nil
				}
			}
			return nil
		}
		return nil
	}
	return nil
}

// do runs f on the thread that owns the graphs (the caller's without capture).
func (g *chunkGraphs) do(f func() error) error {
	if g == nil {
		return f()
	}
	return g.thread.Do(f)
}

func (g *chunkGraphs) close() {
	if g == nil {
		return
	}
	g.thread.Do(func() error {
		for _, b := range g.buckets {
			b.release()
		}
		release([]*iobind.Tensor{g.past, g.present, g.in, g.work, g.start})
		if g.own && g.sess != nil {
			g.sess.Close()
		}
		return nil
	})
	g.thread.Close()
	g.buckets = nil
	if g.bytes > 0 {
		g.mem.free(g.bytes)
		g.bytes = 0
	}
}
