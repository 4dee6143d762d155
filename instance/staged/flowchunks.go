package staged

import (
	"fmt"
	"math"
	"slices"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// flowChunks runs the chunk-causal flow (flow.chunk_step; docs/cosyvoice3.md, "Chunk-causal flow")
// for the engine: a batch's rows each compute their stream's frames from the first not kept to
// the chunk's end, reading every earlier frame's keys and values (the voice's from the prompt
// cache, the stream's own from its chunkKV) instead of computing them again. Rows of different
// past lengths share one call: each row's past is padded to the batch's longest and the graph
// ignores a row's past frames from its start on. The kept keys and values, the kept frames'
// samples and every step's inputs stay in the session's memory (the GPU): a run copies its inputs
// there once, queues its Euler steps and the device-to-device copies between them on the
// session's stream without waiting, and copies the last step's samples back once. A batch's
// shape changes with its past lengths: small batches run in fixed shapes (graphs, with
// flow_chunk_cuda_graph), captured as CUDA graphs on a GPU; the rest in their own shapes.
type flowChunks struct {
	m         *Manifest
	enc, step *iobind.Session
	cache     *promptCache
	mem       *flowMemory
	elem      iobind.Elem // the kept keys' and values' type (the manifest's dtype)
	graphs    *chunkGraphs
	// last is what the latest compute moved between host and device memory, and waited for;
	// lastBucket the bucket it ran in (nil: its own shape).
	last       chunkIO
	lastBucket *chunkBucket
}

// chunkIO counts one run's copies between host and device memory and its waits for the device
// (ONNX Runtime's encoder run counts as what it moves and one wait): what must not grow with the
// number of Euler steps.
type chunkIO struct {
	transfers, syncs int
}

// chunkKV is the keys and values of an utterance's kept frames, per Euler step: the frames of a
// voice prompt's entry (base), then its own n, in segments of exactly the frames each run kept
// (no spare capacity, nothing copied to grow). ctx holds, per step, the last conv_context_frames
// (or fewer) kept frames' samples as they entered the step, in the session's memory: float32
// [steps, mel, conv_context_frames], the frames at the end. Until the stream keeps frames of its
// own it is its voice's (ownCtx false).
type chunkKV struct {
	base   *voiceKV
	segs   []kvSeg
	n      int
	ctx    *iobind.Tensor
	ownCtx bool
	// mem is where the segments' and an own ctx's bytes are counted; bytes what they take.
	mem   *flowMemory
	bytes int64
}

// kvSeg is frames kept by one run: [steps, frames, kv_layers, 4, kv_width].
type kvSeg struct {
	t      *iobind.Tensor
	frames int
}

func (c *chunkKV) baseFrames() int {
	if c.base == nil {
		return 0
	}
	return c.base.kv.done()
}

// done is the number of frames kept, from the voice prompt's first.
func (c *chunkKV) done() int { return c.baseFrames() + c.n }

// close frees the frames c holds itself.
func (c *chunkKV) close() {
	for _, s := range c.segs {
		s.t.Release()
	}
	c.segs, c.n = nil, 0
	if c.ownCtx {
		c.ctx.Release()
	}
	c.ctx, c.ownCtx = nil, false
	if c.mem != nil {
		c.mem.free(c.bytes)
	}
	c.bytes = 0
}

// drop frees c's own frames, keeping its voice's: a stream gives them up for room and computes
// them again from the voice's on.
func (c *chunkKV) drop() {
	c.close()
	if c.base != nil {
		c.ctx = c.base.kv.ctx
	}
}

// chunkCtxBytes is what a chunkKV's own ctx takes.
func (m *Manifest) chunkCtxBytes() int64 {
	f := m.Flow
	return int64(f.Steps*f.MelBins*f.ConvContextFrames) * 4
}

// chunkPart is one float32 tensor of a run's inputs or working memory.
type chunkPart struct {
	name  string
	shape []int64
}

// A run's float32 tensors are views of two device buffers, each tensor at a 256-byte boundary
// (the alignment CUDA kernels' vector loads expect): in, copied from the host once per run, and
// work, which its steps write. t_all and dt_all are every step's t and dt, x0 the first step's
// new frames (the noise); each step copies its own into t, dt and x.
const (
	inMask = iota
	inMu
	inCond
	inEmbedding
	inCFG
	inTAll
	inDTAll
	inX0
)

const (
	workX = iota
	workXNext
	workT
	workDT
)

func (m *Manifest) chunkIn(B, N int) []chunkPart {
	f := m.Flow
	b, M, W, K := int64(B), int64(f.MelBins), int64(f.ConvContextFrames+N), int64(f.Steps)
	return []chunkPart{{"mask", []int64{b, 1, W}}, {"mu", []int64{b, M, W}}, {"cond", []int64{b, M, W}},
		{"embedding", []int64{b, int64(f.EmbeddingDim)}}, {"cfg", []int64{1}}, {"t_all", []int64{K, b}},
		{"dt_all", []int64{K}}, {"x0", []int64{b, M, int64(N)}}}
}

func (m *Manifest) chunkWork(B, N int) []chunkPart {
	f := m.Flow
	b, M, W := int64(B), int64(f.MelBins), int64(f.ConvContextFrames+N)
	return []chunkPart{{"x", []int64{b, M, W}}, {"x_next", []int64{b, M, int64(N)}}, {"t", []int64{b}}, {"dt", []int64{1}}}
}

// chunkLayout is each part's byte offset in its buffer and the buffer's size.
func chunkLayout(parts []chunkPart) (offs []int64, bytes int64) {
	for _, p := range parts {
		offs = append(offs, bytes)
		n := int64(4)
		for _, d := range p.shape {
			n *= d
		}
		bytes += (n + 255) / 256 * 256
	}
	return offs, bytes
}

// chunkRunBytes is the device memory a run of B rows, the longest past P frames and the longest
// new N, allocates for as long as it runs: its padded past and present, its inputs and working
// memory.
func (m *Manifest) chunkRunBytes(B, P, N int) int64 {
	_, in := chunkLayout(m.chunkIn(B, N))
	_, work := chunkLayout(m.chunkWork(B, N))
	return int64(B*(P+N))*m.chunkFrameBytes() + in + work + int64(B)*8
}

func newFlowChunks(rt *ort.Runtime, m *Manifest, opt options, cache *promptCache, mem *flowMemory) (*flowChunks, error) {
	if m.noise == nil {
		return nil, fmt.Errorf("flow.chunk_step needs flow.noise: a voice's kept frames must not depend on a request's seed")
	}
	if m.Flow.ChunkFrames%m.Flow.FramesPerToken != 0 {
		return nil, fmt.Errorf("flow.chunk_frames %d is not a whole number of tokens of flow.frames_per_token %d", m.Flow.ChunkFrames, m.Flow.FramesPerToken)
	}
	if mem == nil {
		mem = newFlowMemory(math.MaxInt64)
	}
	s := &flowChunks{m: m, cache: cache, mem: mem, elem: iobind.Float32}
	if m.DType == "float16" {
		s.elem = iobind.Float16
	}
	var err error
	if s.enc, err = iobind.Open(m.Path(m.Flow.Encoder), rt.FlowPlacement("flow_encoder", false)); err != nil {
		return nil, fmt.Errorf("flow encoder: %w", err)
	}
	if s.step, err = iobind.Open(m.Path(m.Flow.ChunkStep), rt.FlowPlacement("flow_chunk", false)); err != nil {
		s.enc.Close()
		return nil, fmt.Errorf("flow chunk step: %w", err)
	}
	if opt.chunkGraph == FlowGraphOn || opt.chunkGraph == FlowGraphFixed {
		if s.graphs, err = newChunkGraphs(rt, s, opt); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// frameBytes is what one kept frame takes at one Euler step.
func (s *flowChunks) frameBytes() int64 {
	f := s.m.Flow
	return int64(f.KVLayers*4*f.KVWidth) * int64(s.elem.Size())
}

// fit takes every waiting item: the graph runs any shape.
func (s *flowChunks) fit(n, tokens int) int { return n }

func (s *flowChunks) close() error {
	s.graphs.close()
	s.enc.Close()
	s.step.Close()
	return nil
}

// chunkRow is one row of a chunk-causal batch: frames [st.done(), end) of an utterance, whose
// tokens from tokFrom (from the voice prompt's first) the encoder reads; keep of its new frames
// are kept in st afterwards.
type chunkRow struct {
	st       *chunkKV
	end      int
	keep     int
	tokens   []int64
	tokFrom  int
	cond     []float32 // the voice's prompt mel, channel-major [mel][prompt frames]; nil: none
	emb      []float32
	mu       []float32 // set by encode: frame-major from frame tokFrom·frames_per_token
	voiceKey *[32]byte
}

// chunkPlan is what a chunk-causal run computes of one job: frames [from, end), keeping keep.
// from is the first frame the stream has not kept: its span's start, or earlier where the stream
// gave up its own frames for room (chunkKV.drop) and computes them again.
func (m *Manifest) chunkPlan(done int, sp *chunkSpan, last bool) (from, keep int) {
	from = done
	keep = sp.end - from
	if !last {
		keep = max(0, sp.end/m.Flow.ChunkFrames*m.Flow.ChunkFrames-from)
	}
	return from, keep
}

// chunkTokFrom is the first token (from the voice prompt's) the encoder reads for frames from on.
func (m *Manifest) chunkTokFrom(from int) int {
	return max(0, (from-m.Flow.ConvContextFrames)/m.Flow.FramesPerToken-chunkEncoderContext)
}

// run computes each job's frames and returns their mel, channel-major [mel][end−from]; each
// job's span.from is where its mel starts.
func (s *flowChunks) run(jobs []flowJob, stop <-chan struct{}) ([][]float32, error) {
	var out [][]float32
	err := s.graphs.do(func() (err error) {
		out, err = s.runOn(jobs, stop)
		return err
	})
	return out, err
}

// runOn is run on the thread that owns the CUDA graphs.
func (s *flowChunks) runOn(jobs []flowJob, stop <-chan struct{}) ([][]float32, error) {
	rows := make([]*chunkRow, len(jobs))
	var grant *flowGrant
	for i, j := range jobs {
		ck := j.chunk
		st, sp := ck.st, ck.span
		grant = ck.grant
		if st.base == nil && st.n == 0 && ck.voice != nil && s.m.voiceFrames(len(ck.voice.SpeechTokens)*s.m.Flow.FramesPerToken) > 0 {
			if err := s.attachVoice(st, ck.voice, j.embedding, grant); err != nil {
				return nil, err
			}
		}
		if st.done() > sp.from {
			return nil, fmt.Errorf("chunk flow: the stream keeps %d frames, its chunk starts at %d", st.done(), sp.from)
		}
		from, keep := s.m.chunkPlan(st.done(), sp, ck.last)
		sp.from = from
		sp.tokFrom = s.m.chunkTokFrom(from)
		rows[i] = &chunkRow{st: st, end: sp.end, keep: keep, tokens: ck.toks[sp.tokFrom:], tokFrom: sp.tokFrom, cond: j.cond, emb: j.embedding}
	}
	return s.compute(rows, stop, grant)
}

// attachVoice gives st the voice's kept frames, from the cache or computed now.
func (s *flowChunks) attachVoice(st *chunkKV, v *Voice, emb []float32, grant *flowGrant) error {
	V := s.m.voiceFrames(len(v.SpeechTokens) * s.m.Flow.FramesPerToken)
	ent, err := s.cache.acquire(voiceKey(v), func() (*chunkKV, int64, error) {
		kv := &chunkKV{}
		// The voice alone: its tokens, no request after them; frames [0, V) read none of the
		// frames after V (the mask) and no token after the prompt (V stops short of its look-ahead).
		row := &chunkRow{st: kv, end: V, keep: V, tokens: v.SpeechTokens, cond: v.Mel, emb: emb}
		if _, err := s.compute([]*chunkRow{row}, nil, grant); err != nil {
			kv.close()
			return nil, 0, fmt.Errorf("voice %s's prompt: %w", v.Name, err)
		}
		return kv, kv.bytes, nil
	})
	if err != nil {
		return err
	}
	st.base = ent
	st.ctx = ent.kv.ctx
	return nil
}

// encode runs the flow encoder over every row's tokens in one batch and keeps each row's mu.
func (s *flowChunks) encode(rows []*chunkRow) error {
	M, R := s.m.Flow.MelBins, s.m.Flow.FramesPerToken
	B, N := len(rows), 0
	for _, r := range rows {
		N = max(N, len(r.tokens))
	}
	toks, tmask := make([]int64, B*N), make([]float32, B*N)
	for b, r := range rows {
		copy(toks[b*N:], r.tokens)
		for i := range r.tokens {
			tmask[b*N+i] = 1
		}
	}
	a, err := iobind.Host([]int64{int64(B), int64(N)}, toks)
	if err != nil {
		return err
	}
	defer a.Release()
	mk, err := iobind.Host([]int64{int64(B), 1, int64(N)}, tmask)
	if err != nil {
		return err
	}
	defer mk.Release()
	out, err := s.enc.Run(map[string]*iobind.Tensor{s.m.Tensor("speech_tokens"): a, s.m.Tensor("token_mask"): mk},
		[]iobind.Output{{Name: s.m.Tensor("mu"), Host: true}})
	if err != nil {
		return fmt.Errorf("flow encoder: %w", err)
	}
	defer release(out)
	mu, err := out[0].Float32s()
	if err != nil {
		return err
	}
	F := N * R
	if len(mu) != B*M*F {
		return fmt.Errorf("flow encoder: mu has %d values, want %d", len(mu), B*M*F)
	}
	for b, r := range rows {
		r.mu = frameMajor(mu[b*M*F:(b+1)*M*F], M, F)
	}
	return nil
}

// compute runs rows through every Euler step in one batch, keeps each row's keep new frames and
// returns its mel, channel-major. Its device memory comes out of grant (flowMemory): the kept
// frames and context samples, and the run's padded past and present, inputs and working memory,
// given back at the end.
//
// Each step's x window (conv_context_frames of context, then the new frames) is laid out on the
// device: the row's kept context samples for that step, then the previous step's x_next (the
// noise at the first). Those copies, the step's past and what it keeps are queued on the
// session's stream with the run itself, so nothing waits between steps; the host reads x_next
// once, after the last.
func (s *flowChunks) compute(rows []*chunkRow, stop <-chan struct{}, grant *flowGrant) ([][]float32, error) {
	f := s.m.Flow
	M, C, R, K := f.MelBins, f.ConvContextFrames, f.FramesPerToken, f.Steps
	var io chunkIO
	defer func() { s.last = io }()
	if err := s.encode(rows); err != nil {
		return nil, err
	}
	io.transfers += 3 // tokens and mask in, mu out
	io.syncs++
	B, N, P := len(rows), 0, 1
	for _, r := range rows {
		N = max(N, r.end-r.st.done())
		P = max(P, r.st.done())
	}
	// In a bucket the batch is padded to its shape: rows past B are all masked.
	bk := s.graphs.bucket(B, P, N)
	s.lastBucket = bk
	if bk != nil {
		B, P, N = bk.B, bk.P, bk.N
	}
	W := C + N
	inParts, workParts := s.m.chunkIn(B, N), s.m.chunkWork(B, N)
	inOff, inBytes := chunkLayout(inParts)
	workOff, _ := chunkLayout(workParts)
	host := make([]float32, inBytes/4)
	part := func(i int) []float32 {
		n := int64(1)
		for _, d := range inParts[i].shape {
			n *= d
		}
		return host[inOff[i]/4 : inOff[i]/4+n]
	}
	mask, mu, cond, emb, x0 := part(inMask), part(inMu), part(inCond), part(inEmbedding), part(inX0)
	start := make([]int64, B)
	noise := s.m.noise
	T := len(noise) / M
	for b, r := range rows {
		from := r.st.done()
		n, have := r.end-from, min(from, C)
		if have > 0 && r.st.ctx == nil {
			return nil, fmt.Errorf("chunk flow: a stream keeps %d frames but not their samples", from)
		}
		start[b] = int64(from)
		copy(emb[b*f.EmbeddingDim:], r.emb)
		pf := len(r.cond) / M
		for i := C - have; i < C+n; i++ {
			fr := from - C + i
			mask[b*W+i] = 1
			lf := fr - r.tokFrom*R
			for ch := range M {
				mu[(b*M+ch)*W+i] = r.mu[lf*M+ch]
				if fr < pf {
					cond[(b*M+ch)*W+i] = r.cond[ch*pf+fr]
				}
			}
		}
		for i := range n {
			row := noise[((from+i)%T)*M:]
			for ch := range M {
				x0[(b*M+ch)*N+i] = row[ch]
			}
		}
	}
	ts, dts := flowSchedule(s.m)
	tAll, dtAll := part(inTAll), part(inDTAll)
	for k := range K {
		for b := range B {
			tAll[k*B+b] = ts[k]
		}
		dtAll[k] = dts[k]
	}
	part(inCFG)[0] = f.CFGStrength

	fb, cb := s.frameBytes(), s.m.chunkCtxBytes()
	// Each row's kept frames and context samples, allocated exactly; they join the row's state
	// once every step ran.
	segs, ctxs := make([]*iobind.Tensor, B), make([]*iobind.Tensor, B)
	var keptBytes int64
	defer func() {
		// Not handed over: a failed or stopped batch.
		for b := range segs {
			segs[b].Release()
			ctxs[b].Release()
		}
		s.mem.free(keptBytes)
	}()
	for b, r := range rows {
		if r.keep == 0 {
			continue
		}
		n := int64(K*r.keep)*fb + cb
		if err := grant.take(s.mem, n); err != nil {
			return nil, err
		}
		keptBytes += n
		var err error
		if segs[b], err = s.step.AllocEmpty([]int64{int64(K), int64(r.keep), int64(f.KVLayers), 4, int64(f.KVWidth)}, s.elem); err != nil {
			return nil, fmt.Errorf("flow chunk step, keeping %d frames: %w", r.keep, err)
		}
		if ctxs[b], err = s.step.AllocEmpty([]int64{int64(K), int64(M), int64(C)}, iobind.Float32); err != nil {
			return nil, fmt.Errorf("flow chunk step, keeping %d frames' samples: %w", r.keep, err)
		}
	}
	// The run's tensors: a bucket's (counted in flowMemory with the buckets), else its own,
	// released once the session's stream has run everything queued.
	rt := &chunkRunTensors{sess: s.step}
	defer rt.release()
	if bk != nil {
		rt.sess, rt.past, rt.present, rt.in, rt.work, rt.start, rt.xNext, rt.run = s.graphs.sess, bk.past, bk.present, bk.in, bk.work, bk.start, bk.xNext, bk.run
	} else {
		scratch := s.m.chunkRunBytes(B, P, N)
		if err := grant.take(s.mem, scratch); err != nil {
			return nil, err
		}
		defer s.mem.free(scratch)
		if err := s.ownTensors(rt, B, P, N); err != nil {
			return nil, err
		}
	}
	sess, past, present, in, work, xNext := rt.sess, rt.past, rt.present, rt.in, rt.work, rt.xNext
	if err := iobind.Upload(in, host); err != nil {
		return nil, fmt.Errorf("flow chunk step, inputs: %w", err)
	}
	if err := iobind.Upload(rt.start, start); err != nil {
		return nil, fmt.Errorf("flow chunk step, start: %w", err)
	}
	io.transfers += 2
	io.syncs += 2
	// Padding must read as zeros: a row's past beyond its own, context before frame 0, new
	// frames past a row's own.
	rt.queued = true
	for _, t := range []*iobind.Tensor{past, work} {
		if err := sess.ZeroOn(t); err != nil {
			return nil, fmt.Errorf("flow chunk step: %w", err)
		}
	}

	const f4 = 4
	b4, w4, n4, c4 := int64(B)*f4, int64(W)*f4, int64(N)*f4, int64(C)*f4
	var copies []iobind.Copy
	for k := range K {
		select {
		case <-stop:
			return nil, engine.ErrClosed
		default:
		}
		k64 := int64(k)
		copies = append(copies[:0],
			iobind.Copy{Dst: work, DstOff: workOff[workT], DstPitch: b4, Src: in, SrcOff: inOff[inTAll] + k64*b4, SrcPitch: b4, Width: b4, Height: 1},
			iobind.Copy{Dst: work, DstOff: workOff[workDT], DstPitch: f4, Src: in, SrcOff: inOff[inDTAll] + k64*f4, SrcPitch: f4, Width: f4, Height: 1})
		for b, r := range rows {
			from := r.st.done()
			n, have := r.end-from, min(from, C)
			rowX := workOff[workX] + int64(b*M*W)*f4
			// The window: the kept frames' samples as they entered this step, then the new
			// frames' (the noise at the first step, the previous step's x_next after).
			if have > 0 {
				copies = append(copies, iobind.Copy{Dst: work, DstOff: rowX + int64(C-have)*f4, DstPitch: w4,
					Src: r.st.ctx, SrcOff: (k64*int64(M*C) + int64(C-have)) * f4, SrcPitch: c4, Width: int64(have) * f4, Height: int64(M)})
			}
			src, srcOff := work, workOff[workXNext]
			if k == 0 {
				src, srcOff = in, inOff[inX0]
			}
			copies = append(copies, iobind.Copy{Dst: work, DstOff: rowX + int64(C)*f4, DstPitch: w4,
				Src: src, SrcOff: srcOff + int64(b*M)*n4, SrcPitch: n4, Width: int64(n) * f4, Height: int64(M)})
			if r.keep > 0 {
				// The row's context from now on: the last C of its frames as they entered.
				c := min(have+r.keep, C)
				copies = append(copies, iobind.Copy{Dst: ctxs[b], DstOff: (k64*int64(M*C) + int64(C-c)) * f4, DstPitch: c4,
					Src: work, SrcOff: rowX + int64(C+r.keep-c)*f4, SrcPitch: w4, Width: int64(c) * f4, Height: int64(M)})
			}
			// The row's past: the voice's kept frames, then its own.
			off := int64(b*P) * fb
			var voice []kvSeg
			if r.st.base != nil {
				voice = r.st.base.kv.segs
			}
			for _, sg := range slices.Concat(voice, r.st.segs) {
				w := int64(sg.frames) * fb
				copies = append(copies, iobind.Copy{Dst: past, DstOff: off, DstPitch: w, Src: sg.t, SrcOff: k64 * w, SrcPitch: w, Width: w, Height: 1})
				off += w
			}
		}
		if err := sess.CopiesOn(copies); err != nil {
			return nil, fmt.Errorf("flow chunk step, inputs of step %d: %w", k, err)
		}
		if err := rt.run.Run(); err != nil {
			return nil, fmt.Errorf("flow chunk step: %w", err)
		}
		copies = copies[:0]
		for b, r := range rows {
			if r.keep > 0 {
				w := int64(r.keep) * fb
				copies = append(copies, iobind.Copy{Dst: segs[b], DstOff: k64 * w, DstPitch: w, Src: present, SrcOff: int64(b*N) * fb, SrcPitch: w, Width: w, Height: 1})
			}
		}
		if err := sess.CopiesOn(copies); err != nil {
			return nil, fmt.Errorf("flow chunk step, keeping: %w", err)
		}
	}
	if err := sess.Wait(); err != nil {
		return nil, fmt.Errorf("flow chunk step: %w", err)
	}
	rt.queued = false
	io.syncs++
	next := make([]float32, B*M*N)
	if err := iobind.Download(next, xNext); err != nil {
		return nil, fmt.Errorf("flow chunk step, x_next: %w", err)
	}
	io.transfers++
	io.syncs++
	x := make([][]float32, B)
	for b, r := range rows {
		n := r.end - r.st.done()
		x[b] = make([]float32, M*n)
		for ch := range M {
			copy(x[b][ch*n:(ch+1)*n], next[(b*M+ch)*N:(b*M+ch)*N+n])
		}
	}
	for b, r := range rows {
		if r.keep == 0 {
			continue
		}
		st := r.st
		if st.ownCtx {
			st.ctx.Release()
			st.bytes -= cb
			s.mem.free(cb)
		}
		st.ctx, st.ownCtx = ctxs[b], true
		n := int64(K*r.keep)*fb + cb
		st.segs = append(st.segs, kvSeg{t: segs[b], frames: r.keep})
		st.n += r.keep
		st.bytes += n
		st.mem = s.mem
		segs[b], ctxs[b] = nil, nil
		keptBytes -= n
	}
	return x, nil
}

// chunkRunTensors are the tensors one compute runs on and the session whose stream runs it.
type chunkRunTensors struct {
	sess                                  *iobind.Session
	past, present, in, work, start, xNext *iobind.Tensor
	run                                   *iobind.Bound
	// own are the tensors and the run allocated for this compute alone; queued: work is queued
	// on sess's stream that they may be read by.
	own    []*iobind.Tensor
	ownRun bool
	queued bool
}

func (t *chunkRunTensors) release() {
	if t.queued {
		_ = t.sess.Wait()
	}
	if t.ownRun {
		t.run.Close()
	}
	for i := len(t.own) - 1; i >= 0; i-- {
		t.own[i].Release()
	}
}

// ownTensors allocates a run's tensors in its own shape: B rows, P past and N new frames.
func (s *flowChunks) ownTensors(t *chunkRunTensors, B, P, N int) error {
	f := s.m.Flow
	inParts, workParts := s.m.chunkIn(B, N), s.m.chunkWork(B, N)
	inOff, inBytes := chunkLayout(inParts)
	workOff, workBytes := chunkLayout(workParts)
	var err error
	alloc := func(shape []int64, e iobind.Elem) *iobind.Tensor {
		if err != nil {
			return nil
		}
		var a *iobind.Tensor
		if a, err = s.step.AllocEmpty(shape, e); err == nil {
			t.own = append(t.own, a)
		}
		return a
	}
	view := func(of *iobind.Tensor, off int64, p chunkPart) *iobind.Tensor {
		if err != nil {
			return nil
		}
		var v *iobind.Tensor
		if v, err = s.step.View(of, off, p.shape); err == nil {
			t.own = append(t.own, v)
		} else {
			err = fmt.Errorf("%s: %w", p.name, err)
		}
		return v
	}
	kvShape := func(frames int) []int64 {
		return []int64{int64(B), int64(frames), int64(f.KVLayers), 4, int64(f.KVWidth)}
	}
	t.past = alloc(kvShape(P), s.elem)
	t.present = alloc(kvShape(N), s.elem)
	t.in = alloc([]int64{inBytes / 4}, iobind.Float32)
	t.work = alloc([]int64{workBytes / 4}, iobind.Float32)
	t.start = alloc([]int64{int64(B)}, iobind.Int64)
	inputs := map[string]*iobind.Tensor{s.m.Tensor("past_kv"): t.past, s.m.Tensor("start"): t.start}
	for _, i := range []int{inMask, inMu, inCond, inEmbedding, inCFG} {
		inputs[s.m.Tensor(inParts[i].name)] = view(t.in, inOff[i], inParts[i])
	}
	for _, i := range []int{workX, workXNext, workT, workDT} {
		v := view(t.work, workOff[i], workParts[i])
		if i == workXNext {
			t.xNext = v
		} else {
			inputs[s.m.Tensor(workParts[i].name)] = v
		}
	}
	if err == nil {
		t.run, err = s.step.BindQueued(inputs, []iobind.Output{{Name: s.m.Tensor("x_next"), Into: t.xNext}, {Name: s.m.Tensor("present_kv"), Into: t.present}})
		t.ownRun = err == nil
	}
	if err != nil {
		return fmt.Errorf("flow chunk step: %w", err)
	}
	return nil
}
