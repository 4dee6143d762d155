package voxcpm

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
	"github.com/voxmux/voxmux/tts"
)

// tinyRuntime loads the tiny export's manifest and a CPU runtime, skipping (or failing, with
// VOXMUX_REQUIRE_TINY_VOXCPM=1) without the export.
func tinyRuntime(t *testing.T) (*Manifest, *ort.Runtime) {
	t.Helper()
	path := tinyPath()
	if _, err := os.Stat(path); err != nil {
		tinyEngine(t, 1) // skips or fails as the other tests do
	}
	return runtimeFor(t, path, "cpu")
}

// runtimeFor loads the manifest at path and a runtime on provider, with iobind bound to it.
func runtimeFor(t *testing.T, path, provider string) (*Manifest, *ort.Runtime) {
	t.Helper()
	return runtimeWith(t, path, tts.LoadConfig{Provider: provider}, ort.Options{})
}

// runtimeWith is runtimeFor with cfg's provider and provider options and the runtime options o;
// cfg's ORT library is the one ort.FindLibrary finds.
func runtimeWith(t *testing.T, path string, cfg tts.LoadConfig, o ort.Options) (*Manifest, *ort.Runtime) {
	t.Helper()
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	lib, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	cfg.ORTLibrary = lib
	rt, err := ort.New(cfg, 0, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	if err := iobind.Init(lib); err != nil {
		t.Fatal(err)
	}
	return m, rt
}

// countingRunner counts what the scheduler asks of the graphs.
type countingRunner struct {
	runner
	moves, decodes atomic.Int64
	// rows is the most rows of one decode.
	rows atomic.Int64
}

func (c *countingRunner) move(moves []slotMove) error {
	c.moves.Add(int64(len(moves)))
	return c.runner.move(moves)
}

func (c *countingRunner) decode(n int, patch []float32) ([]float32, error) {
	c.decodes.Add(1)
	for {
		r := c.rows.Load()
		if int64(n) <= r || c.rows.CompareAndSwap(r, int64(n)) {
			break
		}
	}
	return c.runner.decode(n, patch)
}

// tinyCountingEngine is tinyEngineWith over a countingRunner, the VAE's work beside the steps
// (overlap) or in line.
func tinyCountingEngine(t *testing.T, slots int, opts Options, overlap bool) (*Engine, *countingRunner) {
	t.Helper()
	m, rt := tinyRuntime(t)
	tok, err := loadTokenizer(m)
	if err != nil {
		t.Fatal(err)
	}
	g, err := openGraphs(m, rt, slots, resolveModes(opts, false, slots))
	if err != nil {
		t.Fatal(err)
	}
	c := &countingRunner{runner: g}
	e := startEngine(m, tok, c, slots, overlap)
	t.Cleanup(func() { e.Close() })
	return e, c
}

// The VAE decoder in the buckets' fixed shapes, in one session and in a session per bucket
// (vocoder_sessions per_batch), gives the audio of decodes of exactly n rows, as the number of
// rows changes (and with it the bucket), streams move between slots and states are primed with a
// voice's context or zeroed.
func TestTinyVAEBucketsEqualPlain(t *testing.T) {
	for _, c := range []struct {
		name  string
		modes graphModes
	}{{"shared", graphModes{}}, {"per_batch", graphModes{perBatchVAE: true}}} {
		t.Run(c.name, func(t *testing.T) { testVAEBucketsEqualPlain(t, c.modes) })
	}
}

func testVAEBucketsEqualPlain(t *testing.T, modes graphModes) {
	m, rt := tinyRuntime(t)
	const rows = 8
	buckets := engine.Buckets(6)
	fixed, err := openVAE(m, rt, rows, buckets, modes)
	if err != nil {
		t.Fatal(err)
	}
	defer fixed.close()
	plain, err := openVAE(m, rt, rows, buckets, graphModes{plainVAE: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.close()
	if len(fixed.buckets) != len(buckets) || plain.buckets != nil {
		t.Fatalf("%d fixed shapes (want %d), plain has %d", len(fixed.buckets), len(buckets), len(plain.buckets))
	}
	// Per batch, the one-row bucket shares the decoder's session (priming runs in its shape) and
	// every other bucket has its own.
	for i, b := range fixed.buckets {
		if own := modes.perBatchVAE && i > 0; b.own != own || (b.s == fixed.s) == own {
			t.Fatalf("bucket of %d rows: own session %v (is the decoder's: %v), want own %v", b.B, b.own, b.s == fixed.s, own)
		}
	}
	g := rand.New(rand.NewPCG(1, 2))
	PD, S := m.patchFloats(), m.patchSamples()
	context := make([]float32, 2*PD)
	for i := range context {
		context[i] = float32(g.NormFloat64())
	}
	both := func(f func(v *vaeGraphs) error) {
		t.Helper()
		for _, v := range []*vaeGraphs{fixed, plain} {
			if err := f(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	// n rows per step; before a step, the slots in prime are joined (a voice's context in even
	// ones) and the moves made.
	steps := []struct {
		n     int
		prime []int
		moves []slotMove
	}{
		{n: 1, prime: []int{0}},
		{n: 3, prime: []int{1, 2}},
		{n: 3},
		{n: 5, prime: []int{3, 4}},
		{n: 4, moves: []slotMove{{From: 4, To: 1}}},
		{n: 2, moves: []slotMove{{From: 3, To: 0}}},
		{n: 6, prime: []int{2, 3, 4, 5}},
		{n: 1},
	}
	var worst float64
	for i, st := range steps {
		for _, s := range st.prime {
			c := context
			if s%2 == 1 {
				c = nil
			}
			both(func(v *vaeGraphs) error { return v.prime(s, c) })
		}
		both(func(v *vaeGraphs) error { return v.move(st.moves) })
		patch := make([]float32, st.n*PD)
		for j := range patch {
			patch[j] = float32(g.NormFloat64())
		}
		a, err := fixed.decode(st.n, patch)
		if err != nil {
			t.Fatal(err)
		}
		a = append([]float32(nil), a...)
		b, err := plain.decode(st.n, patch)
		if err != nil {
			t.Fatal(err)
		}
		if len(a) != st.n*S || len(b) != st.n*S {
			t.Fatalf("step %d: %d and %d samples for %d rows", i, len(a), len(b), st.n)
		}
		d := maxDiff(a, b)
		worst = max(worst, d)
		if d > 1e-5 {
			t.Fatalf("step %d (%d rows): fixed shapes %g from plain", i, st.n, d)
		}
	}
	if _, err := fixed.decode(rows+1, make([]float32, (rows+1)*PD)); err == nil {
		t.Fatal("a decode of more rows than the largest bucket ran")
	}
	t.Logf("fixed shapes at most %g from plain", worst)
}

// The engine with the VAE in fixed shapes, with the plain step and with the step's fixed shapes
// (lm_cuda_graph fixed), the latter also with a VAE session per bucket, gives each request the audio of the plain VAE and step, alone and
// batched with streams joining and leaving (compaction moving them down).
func TestTinyVAEFixedShapes(t *testing.T) {
	plain := tinyEngineWith(t, 6, Options{VocoderBatches: []int{}})
	if plain.run.(*graphs).v.buckets != nil {
		t.Fatal("vocoder_batches [] does not run the VAE in its own shapes")
	}
	reqs := []tts.Request{{Text: "One request.", Seed: 1}, {Text: "And another, longer.", Seed: 2},
		{Text: "Third.", Seed: 3}, {Text: "The fourth, the longest of all.", Seed: 4}, {Text: "Five.", Seed: 5}}
	if len(plain.m.voiceNames) > 1 {
		reqs[2].Voice = plain.m.voiceNames[1]
	}
	want := make([]result, len(reqs))
	for i, req := range reqs {
		if want[i] = run(t, plain, req); want[i].err != nil {
			t.Fatal(want[i].err)
		}
	}
	for _, o := range []Options{{LMCUDAGraph: StepGraphOff}, {LMCUDAGraph: StepGraphFixed},
		{LMCUDAGraph: StepGraphFixed, VocoderSessions: VAESessionsPerBatch}} {
		mode := string(o.LMCUDAGraph)
		if o.VocoderSessions != "" {
			mode += ", vocoder_sessions " + string(o.VocoderSessions)
		}
		e, c := tinyCountingEngine(t, 6, o, true)
		if g := c.runner.(*graphs); len(g.v.buckets) != len(engine.Buckets(6)) {
			t.Fatalf("lm_cuda_graph %s: %d VAE shapes, want the step's %d", mode, len(g.v.buckets), len(engine.Buckets(6)))
		}
		if r := run(t, e, reqs[1]); r.err != nil || closeTo(r, want[1]) > 1e-4 {
			t.Fatalf("lm_cuda_graph %s, alone: %v, %g from the plain VAE", mode, r.err, closeTo(r, want[1]))
		}
		got := runTogether(t, e, reqs, func(i int) time.Duration { return time.Duration(i%3) * 20 * time.Millisecond })
		var worst float64
		for i := range reqs {
			if got[i].err != nil || len(got[i].chunks) != len(want[i].chunks) || closeTo(got[i], want[i]) > 1e-4 {
				t.Fatalf("lm_cuda_graph %s, request %d batched: %v, %d patches (plain alone %d), %g from the plain VAE alone",
					mode, i, got[i].err, len(got[i].chunks), len(want[i].chunks), closeTo(got[i], want[i]))
			}
			worst = max(worst, closeTo(got[i], want[i]))
		}
		if c.rows.Load() < 2 || c.moves.Load() == 0 {
			t.Fatalf("lm_cuda_graph %s: decodes of at most %d rows, %d moves: the test does not cover batches and compaction",
				mode, c.rows.Load(), c.moves.Load())
		}
		t.Logf("lm_cuda_graph %s: %d decodes of up to %d rows, %d moves, at most %g from the plain VAE alone",
			mode, c.decodes.Load(), c.rows.Load(), c.moves.Load(), worst)
	}
}

// engine.vocoder_batches takes only [] for voxcpm.
func TestTinyVocoderBatchesOption(t *testing.T) {
	path := tinyPath()
	if _, err := os.Stat(path); err != nil {
		tinyEngine(t, 1)
	}
	lib, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Family{}.Open(tts.LoadConfig{Manifest: path, Provider: "cpu", ORTLibrary: lib,
		Engine: section(t, Options{VocoderBatches: []int{1, 4}})})
	if err == nil {
		t.Fatal("vocoder_batches [1, 4] was accepted")
	}
	_, _, err = Family{}.Open(tts.LoadConfig{Manifest: path, Provider: "cpu", ORTLibrary: lib,
		Engine: section(t, Options{VocoderBatches: []int{}, VocoderCUDAGraph: "on"})})
	if err == nil || !strings.Contains(err.Error(), "engine.vocoder_cuda_graph") {
		t.Fatalf("vocoder_cuda_graph on with vocoder_batches []: %v, want a refusal naming the option", err)
	}
}

// What lm_cuda_graph, vocoder_batches, vocoder_cuda_graph, vocoder_sessions and vocoder_precision
// make of the step and the decoder, by provider and slots (0: 16).
func TestResolveModes(t *testing.T) {
	for _, c := range []struct {
		o     Options
		cuda  bool
		slots int
		want  graphModes
	}{
		{Options{}, true, 0, graphModes{step: StepGraphOn, perBatchVAE: true}},
		{Options{}, false, 0, graphModes{step: StepGraphOff}},
		{Options{}, true, 128, graphModes{step: StepGraphOn, perBatchVAE: true}},
		{Options{}, true, 129, graphModes{step: StepGraphOn}},
		{Options{VocoderSessions: VAESessionsPerBatch}, true, 256, graphModes{step: StepGraphOn, perBatchVAE: true}},
		{Options{LMCUDAGraph: "off"}, true, 0, graphModes{step: StepGraphOff, perBatchVAE: true}},
		{Options{LMCUDAGraph: "on"}, true, 0, graphModes{step: StepGraphOn, perBatchVAE: true}},
		{Options{LMCUDAGraph: "on", VocoderCUDAGraph: "on"}, true, 0, graphModes{step: StepGraphOn, captureVAE: true}},
		{Options{LMCUDAGraph: "on", VocoderCUDAGraph: "off"}, true, 0, graphModes{step: StepGraphOn, perBatchVAE: true}},
		{Options{VocoderCUDAGraph: "on"}, true, 0, graphModes{step: StepGraphOn, captureVAE: true}},
		{Options{LMCUDAGraph: "off", VocoderCUDAGraph: "on"}, true, 0, graphModes{step: StepGraphOff, captureVAE: true}},
		{Options{LMCUDAGraph: "fixed", VocoderCUDAGraph: "on"}, true, 0, graphModes{step: StepGraphFixed, captureVAE: true}},
		{Options{LMCUDAGraph: "on", VocoderBatches: []int{}}, true, 0, graphModes{step: StepGraphOn, plainVAE: true}},
		{Options{LMCUDAGraph: "on", VocoderCUDAGraph: "on"}, false, 0, graphModes{step: StepGraphFixed}},
		{Options{VocoderPrecision: engine.Float16}, true, 0, graphModes{step: StepGraphOn, float16VAE: true, perBatchVAE: true}},
		{Options{VocoderPrecision: engine.Float32}, false, 0, graphModes{step: StepGraphOff}},
		{Options{VocoderSessions: VAESessionsPerBatch}, true, 0, graphModes{step: StepGraphOn, perBatchVAE: true}},
		{Options{VocoderSessions: VAESessionsPerBatch}, false, 0, graphModes{step: StepGraphOff, perBatchVAE: true}},
		{Options{VocoderSessions: VAESessionsShared}, true, 0, graphModes{step: StepGraphOn}},
	} {
		if got := resolveModes(c.o, c.cuda, cmp.Or(c.slots, 16)); got != c.want {
			t.Errorf("%+v (cuda %v): %+v, want %+v", c.o, c.cuda, got, c.want)
		}
	}
}

// On the tiny export, each patch's VAE decode beside the next step gives the audio of decodes in
// line, batched with streams joining, leaving and moving down, one in a voice.
func TestTinyOverlapEqualsInLine(t *testing.T) {
	reqs := []tts.Request{{Text: "One request.", Seed: 1}, {Text: "And another, longer.", Seed: 2},
		{Text: "Third.", Seed: 3}, {Text: "The fourth, the longest of all.", Seed: 4}, {Text: "Five.", Seed: 5},
		{Text: "Six, in a voice.", Seed: 6}}
	batched := func(e *Engine) []result {
		if len(e.m.voiceNames) > 1 {
			reqs[5].Voice = e.m.voiceNames[1]
		}
		return runTogether(t, e, reqs, func(i int) time.Duration { return time.Duration(i%3) * 20 * time.Millisecond })
	}
	inLine, _ := tinyCountingEngine(t, 4, Options{}, false)
	want := batched(inLine)
	// Whether a stream moves depends on when requests arrive and finish, which a loaded machine
	// shifts; every attempt must equal in line, and some attempt must have moved a stream.
	var worst float64
	var moves int64
	for attempt := 0; attempt < 3 && moves == 0; attempt++ {
		e, c := tinyCountingEngine(t, 4, Options{LMCUDAGraph: "fixed"}, true)
		got := batched(e)
		for i := range reqs {
			if want[i].err != nil || got[i].err != nil || len(got[i].chunks) != len(want[i].chunks) || closeTo(got[i], want[i]) > 1e-4 {
				t.Fatalf("request %d: in line %v, beside the steps %v, %d patches (%d in line), %g apart", i, want[i].err, got[i].err,
					len(got[i].chunks), len(want[i].chunks), closeTo(got[i], want[i]))
			}
			worst = max(worst, closeTo(got[i], want[i]))
		}
		moves = c.moves.Load()
	}
	if moves == 0 {
		t.Fatal("no stream moved in 3 attempts: the test does not cover compaction beside a decode")
	}
	t.Logf("beside the steps at most %g from in line (%d moves)", worst, moves)
}

// An unset lm_cuda_graph falls back to an uncaptured step when the step's capture check finds a
// replay unlike a plain run; lm_cuda_graph on keeps the error, and other errors (a replay that
// faults, a missing file) are never retried.
func TestOpenWithFallback(t *testing.T) {
	differs := fmt.Errorf("graphs.step (lm_cuda_graph on): step graph of 1 rows: %w (relative rms: patch NaN)", errReplayDiffers)
	other := errors.New("CUDA failure 716: misaligned address")
	for _, c := range []struct {
		name  string
		o     Options
		modes graphModes
		first error
		want  []StepGraph // the step modes opened, in order
		err   error
	}{
		{"default, replay differs", Options{}, graphModes{step: StepGraphOn}, differs, []StepGraph{StepGraphOn, StepGraphOff}, nil},
		{"default, opens", Options{}, graphModes{step: StepGraphOn}, nil, []StepGraph{StepGraphOn}, nil},
		{"default, a fault", Options{}, graphModes{step: StepGraphOn}, other, []StepGraph{StepGraphOn}, other},
		{"on, replay differs", Options{LMCUDAGraph: StepGraphOn}, graphModes{step: StepGraphOn}, differs, []StepGraph{StepGraphOn}, errReplayDiffers},
		{"default with the decoder captured", Options{VocoderCUDAGraph: VAEGraphOn}, graphModes{step: StepGraphOn, captureVAE: true}, differs, []StepGraph{StepGraphOn}, errReplayDiffers},
	} {
		var opened []StepGraph
		_, err := openWithFallback(c.o, c.modes, func(m graphModes) (*graphs, error) {
			opened = append(opened, m.step)
			if len(opened) == 1 {
				return nil, c.first
			}
			return &graphs{}, nil
		})
		if !slices.Equal(opened, c.want) || (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("%s: opened %v, error %v; want %v, error %v", c.name, opened, err, c.want, c.err)
		}
	}
}
