package staged

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// flowSteps runs the flow through its step graph (manifest flow.step): one Euler step with the
// guidance in the graph, so a batch's sample, conditioning and mask stay in the session's memory
// (the GPU) from the encoder to the last step, and between steps only the flow time goes up. With
// flow_cuda_graph on, batches run in bucket shapes whose steps are captured at load as CUDA graphs:
// a step is one graph launch instead of hundreds of kernel launches and their host work
// (docs/pipeline.md, "The flow's step graph").
type flowSteps struct {
	m         *Manifest
	enc, step *iobind.Session
	// thread runs every call of the sessions: ONNX Runtime keeps a session's CUDA graphs per OS
	// thread (nil: the caller's thread, without graphs).
	thread *ort.Thread
	mode   FlowGraph // flow_cuda_graph
	// batches and tokens are the buckets' sizes, rising; buckets holds those made (on, fixed).
	batches, tokens []int
	buckets         map[[2]int]*flowBucket
	dt, cfg         *iobind.Tensor // the step size and guidance strength, shared by every bucket
	names           flowStepNames
}

type flowStepNames struct{ toks, tmask, mu, x, mask, t, dt, cfg, next, cond, emb string }

// flowBucket holds the tensors of batches of B items of N tokens (N·frames_per_token frames):
// the encoder's inputs, the conditioning, the sample and the next one, the mask and the time;
// with flow.embedding_dim also the voices' prompt mel (cond) and speaker embeddings (emb).
type flowBucket struct {
	id, B, N                              int // id: the CUDA graph's, or iobind.NoGraph
	toks, tmask, mu, x, next, mask, times *iobind.Tensor
	cond, emb                             *iobind.Tensor // nil without flow.embedding_dim
}

func (b *flowBucket) release() {
	release([]*iobind.Tensor{b.toks, b.tmask, b.mu, b.x, b.next, b.mask, b.times, b.cond, b.emb})
}

// flowGraphFrames caps a bucket's padded frames (batch × frames): the engine's frame budget
// per flow batch (NewEngine), unless the manifest's flow.max_batch_frames is lower (flowFrames).
const flowGraphFrames = 8192

// flowFrames is the engine's frame budget per flow batch for m, and the largest bucket's.
func flowFrames(m *Manifest) int {
	if mf := m.Flow.MaxBatchFrames; mf > 0 {
		return min(flowGraphFrames, mf)
	}
	return flowGraphFrames
}

// flowBatchSizes are the buckets' batch sizes: the padding a batch adds to reach one stays
// under a quarter of its rows, and the engine takes batches that fit one (flowSteps.fit).
var flowBatchSizes = []int{1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64}

// flowTokenSizes are the buckets' lengths in tokens for m's chunk schedule: each chunk of the
// schedule with the context the chunks before it give, its look-ahead and each voice's prompt
// length (the lengths nearly every batch has), and every 16 tokens up to the longest for a
// stream's last, shorter chunk; each rounded up so that its frames are a multiple of 8 (what the
// fused attention wants). A batch runs in the smallest that holds its longest item.
func flowTokenSizes(m *Manifest) []int {
	ctx, la := m.Streaming.ContextTokens, m.Flow.LookaheadTokens
	longest := m.alignTokens(m.longestFlowTokens())
	var out []int
	for _, p := range m.promptLens() {
		sum := 0
		for _, c := range m.Streaming.ChunkTokens {
			out = append(out, m.alignTokens(p+c+min(ctx, sum)+la))
			sum += c
		}
	}
	for n := 16; n < longest; n += 16 {
		out = append(out, m.alignTokens(n))
	}
	out = append(out, longest)
	slices.Sort(out)
	return slices.Compact(out)
}

