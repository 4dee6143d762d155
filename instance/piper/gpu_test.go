package piper

import (
	"cmp"
	"os"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// jennyVoice is the published voice the GPU test reads without fetching (a GPU host has no
// network): VOXMUX_PIPER_JENNY or models/voices.
var jennyVoice = cmp.Or(os.Getenv("VOXMUX_PIPER_JENNY"), "../../models/voices/en_GB-jenny_dioco-medium.onnx")

// gpuRunner opens voice path on provider with options o, noise off, and returns its session.
func gpuRunner(t *testing.T, path, provider string, o Options) *piperSession {
	t.Helper()
	r, _, err := openPiper(tts.LoadConfig{Manifest: path, Provider: provider, ORTLibrary: ortLibrary(t), Engine: section(t, o)})
	if err != nil {
		t.Fatalf("%s on %s: %v", path, provider, err)
	}
	t.Cleanup(func() { r.Close() })
	for _, f := range r.m.Files {
		f.scales = [3]float32{0, 1, 0} // deterministic: no noise
	}
	s, release, err := r.cache.acquire(r.m.Files[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return s
}

// On a GPU host (VOXMUX_GPU_PIPER=1; ORT_LIB: ONNX Runtime with the CUDA provider), Piper on the
// CUDA provider gives the CPU provider's audio within chunkTolerance for the jenny voice and the
// tiny VITS voices: decoded in chunks (front, then the decoder over windows with the receptive
// field as context) and run whole, at speeds 1, 2 and 0.5; and rows at different speeds batched
// in one front run give each row's audio alone, within TestPiperSpeedsShareABatch's bounds.
// VOXMUX_GPU_PROVIDER=cpu runs the test's own logic without a GPU.
func TestPiperOnGPU(t *testing.T) {
	if os.Getenv("VOXMUX_GPU_PIPER") == "" {
		t.Skip("VOXMUX_GPU_PIPER not set: this test needs a GPU")
	}
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	ph := testPhonemizer(t)
	speeds := []float32{1, 2, 0.5}
	for _, c := range []struct {
		path string
		sid  int64
	}{{jennyVoice, 0}, {tinyVITSEN, 0}, {tinyVITSMulti, 1}} {
		if _, err := os.Stat(c.path); err != nil {
			t.Fatal(err)
		}
		gc, cc := gpuRunner(t, c.path, provider, Options{}), gpuRunner(t, c.path, "cpu", Options{})
		gw, cw := gpuRunner(t, c.path, provider, Options{Decode: DecodeSentences}), gpuRunner(t, c.path, "cpu", Options{Decode: DecodeSentences})
		if gc.chunks == nil || cc.chunks == nil {
			t.Fatalf("%s: not decoded in chunks", c.path)
		}
		f := gc.file
		sents, err := f.sentences(ph, "The weather is nice today, so we will walk to the park. What? No!")
		if err != nil {
			t.Fatal(err)
		}
		var worstChunks, worstWhole float64
		for _, sent := range sents {
			for _, sp := range speeds {
				// Chunked: each provider's front, then its decoder in the runner's chunk sizes.
				var chunked [2][]float32
				for i, s := range []*piperSession{gc, cc} {
					ls, err := s.chunks.runFront(s.file, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s, 1, sp), s.file.scales)
					if err != nil {
						t.Fatal(err)
					}
					chunked[i] = decodeChunks(t, s.chunks, s.file, &ls[0], c.sid, s.chunks.split.left, s.chunks.split.right)
				}
				// Whole: the voice's graph in one run.
				var whole [2][]float32
				for i, s := range []*piperSession{gw, cw} {
					out, err := runPiperBatch(s.sess, s.file, s.lengths, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s, 1, sp), s.file.scales)
					if err != nil {
						t.Fatal(err)
					}
					whole[i] = out[0]
				}
				for _, p := range []struct {
					what  string
					a, b  []float32
					worst *float64
				}{{"chunked", chunked[0], chunked[1], &worstChunks}, {"whole", whole[0], whole[1], &worstWhole}} {
					if len(p.a) != len(p.b) {
						t.Errorf("%s, %s at speed %g: %d samples on %s, %d on the CPU", f.Stem, p.what, sp, len(p.a), provider, len(p.b))
						continue
					}
					d := piperMaxDiff(p.a, p.b)
					*p.worst = max(*p.worst, d)
					if d > chunkTolerance {
						t.Errorf("%s, %s at speed %g: %s differs from the CPU by %g", f.Stem, p.what, sp, provider, d)
					}
				}
			}
		}
		t.Logf("%s on %s against the CPU: chunked within %.2g, whole within %.2g (speeds %v)", f.Stem, provider, worstChunks, worstWhole, speeds)

		// Rows at different speeds in one front run against each alone, on the provider.
		bs := []float32{1, 2, 0.5, 4}
		rows, sids := make([][]int64, len(bs)), make([]int64, len(bs))
		for i := range rows {
			rows[i], sids[i] = sents[0].IDs, c.sid
		}
		run := func(rows [][]int64, sids []int64, speeds []float32) [][]float32 {
			ls, err := gc.chunks.runFront(f, rows, sids, speeds, f.scales)
			if err != nil {
				t.Fatal(err)
			}
			out := make([][]float32, len(ls))
			for i := range ls {
				pcm, err := gc.chunks.decode(f, []window{{l: &ls[i], sid: c.sid, hi: ls[i].frames, to: ls[i].frames}})
				if err != nil {
					t.Fatal(err)
				}
				out[i] = pcm[0]
			}
			return out
		}
		if !gc.speed {
			bs = bs[:1] // a graph without the speed input: the batch's one speed
		}
		speedsOf := func(n int, v []float32) []float32 {
			if !gc.speed {
				return nil
			}
			return v[:n]
		}
		batched := run(rows[:len(bs)], sids[:len(bs)], speedsOf(len(bs), bs))
		for i, sp := range bs {
			alone := run(rows[i:i+1], sids[i:i+1], speedsOf(1, bs[i:]))
			if len(batched[i]) != len(alone[0]) {
				t.Errorf("%s, speed %g: %d samples batched, %d alone", f.Stem, sp, len(batched[i]), len(alone[0]))
				continue
			}
			d, inner := piperDiffs(batched[i], alone[0])
			t.Logf("%s on %s, speed %g: %d samples, batched against alone %.6f, %.6f away from the edges", f.Stem, provider, sp, len(alone[0]), d, inner)
			if inner > batchInnerTolerance || d > batchTolerance {
				t.Errorf("%s, speed %g: batched differs from alone by %.6f (%.6f away from the edges)", f.Stem, sp, d, inner)
			}
		}
	}
}
