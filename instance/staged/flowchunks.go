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
// ignores a row's past frames from its start on. The kept keys and values stay in the session's
// memory (the GPU); only the new frames' samples cross to the host between Euler steps. Runs
// uncaptured (no CUDA graphs): a batch's shape changes with its past lengths.
type flowChunks struct {
	m         *Manifest
	enc, step *iobind.Session
	cache     *promptCache
	mem       *flowMemory
	elem      iobind.Elem // the kept keys' and values' type (the manifest's dtype)
}

// chunkKV is the keys and values of an utterance's kept frames, per Euler step: the frames of a
// voice prompt's entry (base), then its own n, in segments of exactly the frames each run kept
// (no spare capacity, nothing copied to grow). xs holds, per step, the last conv_context_frames
// (or fewer) kept frames' samples as they entered the step, frame-major.
type chunkKV struct {
	base *voiceKV
	segs []kvSeg
	n    int
	xs   [][]float32
	// mem is where the segments' bytes are counted; bytes what they take.
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
	if c.mem != nil {
		c.mem.free(c.bytes)
	}
	c.bytes = 0
}

// drop frees c's own frames, keeping its voice's: a stream gives them up for room and computes
// them again from the voice's on.
func (c *chunkKV) drop(steps int) {
	c.close()
	if c.base != nil {
		c.xs = cloneAll(c.base.kv.xs)
	} else {
		c.xs = make([][]float32, steps)
	}
}