func newFlowSteps(rt *ort.Runtime, m *Manifest, opt options) (*flowSteps, error) {
	s := &flowSteps{m: m, mode: opt.flowGraph, names: flowStepNames{
		toks: m.Tensor("speech_tokens"), tmask: m.Tensor("token_mask"), mu: m.Tensor("mu"), x: m.Tensor("x"),
		mask: m.Tensor("mask"), t: m.Tensor("t"), dt: m.Tensor("dt"), cfg: m.Tensor("cfg"), next: m.Tensor("x_next"),
		cond: m.Tensor("cond"), emb: m.Tensor("embedding")}}
	graphs := s.mode == FlowGraphOn && rt.CUDA()
	if graphs {
		s.thread = ort.NewThread()
	}
	err := s.thread.Do(func() (err error) {
		if s.enc, err = iobind.Open(m.Path(m.Flow.Encoder), rt.FlowPlacement("flow_encoder", false)); err != nil {
			return fmt.Errorf("flow encoder: %w", err)
		}
		if s.step, err = iobind.Open(m.Path(m.Flow.Step), rt.FlowPlacement("flow_step", graphs)); err != nil {
			return fmt.Errorf("flow step: %w", err)
		}
		return nil
	})
	if err == nil {
		err = s.constants()
	}
	if err == nil && s.mode != FlowGraphOff {
		s.batches, s.tokens = flowBatchSizes, flowTokenSizes(m)
		err = s.makeBuckets(graphs)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// constants puts the step size and guidance strength where the step graph reads them.
func (s *flowSteps) constants() error {
	var err error
	if s.dt, err = s.step.Alloc([]int64{1}, iobind.Float32); err == nil {
		if s.cfg, err = s.step.Alloc([]int64{1}, iobind.Float32); err == nil {
			if err = iobind.Upload(s.dt, []float32{1 / float32(s.m.Flow.Steps)}); err == nil {
				err = iobind.Upload(s.cfg, []float32{s.m.Flow.CFGStrength})
			}
		}
	}
	if err != nil {
		return fmt.Errorf("flow step: %w", err)
	}
	return nil
}

// makeBuckets makes every bucket and runs each one's step: three times with graphs, as ONNX
// Runtime captures a graph on the third run with its ID, else once, so that no request pays for
// a shape's first run. The inputs are zero (every frame masked); what the runs write is never read.
func (s *flowSteps) makeBuckets(graphs bool) error {
	s.buckets = map[[2]int]*flowBucket{}
	var checks []*flowBucket // in the order made
	runs := 1
	if graphs {
		runs = 3
	}
	for _, N := range s.tokens {
		for _, B := range s.batches {
			if B*N*s.m.Flow.FramesPerToken > flowFrames(s.m) {
				break
			}
			id := iobind.NoGraph
			if graphs {
				id = len(s.buckets) + 1
			}
			b, err := s.newBucket(id, B, N)
			if err != nil {
				return err
			}
			s.buckets[[2]int{B, N}] = b
			for range runs {
				if err := s.thread.Do(func() error { return s.runStep(b, b.id) }); err != nil {
					return fmt.Errorf("flow step, %d items of %d tokens: %w", B, N, err)
				}
			}
			checks = append(checks, b)
		}
	}
	if !graphs || len(checks) == 0 {
		return nil
	}
	// The first graph captured and the last: a kernel that is unsafe to capture shows up after
	// later runs have reused what its replay reads.
	for _, b := range []*flowBucket{checks[0], checks[len(checks)-1]} {
		if err := s.thread.Do(func() error { return s.check(b) }); err != nil {
			return err
		}
	}
	return nil
}

// check compares a replay of bucket b's graph with a plain run of the same step. Some of ONNX
// Runtime's CUDA kernels pass their arguments through a host buffer that only the capture fills
// (Split into more than 32 outputs, Concat of unequal inputs), and their graphs compute garbage
// without an error.
func (s *flowSteps) check(b *flowBucket) error {
	C, F := s.m.Flow.MelBins, b.N*s.m.Flow.FramesPerToken
	rng := rand.New(rand.NewPCG(uint64(b.B), uint64(b.N)))
	x, mu := make([]float32, b.B*C*F), make([]float32, b.B*C*F)
	for i := range x {
		x[i], mu[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	mask, times := make([]float32, b.B*F), make([]float32, b.B)
	for i := range mask {
		mask[i] = 1
	}
	for i := range times {
		times[i] = 0.5
	}
	var out [2][]float32
	for k, id := range []int{b.id, iobind.NoGraph} {
		for _, u := range []struct {
			t *iobind.Tensor
			d []float32
		}{{b.x, x}, {b.mu, mu}, {b.mask, mask}, {b.times, times}} {
			if err := iobind.Upload(u.t, u.d); err != nil {
				return fmt.Errorf("flow step check: %w", err)
			}
		}
		if err := s.runStep(b, id); err != nil {
			return err
		}
		out[k] = make([]float32, len(x))
		if err := iobind.Download(out[k], b.x); err != nil {
			return fmt.Errorf("flow step check: %w", err)
		}
	}
	if rel := engine.RelRMS(out[0], out[1]); !(rel <= engine.ReplayTolerance) {
		return fmt.Errorf("flow step, %d items of %d tokens: its CUDA graph's replay differs from a plain run by %.3g (relative rms): the graph has a kernel that cannot be captured (ONNX Runtime's Split into more than 32 outputs or Concat of unequal inputs); re-export it, or set engine.flow_cuda_graph: fixed", b.B, b.N, rel)
	}
	return nil
}

func (s *flowSteps) newBucket(id, B, N int) (*flowBucket, error) {
	F := int64(N * s.m.Flow.FramesPerToken)
	C, b64, n64 := int64(s.m.Flow.MelBins), int64(B), int64(N)
	b := &flowBucket{id: id, B: B, N: N}
	var err error
	type alloc struct {
		p     **iobind.Tensor
		shape []int64
		elem  iobind.Elem
	}
	allocs := []alloc{
		{&b.toks, []int64{b64, n64}, iobind.Int64},
		{&b.tmask, []int64{b64, 1, n64}, iobind.Float32},
		{&b.mu, []int64{b64, C, F}, iobind.Float32},
		{&b.x, []int64{b64, C, F}, iobind.Float32},
		{&b.next, []int64{b64, C, F}, iobind.Float32},
		{&b.mask, []int64{b64, 1, F}, iobind.Float32},
		{&b.times, []int64{b64}, iobind.Float32},
	}
	D := int64(s.m.Flow.EmbeddingDim)
	if D > 0 {
		allocs = append(allocs, alloc{&b.cond, []int64{b64, C, F}, iobind.Float32}, alloc{&b.emb, []int64{b64, D}, iobind.Float32})
	}
	for _, t := range allocs {
		if *t.p, err = s.step.Alloc(t.shape, t.elem); err != nil {
			b.release()
			return nil, fmt.Errorf("flow step, %d items of %d tokens: %w", B, N, err)
		}
	}
	if D > 0 {
		// The warm-up runs and the capture check read them before any batch writes them.
		err = iobind.Upload(b.cond, make([]float32, B*int(C*F)))
		if err == nil {
			err = iobind.Upload(b.emb, make([]float32, B*int(D)))
		}
		if err != nil {
			b.release()
			return nil, fmt.Errorf("flow step, %d items of %d tokens: %w", B, N, err)
		}
	}
	return b, nil
}

// bucket is the bucket for a batch of B items of up to N tokens: the smallest made that holds
// it, else (temp) one of its own shape, to be released after the batch.
func (s *flowSteps) bucket(B, N int) (b *flowBucket, temp bool, err error) {
	if i := slices.IndexFunc(s.tokens, func(n int) bool { return n >= N }); i >= 0 {
		for _, bb := range s.batches {
			if b := s.buckets[[2]int{bb, s.tokens[i]}]; bb >= B && b != nil {
				return b, false, nil
			}
		}
	}
	b, err = s.newBucket(iobind.NoGraph, B, s.m.alignTokens(N))
	return b, true, err
}

// fit is how many of n waiting items of up to tokens tokens a batch should take: all of them
// where a bucket holds them with at most an eighth of its rows padding, else as many as the
// largest bucket below n holds, the rest waiting for the next batch. Padding rows cost the GPU as
// much as real ones.
func (s *flowSteps) fit(n, tokens int) int {
	i := slices.IndexFunc(s.tokens, func(t int) bool { return t >= tokens })
	if i < 0 {
		return n
	}
	var sizes []int
	for _, bb := range s.batches {
		if s.buckets[[2]int{bb, s.tokens[i]}] != nil {
			sizes = append(sizes, bb)
		}
	}
	if len(sizes) == 0 {
		return n
	}
	if n >= sizes[len(sizes)-1] {
		return sizes[len(sizes)-1]
	}
	j := slices.IndexFunc(sizes, func(bb int) bool { return bb >= n })
	if up := sizes[j]; (up-n)*8 <= up || j == 0 {
		return n
	}
	return sizes[j-1]
}

// run returns each job's mel, channel-major [mel_bins][frames]. Once stop is closed it gives up
// before the next Euler step.
func (s *flowSteps) run(jobs []flowJob, stop <-chan struct{}) ([][]float32, error) {
	if err := checkFlowBatch(s.m, jobs); err != nil {
		return nil, err
	}
	var out [][]float32
	err := s.thread.Do(func() (err error) {
		out, err = s.runOn(jobs, stop)
		return err
	})
	return out, err
}

func (s *flowSteps) runOn(jobs []flowJob, stop <-chan struct{}) ([][]float32, error) {
	_, N := jobLens(jobs)
	b, temp, err := s.bucket(len(jobs), N)
	if err != nil {
		return nil, err
	}
	if temp {
		defer b.release()
	}
	F := b.N * s.m.Flow.FramesPerToken
	toks, tmask, mask, x := paddedJobs(s.m, jobs, b.B, b.N)
	type upload struct {
		t *iobind.Tensor
		d any
	}
	uploads := []upload{{b.toks, toks}, {b.tmask, tmask}, {b.mask, mask}, {b.x, x}}
	if b.cond != nil {
		cond, emb := paddedCond(s.m, jobs, b.B, F)
		uploads = append(uploads, upload{b.cond, cond}, upload{b.emb, emb})
	}
	for _, u := range uploads {
		if err := iobind.Upload(u.t, u.d); err != nil {
			return nil, fmt.Errorf("flow: %w", err)
		}
	}
	res, err := s.enc.Run(map[string]*iobind.Tensor{s.names.toks: b.toks, s.names.tmask: b.tmask},
		[]iobind.Output{{Name: s.names.mu, Into: b.mu}})
	release(res)
	if err != nil {
		return nil, fmt.Errorf("flow encoder: %w", err)
	}
	times := make([]float32, b.B)
	ts, dts := flowSchedule(s.m)
	for step := range s.m.Flow.Steps {
		select {
		case <-stop:
			return nil, engine.ErrClosed
		default:
		}
		// The host path's times exactly (flowBatch.advance).
		for i := range times {
			times[i] = ts[step]
		}
		if err := iobind.Upload(b.times, times); err != nil {
			return nil, fmt.Errorf("flow: %w", err)
		}
		// A linear schedule's step size is the constant uploaded at load; a graph replay reads
		// the shared dt tensor where it was captured, so a new value is written in place.
		if s.m.Flow.Schedule != "linear" {
			if err := iobind.Upload(s.dt, dts[step:step+1]); err != nil {
				return nil, fmt.Errorf("flow: %w", err)
			}
		}
		if err := s.runStep(b, b.id); err != nil {
			return nil, err
		}
	}
	if err := iobind.Download(x, b.x); err != nil {
		return nil, fmt.Errorf("flow: %w", err)
	}
	return jobMels(s.m, jobFrames(s.m, jobs), x, F), nil
}

// runStep takes one Euler step of bucket b's sample in place, as CUDA graph id (b.id, or
// iobind.NoGraph for a plain run).
func (s *flowSteps) runStep(b *flowBucket, id int) error {
	n := s.names
	in := map[string]*iobind.Tensor{n.x: b.x, n.mask: b.mask, n.mu: b.mu, n.t: b.times, n.dt: s.dt, n.cfg: s.cfg}
	if b.cond != nil {
		in[n.cond], in[n.emb] = b.cond, b.emb
	}
	res, err := s.step.RunGraph(in, []iobind.Output{{Name: n.next, Into: b.next}}, id)
	release(res)
	if err != nil {
		return fmt.Errorf("flow step: %w", err)
	}
	// A replay writes where the capture did, so the next sample is copied over the current one
	// (on the device: a copy of a few megabytes).
	if err := iobind.Copy2D(b.x, 0, b.x.Bytes(), b.next, 0, b.next.Bytes(), b.x.Bytes(), 1); err != nil {
		return fmt.Errorf("flow step: %w", err)
	}
	return nil
}

func (s *flowSteps) close() error {
	for _, b := range s.buckets {
		b.release()
	}
	s.buckets = nil
	release([]*iobind.Tensor{s.dt, s.cfg})
	s.thread.Do(func() error {
		if s.enc != nil {
			s.enc.Close()
		}
		if s.step != nil {
			s.step.Close()
		}
		return nil
	})
	s.thread.Close()
	return nil
}
