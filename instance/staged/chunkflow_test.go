package staged

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// tinyChunkFlow opens models/tiny-cosyvoice3's chunk-causal step graph (flow.chunk_step, which
// `make tiny-cosyvoice3` exports with --chunk-flow) and its whole-utterance step graph.
func tinyChunkFlow(t *testing.T) (*chunkFlow, *iobind.Session) {
	t.Helper()
	if _, err := os.Stat(tinyCV3); err != nil {
		if requireTinyCV3() {
			t.Fatalf("%v, and VOXMUX_REQUIRE_TINY_COSYVOICE3 is set", err)
		}
		t.Skipf("%v: run make tiny-cosyvoice3", err)
	}
	m, err := LoadManifest(tinyCV3)
	if err != nil {
		t.Fatal(err)
	}
	if m.Flow.ChunkStep == "" {
		if requireTinyCV3() {
			t.Fatalf("%s has no flow.chunk_step, and VOXMUX_REQUIRE_TINY_COSYVOICE3 is set", tinyCV3)
		}
		t.Skipf("%s has no flow.chunk_step: run make tiny-cosyvoice3", tinyCV3)
	}
	if err := iobind.Init(ortLibrary(t)); err != nil {
		t.Fatal(err)
	}
	open := func(f string) *iobind.Session {
		s, err := iobind.Open(m.Path(f), iobind.Placement{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	c, err := newChunkFlow(m, open(m.Flow.ChunkStep))
	if err != nil {
		t.Fatal(err)
	}
	return c, open(m.Flow.Step)
}

func randomUtterance(m *Manifest, promptFrames, frames int, seed uint64) utterance {
	r := rand.New(rand.NewPCG(seed, 1))
	M := m.Flow.MelBins
	norm := func(n int, off float32) []float32 {
		a := make([]float32, n)
		for i := range a {
			a[i] = float32(r.NormFloat64()) + off
		}
		return a
	}
	u := utterance{mu: norm(frames*M, 0), cond: make([]float32, frames*M), noise: norm(frames*M, 0), emb: norm(m.Flow.EmbeddingDim, 0)}
	copy(u.cond, norm(promptFrames*M, -5))
	return u
}

// One chunk of frames from frame 0 sees all of itself: the chunk-causal graph must give what the
// whole-utterance step graph gives.
func TestChunkStepOneChunkEqualsStep(t *testing.T) {
	c, step := tinyChunkFlow(t)
	m := c.m
	M, C, n := m.Flow.MelBins, m.Flow.ConvContextFrames, 40
	u := randomUtterance(m, 20, n, 1)
	ts, dts := flowSchedule(m)
	mu, cond, x := channelMajor(u.mu, M, n), channelMajor(u.cond, M, n), channelMajor(u.noise, M, n)
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	host := func(shape []int64, d any) *iobind.Tensor {
		tt, err := iobind.Host(shape, d)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tt.Release)
		return tt
	}
	N, Mm := int64(n), int64(M)
	out, err := step.Run(map[string]*iobind.Tensor{
		"x": host([]int64{1, Mm, N}, x), "mask": host([]int64{1, 1, N}, ones), "mu": host([]int64{1, Mm, N}, mu),
		"t": host([]int64{1}, []float32{ts[3]}), "dt": host([]int64{1}, []float32{dts[3]}),
		"cfg": host([]int64{1}, []float32{m.Flow.CFGStrength}), "cond": host([]int64{1, Mm, N}, cond),
		"embedding": host([]int64{1, int64(m.Flow.EmbeddingDim)}, u.emb),
	}, []iobind.Output{{Name: "x_next", Host: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer release(out)
	want, _ := out[0].Float32s()
	pad := func(a []float32) []float32 {
		w := make([]float32, M*(C+n))
		for ch := range M {
			copy(w[ch*(C+n)+C:], a[ch*n:(ch+1)*n])
		}
		return w
	}
	mask := make([]float32, C+n)
	for i := C; i < C+n; i++ {
		mask[i] = 1
	}
	got, present, err := c.step(pad(x), mask, pad(mu), pad(cond), 0, ts[3], dts[3], u.emb, make([]float32, c.frameKV()), 1, C+n)
	if err != nil {
		t.Fatal(err)
	}
	d := maxDiff(got, want)
	if d > 1e-5 {
		t.Fatalf("chunk step against the step graph: max |diff| %.2e", d)
	}
	t.Logf("chunk step against the step graph: max |diff| %.2e", d)
	if len(present) != n*c.frameKV() {
		t.Fatalf("present_kv has %d values, want %d", len(present), n*c.frameKV())
	}
}

func channelMajor(a []float32, ch, n int) []float32 {
	out := make([]float32, ch*n)
	for i := range n {
		for c := range ch {
			out[c*n+i] = a[i*ch+c]
		}
	}
	return out
}

// The cached run, a segment at a time from a voice prompt's kept chunks (with a first segment
// ending inside its chunk, computed again once the chunk completes), gives the mel of one run
// over the whole utterance under the same mask, to float32 rounding.
func TestChunkFlowCachedEqualsWhole(t *testing.T) {
	c, _ := tinyChunkFlow(t)
	m := c.m
	M := m.Flow.MelBins
	P, R := 226, 150
	Fr := P + R
	u := randomUtterance(m, P, Fr, 2)
	whole, err := c.run(c.newState(), u, Fr, true)
	if err != nil {
		t.Fatal(err)
	}
	wantAt := func(from, to int) []float32 {
		out := make([]float32, 0, M*(to-from))
		for ch := range M {
			out = append(out, whole[ch*Fr+from:ch*Fr+to]...)
		}
		return out
	}

	// The voice alone: its last look-ahead tokens' mu differs (no request after it), so only its
	// frames before voiceFrames are kept for every request.
	V := c.voiceFrames(P)
	if V != 200 {
		t.Fatalf("voiceFrames(%d) = %d, want 200", P, V)
	}
	voiceU := u
	voiceU.mu = append([]float32(nil), u.mu[:P*M]...)
	for i := (P - m.Flow.LookaheadTokens*m.Flow.FramesPerToken) * M; i < P*M; i++ {
		voiceU.mu[i] += 1
	}
	voice := c.newState()
	if _, err := c.run(voice, voiceU, V, false); err != nil {
		t.Fatal(err)
	}
	if voice.done != V {
		t.Fatalf("voice kept %d frames, want %d", voice.done, V)
	}
	if got := int64(len(voice.kv[0])) * int64(m.Flow.Steps) * 4; got != int64(V)*c.kvBytes() {
		t.Fatalf("voice keeps %d bytes, kvBytes says %d", got, int64(V)*c.kvBytes())
	}

	st := &chunkState{done: voice.done, kv: cloneAll(voice.kv), xs: cloneAll(voice.xs)}
	early, err := c.run(st, u, P+16, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.done != V {
		t.Fatalf("a segment ending inside its chunk was kept: done %d", st.done)
	}
	d := maxDiff(early, wantAt(V, P+16))
	if d == 0 {
		t.Fatal("the early segment equals the whole run's, so its chunk's later frames are not seen")
	}
	t.Logf("a segment ending 34 frames short of its chunk's end: max |diff| %.3g against the whole run", d)
	for _, end := range []int{250, 350, Fr} {
		from := st.done
		got, err := c.run(st, u, end, end == Fr)
		if err != nil {
			t.Fatal(err)
		}
		d := maxDiff(got, wantAt(from, end))
		if d > 1e-5 {
			t.Fatalf("frames %d..%d: max |diff| %.2e against the whole run", from, end, d)
		}
		t.Logf("frames %d..%d: max |diff| %.2e against the whole run", from, end, d)
	}
	if st.done != Fr {
		t.Fatalf("done %d after the last segment, want %d", st.done, Fr)
	}
}

// A manifest's chunk-step keys are checked at load.
func TestChunkStepManifestChecks(t *testing.T) {
	m := tinyManifest(t)
	m.Flow.ChunkFrames = 50
	if err := m.validate(); err == nil {
		t.Fatal("flow.chunk_frames without flow.chunk_step was taken")
	}
	m.Flow.ChunkStep, m.Flow.ChunkFrames = "missing.onnx", 0
	err := m.validate()
	if err == nil {
		t.Fatal("a chunk step without chunk_frames, kv_layers, kv_width, embedding_dim or its file was taken")
	}
	for _, key := range []string{"flow.chunk_frames", "flow.kv_layers", "flow.kv_width", "flow.chunk_step"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not name %s", err, key)
		}
	}
}
