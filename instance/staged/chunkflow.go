package staged

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// chunkFlow runs the chunk-causal step graph (flow.chunk_step; docs/cosyvoice3.md, "Chunk-causal
// flow") over one utterance a segment at a time in host memory: under CosyVoice's streaming mask
// a frame sees only frames of its own and earlier chunks, so the keys and values of a complete
// chunk, at each Euler step and guidance pass and in each layer, never change once computed, and
// every later segment reads them instead of computing them again. It needs a float32 export (the
// host tensors are float32).
type chunkFlow struct {
	m *Manifest
	s *iobind.Session
}

// chunkState is one utterance's kept frames: the frames [0, done) of its complete chunks.
type chunkState struct {
	done int
	// kv[k] holds frames [0, done) as they were at Euler step k: per frame kv_layers × 4 ×
	// kv_width values (keys of the conditional and unconditional passes, then their values).
	kv [][]float32
	// xs[k] holds the last conv_context_frames (or fewer) of those frames' samples as they entered
	// step k, frame-major [frames][mel_bins]: the DiT's causal position convolutions read them.
	xs [][]float32
}

func newChunkFlow(m *Manifest, s *iobind.Session) (*chunkFlow, error) {
	if m.Flow.ChunkStep == "" {
		return nil, fmt.Errorf("flow.chunk_step: not in the manifest")
	}
	if m.DType != "float32" {
		return nil, fmt.Errorf("flow.chunk_step: the host runner needs dtype float32, not %s", m.DType)
	}
	return &chunkFlow{m: m, s: s}, nil
}

func (c *chunkFlow) newState() *chunkState {
	n := c.m.Flow.Steps
	return &chunkState{kv: make([][]float32, n), xs: make([][]float32, n)}
}

// frameKV is the number of values one frame keeps per Euler step.
func (c *chunkFlow) frameKV() int { return c.m.Flow.KVLayers * 4 * c.m.Flow.KVWidth }

// kvBytes is what one frame's keys and values take over every Euler step, in the graph's dtype:
// the memory a kept frame costs.
func (c *chunkFlow) kvBytes() int64 {
	elem := int64(4)
	if c.m.DType == "float16" {
		elem = 2
	}
	return int64(c.m.Flow.Steps*c.frameKV()) * elem
}

// voiceFrames is how many of a voice prompt's frames depend on the voice alone: its complete
// chunks short of the frames of its last look-ahead tokens, whose mu reads the request's first
// tokens (the encoder's look-ahead runs over prompt and request tokens together).
func (c *chunkFlow) voiceFrames(promptFrames int) int { return c.m.voiceFrames(promptFrames) }

// utterance is what chunkFlow.run reads of one utterance, frame-major [frames][mel_bins] from the
// voice prompt's first frame: mu, cond and the starting noise; emb is the speaker embedding.
type utterance struct {
	mu, cond, noise, emb []float32
}

