package staged

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// On a GPU host (VOXMUX_GPU_MANIFEST: an export with a flow step graph; ORT_LIB: ONNX Runtime with
// the CUDA provider), the flow's steps replayed as CUDA graphs must give the mel of the same
// steps in the same bucket shapes run by ONNX Runtime, and that of the estimator with the host's
// update within float16 rounding. One batch of chunks of the lengths a stream has, and one alone.
func TestFlowGraphsOnGPU(t *testing.T) {
	m := gpuManifest(t)
	if m.Flow.Step == "" || m.Flow.Estimator == "" {
		t.Fatalf("%s: needs flow.step and flow.estimator", m.File)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var batch []flowJob
	for _, n := range []int{8, 33, 65, 115} {
		j := flowJob{tokens: make([]int64, n), noise: make([]float32, m.Flow.MelBins*n*m.Flow.FramesPerToken)}
		for i := range j.tokens {
			j.tokens[i] = rng.Int64N(int64(m.LM.SpeechVocab))
		}
		for i := range j.noise {
			j.noise[i] = float32(rng.NormFloat64())
		}
		batch = append(batch, j)
	}
	run := func(name, mode string, step bool) [][][]float32 {
		mm := *m
		if !step {
			mm.Flow.Step = ""
		}
		rt, err := ort.New(tts.LoadConfig{Provider: "cuda", ORTLibrary: ortLibrary(t)}, 0, ort.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		t0 := time.Now()
		f, err := newFlow(rt, &mm, resolveOptions(Options{FlowCUDAGraph: FlowGraph(mode)}, true, &mm), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer f.close()
		load := time.Since(t0)
		var out [][][]float32
		for _, jobs := range [][]flowJob{batch, batch[3:]} {
			mels, err := f.run(jobs, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			out = append(out, mels)
		}
		// Time a few runs of each shape once warm.
		for _, jobs := range [][]flowJob{batch[:1], batch[3:], batch} {
			t0 := time.Now()
			for range 5 {
				if _, err := f.run(jobs, nil); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: %d items of up to %d tokens: %.1f ms per run", name, len(jobs), len(jobs[len(jobs)-1].tokens), float64(time.Since(t0).Microseconds())/5000)
		}
		t.Logf("%s: loaded in %v", name, load.Round(time.Millisecond))
		return out
	}
	graphs := run("step graph, CUDA graphs", "on", true)
	fixed := run("step graph, bucket shapes", "fixed", true)
	est := run("estimator, host update", "off", false)
	relRMS := func(a, b []float32) float64 {
		var d, s float64
		for i := range a {
			d += float64(a[i]-b[i]) * float64(a[i]-b[i])
			s += float64(b[i]) * float64(b[i])
		}
		return math.Sqrt(d / max(s, 1e-30))
	}
	var worstFixed, worstEst float64
	for r := range graphs {
		for i := range graphs[r] {
			worstFixed = max(worstFixed, relRMS(graphs[r][i], fixed[r][i]))
			worstEst = max(worstEst, relRMS(graphs[r][i], est[r][i]))
		}
	}
	t.Logf("relative rms difference of the mel: graphs against bucket shapes %.3g, against the estimator %.3g", worstFixed, worstEst)
	if worstFixed > 1e-3 {
		t.Errorf("CUDA graphs differ from the same shapes without them by %.3g", worstFixed)
	}
	if worstEst > 2e-2 {
		t.Errorf("the step graph differs from the estimator with the host's update by %.3g", worstEst)
	}
}