func newFlowChunks(rt *ort.Runtime, m *Manifest, cache *promptCache, mem *flowMemory) (*flowChunks, error) {
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
		kv := &chunkKV{xs: make([][]float32, s.m.Flow.Steps)}
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
	st.xs = cloneAll(ent.kv.xs)
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
// frames, and the padded past and present, given back at the end.
func (s *flowChunks) compute(rows []*chunkRow, stop <-chan struct{}, grant *flowGrant) ([][]float32, error) {
	f := s.m.Flow
	M, C, R, K := f.MelBins, f.ConvContextFrames, f.FramesPerToken, f.Steps
	if err := s.encode(rows); err != nil {
		return nil, err
	}
	B, N, P := len(rows), 0, 1
	for _, r := range rows {
		N = max(N, r.end-r.st.done())
		P = max(P, r.st.done())
	}
	W := C + N
	mask, mu, cond := make([]float32, B*W), make([]float32, B*M*W), make([]float32, B*M*W)
	start, emb := make([]int64, B), make([]float32, B*f.EmbeddingDim)
	x := make([][]float32, B) // each row's new frames' sample, channel-major [mel][n]
	noise := s.m.noise
	T := len(noise) / M
	for b, r := range rows {
		from := r.st.done()
		n, have := r.end-from, min(from, C)
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
		x[b] = make([]float32, M*n)
		for i := range n {
			row := noise[((from+i)%T)*M:]
			for ch := range M {
				x[b][ch*n+i] = row[ch]
			}
		}
	}
	fb := s.frameBytes()
	kvShape := func(frames int) []int64 {
		return []int64{int64(B), int64(frames), int64(f.KVLayers), 4, int64(f.KVWidth)}
	}
	// Each row's kept frames, allocated exactly; they join the row's state once every step ran.
	segs := make([]*iobind.Tensor, B)
	var segBytes int64
	defer func() {
		// Not handed over: a failed or stopped batch.
		for _, t := range segs {
			t.Release()
		}
		s.mem.free(segBytes)
	}()
	for b, r := range rows {
		if r.keep == 0 {
			continue
		}
		n := int64(K*r.keep) * fb
		if err := grant.take(s.mem, n); err != nil {
			return nil, err
		}
		segBytes += n
		t, err := s.step.AllocEmpty([]int64{int64(K), int64(r.keep), int64(f.KVLayers), 4, int64(f.KVWidth)}, s.elem)
		if err != nil {
			return nil, fmt.Errorf("flow chunk step, keeping %d frames: %w", r.keep, err)
		}
		segs[b] = t
	}
	scratch := int64(B*(P+N)) * fb
	if err := grant.take(s.mem, scratch); err != nil {
		return nil, err
	}
	defer s.mem.free(scratch)
	past, err := s.step.Alloc(kvShape(P), s.elem)
	if err != nil {
		return nil, fmt.Errorf("flow chunk step: %w", err)
	}
	defer past.Release()
	present, err := s.step.Alloc(kvShape(N), s.elem)
	if err != nil {
		return nil, fmt.Errorf("flow chunk step: %w", err)
	}
	defer present.Release()
	host := map[string]*iobind.Tensor{}
	defer func() {
		for _, t := range host {
			t.Release()
		}
	}()
	put := func(name string, shape []int64, d any) error {
		if t := host[name]; t != nil {
			t.Release()
		}
		t, err := iobind.Host(shape, d)
		if err != nil {
			return fmt.Errorf("flow chunk step, %s: %w", name, err)
		}
		host[s.m.Tensor(name)] = t
		return nil
	}
	b64, m64, w64 := int64(B), int64(M), int64(W)
	for _, in := range []struct {
		name  string
		shape []int64
		d     any
	}{
		{"mask", []int64{b64, 1, w64}, mask}, {"mu", []int64{b64, m64, w64}, mu}, {"cond", []int64{b64, m64, w64}, cond},
		{"start", []int64{b64}, start}, {"cfg", []int64{1}, []float32{f.CFGStrength}},
		{"embedding", []int64{b64, int64(f.EmbeddingDim)}, emb},
	} {
		if err := put(in.name, in.shape, in.d); err != nil {
			return nil, err
		}
	}
	ts, dts := flowSchedule(s.m)
	newX := make([][][]float32, B) // per row, per step: the new frames kept, frame-major
	for b := range rows {
		newX[b] = make([][]float32, K)
	}
	for k := range K {
		select {
		case <-stop:
			return nil, engine.ErrClosed
		default:
		}
		xw := make([]float32, B*M*W)
		var copies []iobind.Copy
		for b, r := range rows {
			from := r.st.done()
			n, have := r.end-from, min(from, C)
			xs := r.st.xs[k]
			for i := C - have; i < C; i++ {
				fr := len(xs)/M - (C - i)
				for ch := range M {
					xw[(b*M+ch)*W+i] = xs[fr*M+ch]
				}
			}
			for ch := range M {
				copy(xw[(b*M+ch)*W+C:], x[b][ch*n:(ch+1)*n])
			}
			if r.keep > 0 {
				newX[b][k] = frameMajor(x[b], M, n)[:r.keep*M]
			}
			// The row's past: the voice's kept frames, then its own.
			off := int64(b*P) * fb
			var own []kvSeg
			if r.st.base != nil {
				own = r.st.base.kv.segs
			}
			for _, sg := range slices.Concat(own, r.st.segs) {
				w := int64(sg.frames) * fb
				copies = append(copies, iobind.Copy{Dst: past, DstOff: off, DstPitch: w, Src: sg.t, SrcOff: int64(k) * w, SrcPitch: w, Width: w, Height: 1})
				off += w
			}
		}
		if err := iobind.Copies(copies); err != nil {
			return nil, fmt.Errorf("flow chunk step, past: %w", err)
		}
		for _, in := range []struct {
			name  string
			shape []int64
			d     any
		}{{"x", []int64{b64, m64, w64}, xw}, {"t", []int64{b64}, fill(B, ts[k])}, {"dt", []int64{1}, []float32{dts[k]}}} {
			if err := put(in.name, in.shape, in.d); err != nil {
				return nil, err
			}
		}
		in := map[string]*iobind.Tensor{s.m.Tensor("past_kv"): past}
		for name, t := range host {
			in[name] = t
		}
		out, err := s.step.Run(in, []iobind.Output{{Name: s.m.Tensor("x_next"), Host: true}, {Name: s.m.Tensor("present_kv"), Into: present}})
		if err != nil {
			return nil, fmt.Errorf("flow chunk step: %w", err)
		}
		next, err := out[0].Float32s()
		release(out)
		if err != nil {
			return nil, err
		}
		copies = copies[:0]
		for b, r := range rows {
			n := r.end - r.st.done()
			for ch := range M {
				copy(x[b][ch*n:(ch+1)*n], next[(b*M+ch)*N:(b*M+ch)*N+n])
			}
			if r.keep > 0 {
				w := int64(r.keep) * fb
				copies = append(copies, iobind.Copy{Dst: segs[b], DstOff: int64(k) * w, DstPitch: w, Src: present, SrcOff: int64(b*N) * fb, SrcPitch: w, Width: w, Height: 1})
			}
		}
		if err := iobind.Copies(copies); err != nil {
			return nil, fmt.Errorf("flow chunk step, keeping: %w", err)
		}
	}
	for b, r := range rows {
		if r.keep == 0 {
			continue
		}
		for k := range K {
			xs := append(r.st.xs[k], newX[b][k]...)
			if len(xs) > C*M {
				xs = append([]float32(nil), xs[len(xs)-C*M:]...)
			}
			r.st.xs[k] = xs
		}
		n := int64(K*r.keep) * fb
		r.st.segs = append(r.st.segs, kvSeg{t: segs[b], frames: r.keep})
		r.st.n += r.keep
		r.st.bytes += n
		r.st.mem = s.mem
		segs[b] = nil
		segBytes -= n
	}
	return x, nil
}

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}
