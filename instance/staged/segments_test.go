package staged

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// samplingEngine serves models/tiny/sampling.yaml (sampling, normalization, segments) on the
// CPU with one thread per kernel: ONNX Runtime then sums in the same order at every batch
// shape, so batching cannot change a sample.
func samplingEngine(t *testing.T, exact bool) *Engine {
	t.Helper()
	p, err := LoadPipeline(tts.LoadConfig{Manifest: "../../models/tiny/sampling.yaml", Provider: "cpu", ORTLibrary: ortLibrary(t),
		Engine: section(t, Options{Options: ort.Options{IntraOpThreads: 1}, ExactBatches: exact})})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(p)
	t.Cleanup(func() { e.Close() })
	return e
}

var seededRequests = []tts.Request{
	{Text: "Hello world.", Seed: 1},
	{Text: "A somewhat longer sentence, to be spoken while others run.", Seed: 2},
	{Text: "¿Dónde está la biblioteca?", Seed: 3},
	{Text: "你好，世界。", Seed: 4},
	{Text: "Hello world.", Seed: 5},
}

// The same request and seed give the same audio to the byte alone, and the same speech beside
// other requests: the same speech tokens (so the same length) and samples within float rounding.
// Beside others a chunk may run padded to a longer batch item, and ONNX Runtime's sums over the
// padded length then round differently (up to about 5e-7 measured on models/tiny).
func TestSamplingBatchedEqualsAlone(t *testing.T) {
	e := samplingEngine(t, false)
	alone := synthEach(t, e, seededRequests)
	if again := synth(t, e, seededRequests[0]); !slices.Equal(again, alone[0]) {
		t.Error("the same request and seed, twice alone, gave different audio")
	}
	if slices.Equal(alone[0], alone[4]) {
		t.Error("seeds 1 and 5 gave the same audio")
	}
	// Sampling, not greedy decoding: how long the speech runs depends on the seed.
	lens := map[int]bool{}
	for seed := range uint64(4) {
		lens[len(synth(t, e, tts.Request{Text: "Hello world.", Seed: seed}))] = true
	}
	if len(lens) == 1 {
		t.Error("seeds 0 to 3 all gave speech of one length")
	}
	for round := range 2 {
		batched := synthTogether(t, e, seededRequests)
		for i, r := range seededRequests {
			sameSpeech(t, fmt.Sprintf("round %d, %q seed %d", round, r.Text, r.Seed), alone[i], batched[i])
		}
	}
}

// Long text is spoken as segments in order, as one stream: its audio begins with its first
// segment's, and is the same every time.
func TestLongTextSegments(t *testing.T) {
	e := samplingEngine(t, false)
	text := "The first sentence is here, and it runs on for a while. The second one follows it closely. " +
		"A third sentence comes next, longer than the others were. Then 4 more words!"
	segs := e.p.m.Segments(text)
	if len(segs) < 2 {
		t.Fatalf("%d segments: %q", len(segs), segs)
	}
	if !strings.Contains(strings.Join(segs, ""), "four more words") {
		t.Errorf("numbers not spelled out: %q", segs)
	}
	req := tts.Request{Text: text, Seed: 9}
	whole := synth(t, e, req) // synth checks the chunks arrive numbered in order
	first := synth(t, e, tts.Request{Text: segs[0], Seed: 9})
	if len(whole) <= len(first) || !slices.Equal(whole[:len(first)], first) {
		t.Errorf("the audio (%d samples) does not begin with its first segment's (%d samples)", len(whole), len(first))
	}
	if again := synth(t, e, req); !slices.Equal(again, whole) {
		t.Error("the same long request and seed gave different audio")
	}
}

