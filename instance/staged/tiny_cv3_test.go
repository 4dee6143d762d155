package staged

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// models/tiny-cosyvoice3 is CosyVoice3's published format with random weights
// (scripts/cosyvoice3/make_tiny.py) run through scripts/cosyvoice3/export.py with a random voice
// bench: `make tiny-cosyvoice3` makes it, and `make test` does so before the tests. Its graphs are
// the real model's, so these tests run the exporter's output through the engine.
// tinyCV3 is models/tiny-cosyvoice3's manifest, or VOXMUX_TINY_COSYVOICE3's (another export of
// the same checkpoint, e.g. one with --chunk-flow beside an older one).
var tinyCV3 = cmp.Or(os.Getenv("VOXMUX_TINY_COSYVOICE3"), "../../models/tiny-cosyvoice3/pipeline.yaml")

// requireTinyCV3 says whether tests that need what `make tiny-cosyvoice3` makes must fail,
// rather than skip, without it: scripts/test.sh sets VOXMUX_REQUIRE_TINY_COSYVOICE3 after making it.
func requireTinyCV3() bool { return os.Getenv("VOXMUX_REQUIRE_TINY_COSYVOICE3") != "" }

// tinyCV3Engine serves models/tiny-cosyvoice3 on the CPU with the engine's defaults.
func tinyCV3Engine(t *testing.T) *Engine {
	t.Helper()
	return tinyCV3EngineWith(t, Options{})
}

// loadTinyCV3 loads models/tiny-cosyvoice3 on the CPU with opts, skipping the test (or failing
// it, under VOXMUX_REQUIRE_TINY_COSYVOICE3) where it has not been made.
func loadTinyCV3(t *testing.T, opts Options) (*Pipeline, error) {
	t.Helper()
	if _, err := os.Stat(tinyCV3); err != nil {
		if requireTinyCV3() {
			t.Fatalf("%v, and VOXMUX_REQUIRE_TINY_COSYVOICE3 is set", err)
		}
		t.Skipf("%v: run make tiny-cosyvoice3", err)
	}
	return LoadPipeline(tts.LoadConfig{Manifest: tinyCV3, Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, opts)})
}

