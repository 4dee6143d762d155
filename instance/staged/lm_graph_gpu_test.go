package staged

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/voxmux/voxmux/tts"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// On a GPU host (VOXMUX_GPU_MANIFEST: a pipeline exported with lm.cache: shared; ORT_LIB: ONNX
// Runtime with the CUDA provider), the LM's decode steps replayed as CUDA graphs must give the
// logits of the same steps in the same fixed shapes run by ONNX Runtime, and those of steps in
// any shape within float16 rounding. Rows join, step and leave so that steps change buckets.
// Tokens are fixed, not sampled, so every decoder sees the same sequences.
func TestLMGraphsOnGPU(t *testing.T) {
	m := gpuManifest(t)
	rt := cudaRuntime(t)
	place, graphs := rt.LMPlacement(false, true), rt.LMPlacement(true, true)
	run := func(name string, place iobind.Placement, rows int) [][]float32 {
		d, err := newLMDecoder(m, place, rows, rows > 0)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer d.close()
		var out [][]float32
		texts := []string{"Hello there.", "A somewhat longer sentence to speak aloud.", "¿Dónde está la biblioteca?", "短句。"}
		var live []*lmRow
		join := func(ts ...string) {
			var ps [][]int64
			for _, s := range ts {
				ps = append(ps, m.Tokenize(s))
			}
			rs, ls, err := d.join(ps)
			if err != nil {
				t.Fatalf("%s: join: %v", name, err)
			}
			live = append(live, rs...)
			out = append(out, ls...)
		}
		join(texts[0])
		for i := 0; i < 40; i++ {
			switch i {
			case 5:
				join(texts[1], texts[2])
			case 15:
				d.leave(live[1])
				live = append(live[:1], live[2:]...)
				if err := d.compact(); err != nil {
					t.Fatal(err)
				}
			case 20:
				join(texts[3], texts[0], texts[1], texts[2], texts[3])
			}
			toks := make([]int64, len(live))
			for r := range toks {
				toks[r] = m.LM.SpeechTokenOffset + int64((i*7+r*13)%m.LM.SpeechVocab)
			}
			ls, err := d.step(live, toks)
			if err != nil {
				t.Fatalf("%s: step %d: %v", name, i, err)
			}
			for _, l := range ls {
				out = append(out, slices.Clone(l)) // a step's logits hold until the next
			}
		}
		return out
	}
	plain := run("plain", place, 0)
	fixed := run("fixed", place, 16)
	graph := run("graph", graphs, 16)
	compare := func(what string, a, b [][]float32) (worst, scale float64, argmaxSame int) {
		for i := range a {
			ba, bb := 0, 0
			for j := range a[i] {
				worst = max(worst, math.Abs(float64(a[i][j]-b[i][j])))
				scale = max(scale, math.Abs(float64(a[i][j])))
				if a[i][j] > a[i][ba] {
					ba = j
				}
				if b[i][j] > b[i][bb] {
					bb = j
				}
			}
			if ba == bb {
				argmaxSame++
			}
		}
		t.Logf("%s: %d logit rows, largest difference %.4g (largest logit %.4g), same argmax in %d", what, len(a), worst, scale, argmaxSame)
		return
	}
	if w, s, _ := compare("graph against fixed shapes", graph, fixed); w > 1e-3*s {
		t.Errorf("replayed graphs differ from the same steps run by ONNX Runtime by %g", w)
	}
	if w, s, _ := compare("graph against any shape", graph, plain); w > 0.05*s {
		t.Errorf("replayed graphs differ from steps in any shape by %g, more than float16 rounding", w)
	}
	compare("fixed shapes against any shape", fixed, plain)
}

// cudaRuntime is the CUDA provider's runtime for a GPU test, closed when the test ends.
func cudaRuntime(t testing.TB) *ort.Runtime {
	t.Helper()
	rt, err := ort.New(tts.LoadConfig{Provider: "cuda", ORTLibrary: ortLibrary(t)}, 0, ort.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

// gpuManifest loads the export VOXMUX_GPU_MANIFEST names and readies iobind; without it the test
// is skipped.
func gpuManifest(t testing.TB) *Manifest {
	t.Helper()
	path := os.Getenv("VOXMUX_GPU_MANIFEST")
	if path == "" {
		t.Skip("VOXMUX_GPU_MANIFEST not set: this test needs a tts.GPU and an exported model")
	}
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := iobind.Init(ortLibrary(t)); err != nil {
		t.Fatal(err)
	}
	return m
}

// BenchmarkLMStepOnGPU times the LM's decode step as a CUDA graph, whole and in parts, at 64 and
// 128 rows with caches of about 115 positions (VOXMUX_GPU_MANIFEST and ORT_LIB as for
// TestLMGraphsOnGPU): the step as the engine runs it, the graph's replay alone, the upload of its
// inputs and the download of its logits. Run with -test.benchtime=100x: every step moves the rows
// one position on.
func BenchmarkLMStepOnGPU(b *testing.B) {
	m := gpuManifest(b)
	rt := cudaRuntime(b)
	for _, rows := range []int{64, 128} {
		d, err := newSharedDecoder(m, rt.LMPlacement(true, true), rows, false)
		if err != nil {
			b.Fatal(err)
		}
		var live []*lmRow
		for len(live) < rows {
			prompts := make([][]int64, min(d.prefillRows(), rows-len(live)))
			for i := range prompts {
				prompts[i] = m.Tokenize("A sentence of about twenty tokens, to start the rows.")
			}
			rs, _, err := d.join(prompts)
			if err != nil {
				b.Fatal(err)
			}
			live = append(live, rs...)
		}
		toks := make([]int64, rows)
		for i := range toks {
			toks[i] = m.LM.SpeechTokenOffset + int64(i%m.LM.SpeechVocab)
		}
		for live[0].pos < 115 {
			if _, err := d.step(live, toks); err != nil {
				b.Fatal(err)
			}
		}
		gr := d.g.steps[0]
		for _, s := range d.g.steps {
			if gr = s; s.B >= rows {
				break
			}
		}
		phases := lmStepPhases(d, gr, live, toks)
		for _, name := range []string{"step", "replay", "upload", "download"} {
			b.Run(fmt.Sprintf("rows=%d/%s", rows, name), func(b *testing.B) {
				for range b.N {
					if err := phases[name](); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		d.close()
	}
}

// lmStepPhases are the parts of a decode step in graph gr that BenchmarkLMStepOnGPU times.
func lmStepPhases(d *sharedDecoder, gr *lmGraph, live []*lmRow, toks []int64) map[string]func() error {
	ids := make([]int64, gr.B)
	seqlens := make([]int32, gr.B)
	return map[string]func() error{
		"step": func() error {
			_, err := d.step(live, toks)
			return err
		},
		"replay": func() error { return d.replay(gr) },
		"upload": func() error {
			copy(gr.hostIDs.Int64s(), ids)
			copy(gr.hostSL.Int32s(), seqlens)
			if err := d.s.Send(gr.ids, gr.hostIDs); err != nil {
				return err
			}
			if err := d.s.Send(gr.seqlens, gr.hostSL); err != nil {
				return err
			}
			return d.s.Wait()
		},
		"download": func() error {
			if err := d.s.Receive(gr.hostLogits, gr.logits); err != nil {
				return err
			}
			return d.s.Wait()
		},
	}
}
