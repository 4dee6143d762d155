package instance

import (
	"math"
	"os"
	"slices"
	"testing"

	"github.com/voxmux/voxmux/instance/iobind"
)

// On a GPU host (VOXMUX_GPU_MANIFEST: a pipeline exported with lm.cache: shared; ORT_LIB: ONNX
// Runtime with the CUDA provider), the LM's decode steps replayed as CUDA graphs must give the
// logits of the same steps in the same fixed shapes run by ONNX Runtime, and those of steps in
// any shape within float16 rounding. Rows join, step and leave so that steps change buckets.
// Tokens are fixed, not sampled, so every decoder sees the same sequences.
func TestLMGraphsOnGPU(t *testing.T) {
	m := gpuManifest(t)
	rt, err := newRuntime(LoadConfig{Provider: "cuda", ORTLibrary: ortLibrary(t)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.close()
	place, graphs := rt.lmPlacement(false), rt.lmPlacement(true)
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

// gpuManifest loads the export VOXMUX_GPU_MANIFEST names and readies iobind; without it the test
// is skipped.
func gpuManifest(t *testing.T) *Manifest {
	t.Helper()
	path := os.Getenv("VOXMUX_GPU_MANIFEST")
	if path == "" {
		t.Skip("VOXMUX_GPU_MANIFEST not set: this test needs a GPU and an exported model")
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