// A prompt over lm.max_prompt_tokens is refused before any work, naming the limit in tokens: a
// character that is two bytes is two tokens to the bytes tokenizer.
func TestPromptTokenLimit(t *testing.T) {
	// 4096 × 2 bytes, bos and sos; sampling.yaml's segmenting adds a full stop.
	for manifest, tokens := range map[string]string{"pipeline.yaml": "8194", "sampling.yaml": "8195"} {
		p, err := LoadPipeline(tts.LoadConfig{Manifest: "../../models/tiny/" + manifest, Provider: "cpu", ORTLibrary: ortLibrary(t)})
		if err != nil {
			t.Fatal(err)
		}
		e := NewEngine(p)
		lim := p.m.LM.MaxPromptTokens
		text := strings.Repeat("é", 4096)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = e.Synthesize(ctx, tts.Request{Text: text}, func(tts.Chunk) error { return errors.New("audio for a refused request") })
		cancel()
		var te *tts.Error
		if !errors.As(err, &te) || te.Kind != tts.ErrInvalid {
			t.Errorf("%s: %v, want an ErrInvalid", manifest, err)
		} else if want := "the text makes " + tokens + " prompt tokens; the limit is " + strconv.Itoa(lim) + " tokens (lm.max_prompt_tokens)"; !strings.Contains(te.Msg, want) {
			t.Errorf("%s: %q does not say %q", manifest, te.Msg, want)
		}
		for _, s := range e.Stats() {
			if s.Batches != 0 {
				t.Errorf("%s: stage %s ran %d batches for a refused request", manifest, s.Stage, s.Batches)
			}
		}
		// Within the limit it runs.
		if pcm := synth(t, e, tts.Request{Text: strings.Repeat("é", (lim-2)/2/8)}); len(pcm) == 0 {
			t.Errorf("%s: no audio within the limit", manifest)
		}
		e.Close()
	}
}

// Enough streams at once that their tokens are picked in parallel (pickAll): still the same speech
// as each request alone.
func TestSamplingManyStreamsEqualAlone(t *testing.T) {
	e := samplingEngine(t, false)
	reqs := mixedSeededRequests(24)
	alone := synthEach(t, e, reqs)
	decode := func() (batches, items uint64) {
		for _, s := range e.Stats() {
			if s.Stage == "lm_decode" {
				return s.Batches, s.Items
			}
		}
		return 0, 0
	}
	b0, i0 := decode()
	batched := synthTogether(t, e, reqs)
	for i, r := range reqs {
		sameSpeech(t, fmt.Sprintf("%q seed %d", r.Text, r.Seed), alone[i], batched[i])
	}
	b1, i1 := decode()
	t.Logf("%.1f streams per decode step batched, GOMAXPROCS %d", float64(i1-i0)/float64(b1-b0), runtime.GOMAXPROCS(0))
}

// sameSpeech checks that batched is alone's speech: the same length (the same speech tokens: a
// different token changes the chunking and the length) and every sample within float rounding.
func sameSpeech(t *testing.T, what string, alone, batched []float32) {
	t.Helper()
	if len(alone) != len(batched) {
		t.Errorf("%s: %d samples batched, %d alone", what, len(batched), len(alone))
		return
	}
	var worst float64
	for i := range alone {
		worst = max(worst, math.Abs(float64(alone[i]-batched[i])))
	}
	if worst > 2e-6 {
		t.Errorf("%s: batched differs from alone by %g", what, worst)
	}
}

// With exact_batches, flow and vocoder batches hold items of one length, so nothing runs padded:
// a seeded request beside 24 others is its audio alone to the byte.
func TestExactBatchesEqualAloneToTheByte(t *testing.T) {
	e := samplingEngine(t, true)
	reqs := mixedSeededRequests(24)
	alone := synthEach(t, e, reqs)
	for round := range 2 {
		batched := synthTogether(t, e, reqs)
		for i, r := range reqs {
			if !slices.Equal(alone[i], batched[i]) {
				t.Errorf("round %d, %q seed %d: batched differs from alone", round, r.Text, r.Seed)
			}
		}
	}
}

// mixedSeededRequests are n requests of three texts, each with its own seed.
func mixedSeededRequests(n int) []tts.Request {
	reqs := make([]tts.Request, n)
	for i := range reqs {
		reqs[i] = tts.Request{Text: []string{"Hi there.", "Good morning to you.", "Yes."}[i%3], Seed: uint64(100 + i)}
	}
	return reqs
}
