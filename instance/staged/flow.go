package staged

import (
	"errors"
	"fmt"
	"math"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	onnxrt "github.com/yalue/onnxruntime_go"
)

// The flow and vocoder stages run a batch of independent items in one ONNX Runtime call, padding
// to the longest item and masking the padding, so requests can share a run (see docs/pipeline.md).
// The LM is in lm.go and its decoders; the vocoder in vocoder.go.

// flowJob turns speech tokens into mel frames; noise is the starting sample, channel-major
// [mel_bins][len(tokens)·frames_per_token].
type flowJob struct {
	tokens []int64
	noise  []float32
	// prompt counts the voice's prompt tokens that lead tokens; lookahead the tokens at the end
	// that the encoder reads but whose frames are masked off and not returned.
	prompt, lookahead int
	// cond is the voice's prompt mel, channel-major [mel_bins][prompt·frames_per_token], and
	// embedding its speaker embedding; the step graph reads them with flow.embedding_dim.
	cond, embedding []float32
	// chunk is a chunk-causal run's (flow.chunk_step): tokens are the encoder's window then.
	chunk *chunkJob
}

// chunkJob is what a chunk-causal run reads of its stream besides its tokens.
type chunkJob struct {
	st    *chunkKV
	voice *Voice // nil: none
	last  bool
	// span is the item's: run sets span.from to where its mel starts.
	span *chunkSpan
	// toks are the voice's and the stream's tokens to the chunk's end and look-ahead; the encoder
	// reads them from span.tokFrom.
	toks []int64
	// grant is the batch's memory (flowMemory), shared by its jobs.
	grant *flowGrant
}

// frames are the job's frames that the flow returns: all but the look-ahead's.
func (j flowJob) frames(m *Manifest) int {
	return (len(j.tokens) - j.lookahead) * m.Flow.FramesPerToken
}

// flowSchedule is the time t_k and step size dt_k of each Euler step: linear, t_k = k/steps, or
// cosine (CosyVoice's), t_k = 1 − cos(k/steps · π/2) and dt_k = t_{k+1} − t_k.
func flowSchedule(m *Manifest) (t, dt []float32) {
	n := m.Flow.Steps
	t, dt = make([]float32, n), make([]float32, n)
	if m.Flow.Schedule != "cosine" {
		d := 1 / float32(n)
		for k := range n {
			t[k], dt[k] = float32(k)*d, d
		}
		return t, dt
	}
	at := func(k int) float64 { return 1 - math.Cos(float64(k)/float64(n)*math.Pi/2) }
	for k := range n {
		t[k], dt[k] = float32(at(k)), float32(at(k+1)-at(k))
	}
	return t, dt
}

// flowRunner is one flow worker: it turns a batch of jobs into mels. Two kinds: flowEstimator
// runs the manifest's encoder and estimator graphs with the Euler loop in Go; flowSteps runs the
// manifest's step graph (flow.step), each Euler step one call, captured as CUDA graphs on a GPU.
type flowRunner interface {
	// run returns each job's mel, channel-major [mel_bins][frames]. Once stop is closed it gives
	// up before the next Euler step.
	run(jobs []flowJob, stop <-chan struct{}) ([][]float32, error)
	// fit is how many of n waiting items of up to tokens tokens the next batch should take.
	fit(n, tokens int) int
	close() error
}

