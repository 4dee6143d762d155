package voxcpm

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
	"github.com/voxmux/voxmux/tts"
)

// relRMS is how far b is from a: the rms of the difference over the rms of a.
func relRMS(a, b []float32) float64 {
	var d2, a2 float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		d2 += d * d
		a2 += float64(a[i]) * float64(a[i])
	}
	return math.Sqrt(d2 / max(a2, 1e-30))
}

// Bounds of the float16 VAE decoder on the CPU against float32's, relative rms over a patch's
// audio and over the carried state. Measured on the tiny export, latents of unit variance
// (TestTinyVAEFloat16 with 48 patches of 3 rows): a patch's audio 1.0e-3 from zero states, rising
// to 1.5-2.1e-3 within five patches and flat after; the state 3.5e-4, then 4.8-7.1e-4: the
// carried state enters each patch rounded to float16 (relative rounding at most 2⁻¹¹ = 4.9e-4),
// and its error does not compound. A whole request through the engine: 2.5e-3. The bounds leave
// 2.5× (audio) and 4× (state) for other weights; vaeFloat16RequestRMS twice the patch bound.
const (
	vaeFloat16AudioRMS   = 5e-3
	vaeFloat16StateRMS   = 3e-3
	vaeFloat16RequestRMS = 1e-2
)

// The VAE decoder converted to float16 decodes the same latents as the float32 decoder, patch by
// patch with its carried state, on the CPU provider (which runs the float16 graph, casting to
// float32 where it has no float16 kernel), within the bounds above; the state stays close
// patch after patch. In the buckets' fixed shapes and in plain runs.
func TestTinyVAEFloat16(t *testing.T) {
	m, rt := tinyRuntime(t)
	const rows, n, patches = 4, 3, 12
	for _, plain := range []bool{false, true} {
		v := openVAEPair(t, m, rt, rows, graphModes{plainVAE: plain})
		audio, state := compareVAEFloat16(t, v, n, patches, vaeFloat16AudioRMS, vaeFloat16StateRMS)
		t.Logf("float16 VAE decoder, cpu, plain %v: %d patches of %d rows, worst rel rms: audio %.3g, state %.3g", plain, patches, n, audio, state)
	}
}

// openVAEPair opens the VAE decoder as modes says in float32 ([0]) and float16 ([1]).
func openVAEPair(t *testing.T, m *Manifest, rt *ort.Runtime, rows int, modes graphModes) [2]*vaeGraphs {
	t.Helper()
	var v [2]*vaeGraphs
	for i := range v {
		modes.float16VAE = i == 1
		var err error
		if v[i], err = openVAE(m, rt, rows, engine.Buckets(rows), modes); err != nil {
			t.Fatalf("float16 %v: %v", modes.float16VAE, err)
		}
		t.Cleanup(v[i].close)
	}
	return v
}

// compareVAEFloat16 decodes patches of random latents of unit variance over slots [0, n) with
// both decoders of v, their states carried, and returns the worst relative rms of the float16
// decoder's audio and state from the float32 one's; a patch over audioMax or stateMax is an
// error, as is audio that is not finite.
func compareVAEFloat16(t *testing.T, v [2]*vaeGraphs, n, patches int, audioMax, stateMax float64) (audio, state float64) {
	t.Helper()
	m := v[0].m
	g := rand.New(rand.NewPCG(3, 4))
	patch := make([]float32, n*m.patchFloats())
	states := func(v *vaeGraphs) []float32 {
		s := make([]float32, v.rows*m.VAE.StateSize)
		if err := iobind.Download(s, v.states[v.cur]); err != nil {
			t.Fatal(err)
		}
		return s[:n*m.VAE.StateSize]
	}
	for p := range patches {
		for i := range patch {
			patch[i] = float32(g.NormFloat64())
		}
		var out [2][]float32
		for i := range v {
			a, err := v[i].decode(n, patch)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = append([]float32(nil), a...)
		}
		for _, x := range out[1] {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("patch %d: float16 audio not finite", p)
			}
		}
		ra, rs := relRMS(out[0], out[1]), relRMS(states(v[0]), states(v[1]))
		audio, state = max(audio, ra), max(state, rs)
		if ra > audioMax || rs > stateMax {
			t.Errorf("patch %d of %d rows: float16 audio rel rms %.3g, state %.3g from float32's, over %g, %g", p, n, ra, rs, audioMax, stateMax)
		}
	}
	if audio == 0 {
		t.Error("the float16 decoder's audio equals the float32 one's: float16 not in force")
	}
	return audio, state
}

// A request through the engine with vocoder_precision float16, on the CPU, gives finite audio as
// long as float32's, and close to it.
func TestTinyVocoderFloat16Request(t *testing.T) {
	req := tts.Request{Text: "A request decoded in float16.", Seed: 7}
	var pcm [2][]float32
	for i, o := range []Options{{}, {VocoderPrecision: engine.Float16}} {
		res := run(t, tinyEngineWith(t, 2, o), req)
		if res.err != nil {
			t.Fatal(res.err)
		}
		pcm[i] = res.pcm()
	}
	if len(pcm[0]) == 0 || len(pcm[1]) != len(pcm[0]) {
		t.Fatalf("float32 gave %d samples, float16 %d", len(pcm[0]), len(pcm[1]))
	}
	for _, x := range pcm[1] {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatal("float16 audio not finite")
		}
	}
	r := relRMS(pcm[0], pcm[1])
	t.Logf("float16 VAE decoder through the engine: %d samples, rel rms %.3g from float32's", len(pcm[1]), r)
	if r == 0 || r > vaeFloat16RequestRMS {
		t.Errorf("float16 audio rel rms %.3g from float32's: not in (0, %g]", r, vaeFloat16RequestRMS)
	}
}

// A VAE decoder with an op the float16 conversion does not take is refused, naming it.
func TestVAEFloat16RefusesOp(t *testing.T) {
	m, _ := tinyRuntime(t)
	_, err := vaeFloat16(m.Path(m.Graphs.Step))
	if err == nil || !strings.Contains(err.Error(), "vocoder_precision float16") || !strings.Contains(err.Error(), "node, which its float16 conversion does not take") {
		t.Errorf("the step graph as a VAE decoder: %v", err)
	}
}