// run computes frames [st.done, end) of u and returns their mel, channel-major [mel_bins][n].
// The chunks that [st.done, end) completes (all of it when final: the utterance ends at end) are
// kept in st; a segment ending inside a chunk is computed before that chunk's later frames exist,
// and the run that completes the chunk computes it again, whole.
func (c *chunkFlow) run(st *chunkState, u utterance, end int, final bool) ([]float32, error) {
	f := c.m.Flow
	M, C, s := f.MelBins, f.ConvContextFrames, st.done
	n := end - s
	if n <= 0 {
		return nil, fmt.Errorf("chunk flow: nothing to compute (frames %d to %d)", s, end)
	}
	if len(u.mu) < end*M || len(u.cond) < end*M || len(u.noise) < end*M {
		return nil, fmt.Errorf("chunk flow: %d frames asked, mu, cond or noise is shorter", end)
	}
	W := C + n
	have := min(s, C) // context frames that exist
	mask := make([]float32, W)
	for i := C - have; i < W; i++ {
		mask[i] = 1
	}
	// window lays frames [s-have, end) of a frame-major array out channel-major over the window.
	window := func(dst []float32, src []float32, from int) {
		for i := from; i < W; i++ {
			fr := s - C + i
			for ch := range M {
				dst[ch*W+i] = src[fr*M+ch]
			}
		}
	}
	mu, cond := make([]float32, M*W), make([]float32, M*W)
	window(mu, u.mu, C-have)
	window(cond, u.cond, C-have)
	x := make([]float32, M*n) // channel-major, the new frames
	for i := range n {
		for ch := range M {
			x[ch*n+i] = u.noise[(s+i)*M+ch]
		}
	}
	ts, dts := flowSchedule(c.m)
	per := c.frameKV()
	newKV := make([][]float32, f.Steps)
	newX := make([][]float32, f.Steps)
	for k := range f.Steps {
		xw := make([]float32, M*W)
		xs := st.xs[k]
		for i := C - have; i < C; i++ {
			row := len(xs)/M - (C - i)
			for ch := range M {
				xw[ch*W+i] = xs[row*M+ch]
			}
		}
		for ch := range M {
			copy(xw[ch*W+C:ch*W+W], x[ch*n:(ch+1)*n])
		}
		newX[k] = frameMajor(x, M, n)
		past := st.kv[k]
		P := s
		if P == 0 {
			past, P = make([]float32, per), 1 // the graph wants P >= 1; frames from start on are ignored
		}
		next, present, err := c.step(xw, mask, mu, cond, s, ts[k], dts[k], u.emb, past, P, W)
		if err != nil {
			return nil, err
		}
		x, newKV[k] = next, present
	}
	keep := n
	if !final {
		keep = n / f.ChunkFrames * f.ChunkFrames
	}
	if keep > 0 {
		for k := range f.Steps {
			st.kv[k] = append(st.kv[k], newKV[k][:keep*per]...)
			xs := append(st.xs[k], newX[k][:keep*M]...)
			if len(xs) > C*M {
				xs = append([]float32(nil), xs[len(xs)-C*M:]...)
			}
			st.xs[k] = xs
		}
		st.done = s + keep
	}
	return x, nil
}

// step runs the graph once for one row; it returns x_next, channel-major [mel][n], and the new
// frames' keys and values, frame-major.
func (c *chunkFlow) step(x, mask, mu, cond []float32, start int, t, dt float32, emb, past []float32, P, W int) ([]float32, []float32, error) {
	f := c.m.Flow
	M := int64(f.MelBins)
	w := int64(W)
	ins := []struct {
		name  string
		shape []int64
		data  any
	}{
		{"x", []int64{1, M, w}, x},
		{"mask", []int64{1, 1, w}, mask},
		{"mu", []int64{1, M, w}, mu},
		{"cond", []int64{1, M, w}, cond},
		{"start", []int64{1}, []int64{int64(start)}},
		{"t", []int64{1}, []float32{t}},
		{"dt", []int64{1}, []float32{dt}},
		{"cfg", []int64{1}, []float32{f.CFGStrength}},
		{"embedding", []int64{1, int64(f.EmbeddingDim)}, emb},
		{"past_kv", []int64{1, int64(P), int64(f.KVLayers), 4, int64(f.KVWidth)}, past},
	}
	in := map[string]*iobind.Tensor{}
	defer func() {
		for _, t := range in {
			t.Release()
		}
	}()
	for _, i := range ins {
		t, err := iobind.Host(i.shape, i.data)
		if err != nil {
			return nil, nil, fmt.Errorf("chunk flow, %s: %w", i.name, err)
		}
		in[c.m.Tensor(i.name)] = t
	}
	out, err := c.s.Run(in, []iobind.Output{{Name: c.m.Tensor("x_next"), Host: true}, {Name: c.m.Tensor("present_kv"), Host: true}})
	if err != nil {
		return nil, nil, fmt.Errorf("flow chunk step: %w", err)
	}
	defer release(out)
	next, err := out[0].Float32s()
	if err != nil {
		return nil, nil, err
	}
	present, err := out[1].Float32s()
	return next, present, err
}

// frameMajor turns channel-major [ch][n] into frame-major [n][ch].
func frameMajor(a []float32, ch, n int) []float32 {
	out := make([]float32, len(a))
	for c := range ch {
		for i := range n {
			out[i*ch+c] = a[c*n+i]
		}
	}
	return out
}

func cloneAll(a [][]float32) [][]float32 {
	out := make([][]float32, len(a))
	for i := range a {
		out[i] = append([]float32(nil), a[i]...)
	}
	return out
}