// tinyCV3EngineWith serves models/tiny-cosyvoice3 on the CPU with opts.
func tinyCV3EngineWith(t *testing.T, opts Options) *Engine {
	t.Helper()
	p, err := loadTinyCV3(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(p)
	t.Cleanup(func() { e.Close() })
	return e
}

const tinyCV3Text = "Hello world. This is voxmux."

// Both voices (default: no prompt; bench: a 5 s prompt through the flow's cond and embedding)
// speak: audio in range, whole vocoder hops, as many speech tokens as the manifest's bounds allow
// for the text. The same request gives the same samples; the two voices give different audio.
func TestTinyCosyVoice3Voices(t *testing.T) {
	e := tinyCV3Engine(t)
	m := e.p.m
	if !slices.Equal(m.Voices, []string{"default", "bench"}) {
		t.Fatalf("voices %v, want [default bench]", m.Voices)
	}
	// The bounds count each segment's own text tokens (not the instruction before it).
	var minTok, maxTok int
	for _, seg := range m.Segments(tinyCV3Text) {
		lo, hi := m.TokenBounds(seg, len(m.textIDs(seg)))
		minTok, maxTok = minTok+lo, maxTok+hi
	}
	hop := m.Vocoder.Hop
	perTok := m.Flow.FramesPerToken * hop
	if hop != 480 || perTok != 960 {
		t.Fatalf("hop %d and %d samples a token, want CosyVoice3's 480 and 960", hop, perTok)
	}
	audio := map[string][]float32{}
	for _, voice := range []string{"default", "bench"} {
		req := tts.Request{Text: tinyCV3Text, Voice: voice, Seed: 7}
		pcm := synth(t, e, req)
		if len(pcm) == 0 || len(pcm)%hop != 0 {
			t.Fatalf("%s: %d samples, not a whole number of hops of %d", voice, len(pcm), hop)
		}
		if len(pcm) < minTok*perTok || len(pcm) > maxTok*perTok {
			t.Fatalf("%s: %d samples is %.1f speech tokens, want %d..%d", voice, len(pcm), float64(len(pcm))/float64(perTok), minTok, maxTok)
		}
		var sum float64
		for i, v := range pcm {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || v < -0.99 || v > 0.99 {
				t.Fatalf("%s: sample %d is %v, want within [-0.99, 0.99]", voice, i, v)
			}
			sum += float64(v) * float64(v)
		}
		if rms := math.Sqrt(sum / float64(len(pcm))); rms < 1e-3 {
			t.Fatalf("%s: audio is silent (rms %g)", voice, rms)
		}
		// Seeded sampling, the flow's noise table and the vocoder's fixed noise: nothing random
		// is left between two runs. Within float rounding only: a run that shares a batch with
		// another (padded) rounds differently.
		sameSpeech(t, voice+": the same request and seed, twice", pcm, synth(t, e, req))
		audio[voice] = pcm
	}
	if slices.Equal(audio["default"], audio["bench"]) {
		t.Error("voices default and bench gave the same audio")
	}
}

// Copies of a request at once, in both voices, batched in every stage: each gives the audio the
// request gives alone (sameSpeech: the same speech tokens and samples within float rounding).
func TestTinyCosyVoice3ConcurrentEqualsAlone(t *testing.T) {
	e := tinyCV3Engine(t)
	voices := []string{"default", "bench"}
	alone := synthEach(t, e, []tts.Request{{Text: tinyCV3Text, Voice: voices[0], Seed: 3}, {Text: tinyCV3Text, Voice: voices[1], Seed: 3}})
	const copies = 6
	var reqs []tts.Request
	for i := range 2 * copies {
		reqs = append(reqs, tts.Request{Text: tinyCV3Text, Voice: voices[i%2], Seed: 3})
	}
	for i, pcm := range synthTogether(t, e, reqs) {
		sameSpeech(t, fmt.Sprintf("%s, copy %d of %d", reqs[i].Voice, i/2+1, copies), alone[i%2], pcm)
	}
}

// A longer text streams as the manifest's chunk schedule cuts it: chunk i holds
// streaming.chunk_tokens[i] tokens (the last of the list repeating) and the last chunk what is
// left; the vocoder holds back its look-ahead frames from each chunk's audio for the next, so the
// first chunk is that much shorter and the last that much longer. With flow.chunk_step the chunks
// after the first end on the flow's chunk boundaries.
func TestTinyCosyVoice3Chunks(t *testing.T) {
	e := tinyCV3Engine(t)
	m := e.p.m
	text := "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest."
	if segs := m.Segments(text); len(segs) != 1 {
		t.Fatalf("%d segments, want one stream: %q", len(segs), segs)
	}
	for _, voice := range []string{"default", "bench"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var sizes []int
		total := 0
		err := e.Synthesize(ctx, tts.Request{Text: text, Voice: voice, Seed: 5}, func(c tts.Chunk) error {
			if c.Index != len(sizes) {
				t.Errorf("%s: chunk %d arrived as number %d", voice, c.Index, len(sizes))
			}
			sizes = append(sizes, len(c.PCM))
			total += len(c.PCM)
			return nil
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		hop, fpt, la := m.Vocoder.Hop, m.Flow.FramesPerToken, m.Vocoder.LookaheadFrames
		if total%(fpt*hop) != 0 {
			t.Fatalf("%s: %d samples, not whole speech tokens", voice, total)
		}
		var want []int
		P := 0
		if v := m.voice(voice); v != nil {
			P = len(v.SpeechTokens)
		}
		for i, sum, left := 0, 0, total/(fpt*hop); left > 0; i++ {
			size := m.ChunkSize(i)
			if per := m.Flow.ChunkFrames / fpt; per > 0 && i > 0 {
				// The chunk-causal flow's chunks after the first end on chunk boundaries, counted
				// from the voice prompt's first frame.
				size = per - (P+sum)%per
			}
			n := min(size, left)
			sum += n
			left -= n
			want = append(want, n*fpt*hop)
		}
		if len(want) > 1 {
			want[0] -= la * hop
			want[len(want)-1] += la * hop
		}
		if len(sizes) < 3 || !slices.Equal(sizes, want) {
			t.Errorf("%s: chunks of %v samples, want %v (at least 3)", voice, sizes, want)
		}
	}
}

// lm_min_tokens_per_text_token raises the LM's minimum: with random weights the LM ends speech
// as soon as it may, at the manifest's 2 speech tokens per text token, and with the option at 9
// no sooner than 9 per text token: in both voices, and in each segment of a text split in two.
func TestTinyCosyVoice3MinTokensPerTextToken(t *testing.T) {
	const ratio = 9
	short := tinyCV3EngineWith(t, Options{})
	long := tinyCV3EngineWith(t, Options{LMMinTokensPerTextToken: ratio})
	m := long.p.m
	perTok := m.Flow.FramesPerToken * m.Vocoder.Hop
	twoSegs := strings.Repeat("The quick brown fox jumps over the lazy dog near the riverbank. ", 8)
	for _, text := range []string{tinyCV3Text, twoSegs} {
		segs := m.Segments(text)
		if text == twoSegs && len(segs) != 2 {
			t.Fatalf("%d segments, want 2: %q", len(segs), segs)
		}
		var textTokens, maxTok int
		for _, seg := range segs {
			n := len(m.textIDs(seg))
			_, hi := m.TokenBounds(seg, n)
			textTokens, maxTok = textTokens+n, maxTok+hi
		}
		voices := []string{"default", "bench"}
		if text == twoSegs {
			voices = voices[1:]
		}
		for _, voice := range voices {
			req := tts.Request{Text: text, Voice: voice, Seed: 11}
			got := len(synth(t, long, req)) / perTok
			if got < ratio*textTokens || got > maxTok {
				t.Errorf("%s, %d segment(s) of %d text tokens: %d speech tokens with the option at %d, want at least %d (at most %d)",
					voice, len(segs), textTokens, got, ratio, ratio*textTokens, maxTok)
			}
			base := len(synth(t, short, req)) / perTok
			if base >= got {
				t.Errorf("%s: %d speech tokens without the option, %d with it", voice, base, got)
			}
			t.Logf("%s, %d segment(s), %d text tokens: %d speech tokens, %d without the option", voice, len(segs), textTokens, got, base)
		}
	}
}

// The option is checked against the manifest when the model loads: more than the manifest's
// maximum, and a model whose bounds are per character, are refused naming the key and the
// manifest's file.
func TestMinTokensPerTextTokenAgainstTheManifest(t *testing.T) {
	_, err := loadTinyCV3(t, Options{LMMinTokensPerTextToken: 25})
	for _, want := range []string{tinyCV3, "engine.lm_min_tokens_per_text_token", "25 is more than the manifest's lm.max_tokens_per_text_token (20)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("25 on models/tiny-cosyvoice3: error %v, want it to contain %q", err, want)
		}
	}
	_, err = loadTiny(t, Options{LMMinTokensPerTextToken: 3})
	for _, want := range []string{"models/tiny/pipeline.yaml", "engine.lm_min_tokens_per_text_token", "bounds them per character"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("on models/tiny: error %v, want it to contain %q", err, want)
		}
	}
}
