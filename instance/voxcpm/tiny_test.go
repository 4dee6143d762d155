package voxcpm

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// tinyPath is the tiny export `make tiny-voxcpm` makes (random weights, the real graphs);
// VOXMUX_TINY_VOXCPM names another export.
func tinyPath() string {
	if p := os.Getenv("VOXMUX_TINY_VOXCPM"); p != "" {
		return p
	}
	return "../../models/tiny-voxcpm/pipeline.yaml"
}

// section writes o as a group's engine section, as the config carries it to Open.
func section(t testing.TB, o Options) tts.EngineSection {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tinyEngine opens the tiny export on the CPU with room for slots streams. Without the export
// the test is skipped, or fails when VOXMUX_REQUIRE_TINY_VOXCPM=1.
func tinyEngine(t *testing.T, slots int) *Engine {
	return tinyEngineWith(t, slots, Options{})
}

// tinyEngineWith is tinyEngine with engine options.
func tinyEngineWith(t *testing.T, slots int, opts Options) *Engine {
	t.Helper()
	return tinyEngineAt(t, tinyPath(), slots, opts)
}

// tinyEngineAt is tinyEngineWith for the manifest at path.
func tinyEngineAt(t *testing.T, path string, slots int, opts Options) *Engine {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("VOXMUX_REQUIRE_TINY_VOXCPM") == "1" {
			t.Fatalf("the tiny VoxCPM export is required (make tiny-voxcpm): %v", err)
		}
		t.Skipf("no tiny VoxCPM export (make tiny-voxcpm): %v", err)
	}
	lib, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	r, d, err := Family{}.Open(tts.LoadConfig{Manifest: path, Provider: "cpu", ORTLibrary: lib, MaxInflight: slots, Engine: section(t, opts)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if d.SampleRate != 44100 || d.Kind != Kind {
		t.Fatalf("description %+v", d)
	}
	return r.(*Engine)
}

// closeTo reports how far apart two requests' audio is (infinite for other lengths).
func closeTo(a, b result) float64 { return maxDiff(a.pcm(), b.pcm()) }

// A request gives whole patches of audio, one chunk a patch, as each is decoded; the same seed
// gives the same audio.
func TestTinyRequest(t *testing.T) {
	e := tinyEngine(t, 4)
	m := e.m
	req := tts.Request{Text: "Hello world, this is a test.", Seed: 42}
	var at []time.Time
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var r result
	r.err = e.Synthesize(ctx, req, func(c tts.Chunk) error {
		at = append(at, time.Now())
		if c.Index != len(r.chunks) || c.SampleRate != 44100 {
			t.Errorf("chunk %d at %d Hz arrived as number %d", c.Index, c.SampleRate, len(r.chunks))
		}
		r.chunks = append(r.chunks, c.PCM)
		return nil
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.chunks) == 0 {
		t.Fatal("no audio")
	}
	for i, c := range r.chunks {
		if len(c) != m.patchSamples() {
			t.Fatalf("chunk %d has %d samples, want a patch's %d (patch_size × chunk_size)", i, len(c), m.patchSamples())
		}
		for _, x := range c {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("chunk %d holds %v", i, x)
			}
		}
	}
	if len(r.chunks) > 2 && !at[len(at)-1].After(at[0]) {
		t.Fatal("the chunks arrived at once, not as each patch was decoded")
	}
	again := run(t, e, req)
	if d := closeTo(r, again); d != 0 {
		t.Fatalf("the same seed gave audio %g apart", d)
	}
	if st := e.Stats(); st[stagePrefill].Items != 2 || st[stageStep].Batches == 0 || st[stageVAE].Batches != st[stageStep].Batches {
		t.Fatalf("stats %+v", st)
	}
}

// Requests run at once, joining at different steps, each give the audio they give alone within
// float rounding: the core of batching across slots.
func TestTinyBatchedEqualsAlone(t *testing.T) {
	e := tinyEngine(t, 8)
	reqs := []tts.Request{
		{Text: "Hello world.", Seed: 1},
		{Text: "A somewhat longer sentence for the second request.", Seed: 2},
		{Text: "Short one.", Seed: 3},
		{Text: "The fourth request speaks in another voice.", Seed: 4},
		{Text: "Five.", Seed: 5},
	}
	if len(e.m.voiceNames) > 1 {
		reqs[3].Voice = e.m.voiceNames[1]
	}
	alone := runAlone(t, e, reqs)
	before := e.Stats()[stageStep]
	// Some a little late: streams join at different steps and so sit at different positions.
	got := runTogether(t, e, reqs, func(i int) time.Duration { return time.Duration(i%2) * 3 * time.Millisecond })
	after := e.Stats()[stageStep]
	if items, steps := after.Items-before.Items, after.Batches-before.Batches; items < 2*steps {
		t.Fatalf("%d steps carried %d streams: the requests hardly ran together", steps, items)
	}
	var worst float64
	for i := range reqs {
		if got[i].err != nil {
			t.Fatalf("request %d: %v", i, got[i].err)
		}
		worst = max(worst, closeTo(got[i], alone[i]))
		if len(got[i].chunks) != len(alone[i].chunks) {
			t.Fatalf("request %d: %d patches beside others, %d alone", i, len(got[i].chunks), len(alone[i].chunks))
		}
		if d := closeTo(got[i], alone[i]); d > 1e-4 {
			t.Fatalf("request %d: audio %g from its audio alone", i, d)
		}
	}
	if e.Slots() != 0 {
		t.Fatalf("%d slots held after every request ended", e.Slots())
	}
	t.Logf("%d requests batched: at most %g from alone", len(reqs), worst)
}

// The step run in the fixed shapes of the CUDA graphs' buckets (lm_cuda_graph fixed, which the
// CPU runs without capturing) gives the audio of the plain step, alone and batched.
func TestTinyFixedShapes(t *testing.T) {
	plain := tinyEngine(t, 6)
	fixed := tinyEngineWith(t, 6, Options{LMCUDAGraph: "fixed"})
	if fixed.run.(*graphs).sg == nil || plain.run.(*graphs).sg != nil {
		t.Fatal("lm_cuda_graph fixed does not run the step in fixed shapes")
	}
	reqs := []tts.Request{{Text: "One request.", Seed: 1}, {Text: "And another, a little longer.", Seed: 2},
		{Text: "Third.", Seed: 3}}
	want := runAlone(t, plain, reqs)
	if r := run(t, fixed, reqs[0]); r.err != nil || closeTo(r, want[0]) > 1e-4 {
		t.Fatalf("alone in fixed shapes: %v, %g from the plain step", r.err, closeTo(r, want[0]))
	}
	got := runTogether(t, fixed, reqs, nil)
	for i := range reqs {
		if got[i].err != nil || closeTo(got[i], want[i]) > 1e-4 {
			t.Fatalf("request %d batched in fixed shapes: %v, %g from the plain step alone", i, got[i].err, closeTo(got[i], want[i]))
		}
	}
}

// A cancelled request frees its slot and the next request runs as it would have.
func TestTinyCancel(t *testing.T) {
	e := tinyEngine(t, 2)
	req := tts.Request{Text: "After the cancel.", Seed: 9}
	want := run(t, e, req)
	err := cancelAfter(e, tts.Request{Text: strings.Repeat("A long request that is cancelled. ", 4)}, 2)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}
	waitSlotsFree(t, e, 10*time.Second, "the cancel")
	if got := run(t, e, req); got.err != nil || closeTo(got, want) > 1e-4 {
		t.Fatalf("the request after a cancel: %v, %g from before", got.err, closeTo(got, want))
	}
}

func TestTinyPromptTooLong(t *testing.T) {
	e := tinyEngine(t, 2)
	long := strings.Repeat("word ", e.m.LM.MaxPositions)
	err := run(t, e, tts.Request{Text: long}).err
	var te *tts.Error
	if !errors.As(err, &te) || te.Kind != tts.ErrInvalid || !strings.Contains(err.Error(), "lm.max_positions") {
		t.Fatalf("too long a prompt: %v", err)
	}
}

// An export's voice speaks; the same latents and text as a request's prompt speak the same.
func TestTinyVoices(t *testing.T) {
	e := tinyEngine(t, 2)
	if len(e.m.voiceNames) < 2 {
		t.Skip("the tiny export has no voices")
	}
	name := e.m.voiceNames[1]
	v := e.m.voice(name)
	named := run(t, e, tts.Request{Text: "In the export's voice.", Voice: name, Seed: 5})
	if named.err != nil {
		t.Fatal(named.err)
	}
	plain := run(t, e, tts.Request{Text: "In the export's voice.", Seed: 5})
	if closeTo(named, plain) == 0 {
		t.Fatal("the voice's prompt changed nothing")
	}
	vp := &tts.VoicePrompt{Text: v.text, Latents: v.latents, LatentDim: e.m.FeatDim}
	prompted := run(t, e, tts.Request{Text: "In the export's voice.", Prompt: vp, Seed: 5})
	if prompted.err != nil || closeTo(prompted, named) > 1e-4 {
		t.Fatalf("the voice as a prompt: %v, %g from the named voice", prompted.err, closeTo(prompted, named))
	}
}

// toneClip is secs seconds of a tone with a little noise.
func toneClip(secs float64, rate int) []float32 {
	g := rand.New(rand.NewPCG(3, 4))
	out := make([]float32, int(secs*float64(rate)))
	for i := range out {
		out[i] = float32(0.3*math.Sin(2*math.Pi*220*float64(i)/float64(rate)) + 0.02*g.NormFloat64())
	}
	return out
}

// A 5 s clip gives a whole number of patches covering it (left-padded), which the engine then
// speaks in.
func TestTinyExtractVoice(t *testing.T) {
	e := tinyEngine(t, 2)
	if e.enc == nil {
		t.Skip("the tiny export has no vae_encoder")
	}
	m := e.m
	ctx := context.Background()
	vp, err := e.ExtractVoice(ctx, tts.VoiceClip{PCM: toneClip(5, 24000), SampleRate: 24000, Text: " Said in the clip. "})
	if err != nil {
		t.Fatal(err)
	}
	samples := 5 * m.SampleRate
	patches := (samples + m.patchSamples() - 1) / m.patchSamples()
	if vp.LatentDim != m.FeatDim || len(vp.Latents) != patches*m.patchFloats() || vp.Text != "Said in the clip." {
		t.Fatalf("voice: text %q, %d latents of dim %d, want %d patches (%d values) of dim %d", vp.Text, len(vp.Latents), vp.LatentDim, patches, patches*m.patchFloats(), m.FeatDim)
	}
	if r := run(t, e, tts.Request{Text: "In the cloned voice.", Prompt: &vp}); r.err != nil || len(r.chunks) == 0 {
		t.Fatalf("speaking in the cloned voice: %v", r.err)
	}
	for _, c := range []tts.VoiceClip{
		{PCM: toneClip(1, 24000), SampleRate: 24000, Text: "x"},
		{PCM: toneClip(31, 16000), SampleRate: 16000, Text: "x"},
		{PCM: toneClip(5, 8000), SampleRate: 8000, Text: "x"},
		{PCM: toneClip(5, 24000), SampleRate: 24000, Text: " "},
	} {
		_, err := e.ExtractVoice(ctx, c)
		var te *tts.Error
		if !errors.As(err, &te) || te.Kind != tts.ErrInvalid {
			t.Errorf("clip of %d samples at %d Hz, text %q: %v, want an invalid-request error", len(c.PCM), c.SampleRate, c.Text, err)
		}
	}
}