// newFlow opens one flow worker of the kind the manifest's graphs call for.
func newFlow(rt *ort.Runtime, m *Manifest, opt options, prompts *promptCache, mem *flowMemory) (flowRunner, error) {
	if m.Flow.ChunkStep != "" {
		c, err := newFlowChunks(rt, m, opt, prompts, mem)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	if m.Flow.Step != "" {
		s, err := newFlowSteps(rt, m, opt)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	e, err := newFlowEstimator(rt, m)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// checkFlowBatch refuses a batch over the manifest's flow.max_batch_frames.
func checkFlowBatch(m *Manifest, jobs []flowJob) error {
	if _, n := jobLens(jobs); len(jobs) > 0 {
		return m.flowBatchFits(len(jobs), n)
	}
	return nil
}

// flowEstimator runs the flow's encoder once and its estimator once per Euler step.
type flowEstimator struct {
	m         *Manifest
	encoder   *onnxrt.DynamicAdvancedSession
	estimator *onnxrt.DynamicAdvancedSession
}

func newFlowEstimator(rt *ort.Runtime, m *Manifest) (*flowEstimator, error) {
	enc, err := rt.FlowSession("flow_encoder", m.Path(m.Flow.Encoder), []string{m.Tensor("speech_tokens"), m.Tensor("token_mask")}, []string{m.Tensor("mu")})
	if err != nil {
		return nil, fmt.Errorf("flow encoder: %w", err)
	}
	est, err := rt.FlowSession("flow_estimator", m.Path(m.Flow.Estimator),
		[]string{m.Tensor("x"), m.Tensor("mask"), m.Tensor("mu"), m.Tensor("t")}, []string{m.Tensor("velocity")})
	if err != nil {
		enc.Destroy()
		return nil, fmt.Errorf("flow estimator: %w", err)
	}
	return &flowEstimator{m: m, encoder: enc, estimator: est}, nil
}

func (s *flowEstimator) run(jobs []flowJob, stop <-chan struct{}) ([][]float32, error) {
	if err := checkFlowBatch(s.m, jobs); err != nil {
		return nil, err
	}
	b, err := s.start(jobs)
	if err != nil {
		return nil, err
	}
	for !b.done() {
		select {
		case <-stop:
			return nil, engine.ErrClosed
		default:
		}
		if err := b.advance(); err != nil {
			return nil, err
		}
	}
	return b.mels(), nil
}

// fit takes every waiting item: the estimator runs any shape.
func (s *flowEstimator) fit(n, tokens int) int { return n }

func (s *flowEstimator) close() error {
	return errors.Join(s.encoder.Destroy(), s.estimator.Destroy())
}

// flowBatch is one batch of flow jobs between Euler steps.
type flowBatch struct {
	s        *flowEstimator
	frames   []int     // frames returned per job
	t, dt    []float32 // the Euler steps' times (flowSchedule)
	F, BB    int       // frames per job (padded), items per estimator call (2 per job with CFG)
	x        []float32
	mask, mu []float32 // the estimator's, for BB items
	step     int
}

// jobLens are the jobs' lengths in tokens and the longest.
func jobLens(jobs []flowJob) (lens []int, longest int) {
	lens = make([]int, len(jobs))
	for i, j := range jobs {
		lens[i] = len(j.tokens)
		longest = max(longest, lens[i])
	}
	return lens, longest
}

// paddedJobs lays jobs out as B items of N tokens (B ≥ len(jobs)), padding masked: the encoder's
// tokens [B][N] and token mask, the frame mask [B][F] and the starting sample [B][mel_bins][F].
// The token mask covers look-ahead tokens, the frame mask does not cover their frames.
func paddedJobs(m *Manifest, jobs []flowJob, B, N int) (toks []int64, tmask, fmask, x []float32) {
	C, R := m.Flow.MelBins, m.Flow.FramesPerToken
	F := N * R
	toks, tmask = make([]int64, B*N), make([]float32, B*N)
	fmask, x = make([]float32, B*F), make([]float32, B*C*F)
	for b, j := range jobs {
		copy(toks[b*N:], j.tokens)
		fb := len(j.tokens) * R
		for n := range j.tokens {
			tmask[b*N+n] = 1
		}
		for f := 0; f < j.frames(m); f++ {
			fmask[b*F+f] = 1
		}
		for c := 0; c < C; c++ {
			copy(x[(b*C+c)*F:(b*C+c)*F+fb], j.noise[c*fb:(c+1)*fb])
		}
	}
	return toks, tmask, fmask, x
}

// paddedCond lays out the step graph's cond [B][mel_bins][F] (each job's prompt mel in its first
// frames, zero elsewhere) and embedding [B][embedding_dim] (zero for padding rows).
func paddedCond(m *Manifest, jobs []flowJob, B, F int) (cond, emb []float32) {
	C, D := m.Flow.MelBins, m.Flow.EmbeddingDim
	cond, emb = make([]float32, B*C*F), make([]float32, B*D)
	for b, j := range jobs {
		p := len(j.cond) / C
		for c := 0; c < C; c++ {
			copy(cond[(b*C+c)*F:(b*C+c)*F+p], j.cond[c*p:(c+1)*p])
		}
		copy(emb[b*D:(b+1)*D], j.embedding)
	}
	return cond, emb
}

// jobFrames are the frames the flow returns of each job.
func jobFrames(m *Manifest, jobs []flowJob) []int {
	out := make([]int, len(jobs))
	for i, j := range jobs {
		out[i] = j.frames(m)
	}
	return out
}

// jobMels cuts each job's mel, channel-major [mel_bins][frames], out of x laid out as paddedJobs
// does with F frames per item; frames are what each job returns (jobFrames).
func jobMels(m *Manifest, frames []int, x []float32, F int) [][]float32 {
	C := m.Flow.MelBins
	out := make([][]float32, len(frames))
	for j, fb := range frames {
		mel := make([]float32, C*fb)
		for c := 0; c < C; c++ {
			copy(mel[c*fb:(c+1)*fb], x[(j*C+c)*F:(j*C+c)*F+fb])
		}
		out[j] = mel
	}
	return out
}

// start pads the jobs to one length and runs the encoder; no Euler step has run yet.
func (s *flowEstimator) start(jobs []flowJob) (*flowBatch, error) {
	B, C := len(jobs), s.m.Flow.MelBins
	_, N := jobLens(jobs)
	N = s.m.alignTokens(N)
	F := N * s.m.Flow.FramesPerToken
	toks, tmask, fmask, x := paddedJobs(s.m, jobs, B, N)
	mu, err := s.encode(B, N, toks, tmask)
	if err != nil {
		return nil, err
	}
	if len(mu) != B*C*F {
		return nil, fmt.Errorf("flow encoder: mu has %d values, want %d", len(mu), B*C*F)
	}
	fb := &flowBatch{s: s, frames: jobFrames(s.m, jobs), F: F, BB: B, x: x, mask: fmask, mu: mu}
	fb.t, fb.dt = flowSchedule(s.m)
	if s.m.Flow.CFGStrength > 0 {
		// Conditional and unconditional passes share one call of batch 2B.
		fb.BB = 2 * B
		fb.mask = append(append(make([]float32, 0, 2*B*F), fmask...), fmask...)
		fb.mu = append(append(make([]float32, 0, 2*B*C*F), mu...), make([]float32, B*C*F)...)
	}
	return fb, nil
}

func (b *flowBatch) done() bool { return b.step >= b.s.m.Flow.Steps }

// advance runs one Euler step.
func (b *flowBatch) advance() error {
	m := b.s.m
	C, cfg := m.Flow.MelBins, m.Flow.CFGStrength
	dt := b.dt[b.step]
	xin := b.x
	if cfg > 0 {
		xin = append(append(make([]float32, 0, 2*len(b.x)), b.x...), b.x...)
	}
	// Every item at the same step: one time for the whole call (docs/pipeline.md lets a graph
	// rely on it).
	t := make([]float32, b.BB)
	for i := range t {
		t[i] = b.t[b.step]
	}
	v, err := b.s.estimate(b.BB, C, b.F, xin, b.mask, b.mu, t)
	if err != nil {
		return err
	}
	if len(v) != b.BB*C*b.F {
		return fmt.Errorf("flow estimator: velocity has %d values, want %d", len(v), b.BB*C*b.F)
	}
	x := b.x
	for i := range x {
		vi := v[i]
		if cfg > 0 {
			vi = (1+cfg)*v[i] - cfg*v[len(x)+i]
		}
		x[i] += dt * vi
	}
	b.step++
	return nil
}

// mels returns each job's mel, channel-major [mel_bins][frames], once the batch is done.
func (b *flowBatch) mels() [][]float32 { return jobMels(b.s.m, b.frames, b.x, b.F) }

func (s *flowEstimator) encode(B, N int, toks []int64, tmask []float32) ([]float32, error) {
	a, err := onnxrt.NewTensor(onnxrt.NewShape(int64(B), int64(N)), toks)
	if err != nil {
		return nil, fmt.Errorf("flow encoder input: %w", err)
	}
	defer a.Destroy()
	m, err := onnxrt.NewTensor(onnxrt.NewShape(int64(B), 1, int64(N)), tmask)
	if err != nil {
		return nil, fmt.Errorf("flow encoder input: %w", err)
	}
	defer m.Destroy()
	outs := []onnxrt.Value{nil}
	if err := s.encoder.Run([]onnxrt.Value{a, m}, outs); err != nil {
		return nil, fmt.Errorf("flow encoder: %w", err)
	}
	defer ort.Destroy(outs)
	mu, err := ort.Floats(outs[0])
	return append([]float32(nil), mu...), err
}

func (s *flowEstimator) estimate(B, C, F int, x, mask, mu, t []float32) ([]float32, error) {
	var vals []onnxrt.Value
	defer func() { ort.Destroy(vals) }()
	for _, in := range []struct {
		shape onnxrt.Shape
		d     []float32
	}{
		{onnxrt.NewShape(int64(B), int64(C), int64(F)), x},
		{onnxrt.NewShape(int64(B), 1, int64(F)), mask},
		{onnxrt.NewShape(int64(B), int64(C), int64(F)), mu},
		{onnxrt.NewShape(int64(B)), t},
	} {
		v, err := onnxrt.NewTensor(in.shape, in.d)
		if err != nil {
			return nil, fmt.Errorf("flow estimator input: %w", err)
		}
		vals = append(vals, v)
	}
	outs := []onnxrt.Value{nil}
	if err := s.estimator.Run(vals, outs); err != nil {
		return nil, fmt.Errorf("flow estimator: %w", err)
	}
	defer ort.Destroy(outs)
	v, err := ort.Floats(outs[0])
	return append([]float32(nil), v...), err
}
