package voxcpm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// fakeEngine is an engine over a fakeRunner with slots slots.
func fakeEngine(t *testing.T, m *Manifest, slots int) (*Engine, *fakeRunner) {
	t.Helper()
	f := newFakeRunner(m, slots+prefillSpare)
	e := newEngine(m, byteTokenizer{}, f, slots)
	t.Cleanup(func() { e.Close() })
	return e, f
}

// result is what a request gave: its chunks' audio, in order.
type result struct {
	chunks [][]float32
	err    error
}

func (r result) pcm() []float32 {
	var out []float32
	for _, c := range r.chunks {
		out = append(out, c...)
	}
	return out
}

// run synthesizes req, checking the chunks' order and rate.
func run(t *testing.T, e *Engine, req tts.Request) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return runCtx(t, ctx, e, req)
}

func runCtx(t *testing.T, ctx context.Context, e *Engine, req tts.Request) result {
	var r result
	r.err = e.Synthesize(ctx, req, func(c tts.Chunk) error {
		if c.Index != len(r.chunks) {
			t.Errorf("chunk %d arrived as number %d", c.Index, len(r.chunks))
		}
		if c.SampleRate != e.m.SampleRate {
			t.Errorf("chunk at %d Hz, want %d", c.SampleRate, e.m.SampleRate)
		}
		r.chunks = append(r.chunks, c.PCM)
		return nil
	})
	return r
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// texts are requests' texts of several lengths, which end after different numbers of patches.
var texts = []string{"Hello there.", "A longer sentence than the first one, by far.", "Short", "Another one, of middling length.",
	"x", "The quick brown fox jumps over the lazy dog.", "Testing, one, two, three.", "Fine."}

// Every request gives whole patches of audio, one chunk a patch, ending by the stop rule or its
// bound; the same seed gives the same audio and another seed other audio.
func TestEngineAlone(t *testing.T) {
	m := fakeManifest()
	e, _ := fakeEngine(t, m, 4)
	for _, text := range texts {
		r := run(t, e, tts.Request{Text: text, Seed: 7})
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.chunks) == 0 {
			t.Fatalf("%q: no audio", text)
		}
		for i, c := range r.chunks {
			if len(c) != m.patchSamples() {
				t.Fatalf("%q: chunk %d has %d samples, want a patch's %d", text, i, len(c), m.patchSamples())
			}
		}
		bound := min(m.Generation.MaxLen, int(float64(len(text))*m.Generation.LenRatio+10))
		if n := len(r.chunks); n > bound || (n < m.Generation.MinLen+2 && n < bound) {
			t.Fatalf("%q: %d patches, want %d to %d", text, n, min(bound, m.Generation.MinLen+2), bound)
		}
		again := run(t, e, tts.Request{Text: text, Seed: 7})
		if d := maxDiff(r.pcm(), again.pcm()); d != 0 {
			t.Fatalf("%q: the same seed gave audio %g apart", text, d)
		}
		other := run(t, e, tts.Request{Text: text, Seed: 8})
		if len(other.chunks) == len(r.chunks) && maxDiff(r.pcm(), other.pcm()) == 0 {
			t.Fatalf("%q: another seed gave the same audio", text)
		}
	}
	if e.Slots() != 0 {
		t.Fatalf("%d slots held after every request ended", e.Slots())
	}
}

// The stop rule: past min_len the stop logits end a row; the bound ends it regardless.
func TestEnds(t *testing.T) {
	stop, goOn := [2]float32{0, 1}, [2]float32{1, 0}
	for _, c := range []struct {
		i     int
		stop  [2]float32
		bound int
		want  bool
	}{
		{0, stop, 10, false}, {2, stop, 10, false}, {3, stop, 10, true}, {3, goOn, 10, false},
		{8, goOn, 10, false}, {9, goOn, 10, true}, {0, goOn, 1, true},
	} {
		if got := ends(c.i, c.stop, 2, c.bound); got != c.want {
			t.Errorf("ends(%d, %v, min_len 2, bound %d) = %v", c.i, c.stop, c.bound, got)
		}
	}
}

// The noise of a patch depends on the seed and the patch index alone.
func TestNoise(t *testing.T) {
	a, b, c := make([]float32, 256), make([]float32, 256), make([]float32, 256)
	fillNoise(a, 1, 3)
	fillNoise(b, 1, 3)
	fillNoise(c, 1, 4)
	if maxDiff(a, b) != 0 || maxDiff(a, c) == 0 {
		t.Fatal("noise is not a function of (seed, patch index)")
	}
	var s, sq float64
	for _, x := range a {
		s += float64(x)
		sq += float64(x) * float64(x)
	}
	if mean, v := s/256, sq/256; math.Abs(mean) > 0.25 || v < 0.6 || v > 1.5 {
		t.Fatalf("noise mean %g, variance %g: not standard normal", mean, v)
	}
}

// aloneResults runs each request by itself.
func aloneResults(t *testing.T, m *Manifest, reqs []tts.Request) []result {
	e, _ := fakeEngine(t, m, 1)
	return runAlone(t, e, reqs)
}

// Requests run together, joining and leaving at different steps (compaction moving streams
// down), each give exactly the audio they give alone.
func TestEngineBatchedEqualsAlone(t *testing.T) {
	m := fakeManifest()
	var reqs []tts.Request
	for i := range 24 {
		reqs = append(reqs, tts.Request{Text: texts[i%len(texts)] + strings.Repeat("!", i%5), Seed: uint64(100 + i)})
	}
	want := aloneResults(t, m, reqs)
	e, f := fakeEngine(t, m, 8)
	f.stepDelay = time.Millisecond
	// Waves, so that streams also leave holes no arrival fills.
	got := runTogether(t, e, reqs, func(i int) time.Duration { return time.Duration(i/8*30+i%3) * time.Millisecond })
	moved := 0
	for _, c := range f.callLog() {
		if strings.HasPrefix(c, "move") {
			moved++
		}
	}
	for i := range reqs {
		if got[i].err != nil {
			t.Fatalf("request %d: %v", i, got[i].err)
		}
		if len(got[i].chunks) != len(want[i].chunks) {
			t.Fatalf("request %d: %d patches beside others, %d alone", i, len(got[i].chunks), len(want[i].chunks))
		}
		if d := maxDiff(got[i].pcm(), want[i].pcm()); d != 0 {
			t.Fatalf("request %d: audio %g from its audio alone", i, d)
		}
	}
	if f.maxRows < 2 || f.maxRows > 8 {
		t.Fatalf("steps ran over at most %d slots, want batches of 2 to 8", f.maxRows)
	}
	if moved == 0 {
		t.Fatal("no stream was moved down: the test does not cover compaction")
	}
	if e.Slots() != 0 {
		t.Fatalf("%d slots held after every request ended", e.Slots())
	}
	st := e.Stats()
	if st[stagePrefill].Items != uint64(len(reqs)) || st[stageStep].Batches == 0 || st[stageVAE].Batches != st[stageStep].Batches {
		t.Fatalf("stats %+v", st)
	}
}

// Each patch's VAE decode runs beside the next step, and every request gives exactly the audio
// of an engine that decodes in line, alone and batched with streams joining, leaving, moving
// down and priming voices.
func TestEngineOverlapEqualsInLine(t *testing.T) {
	m := fakeManifest()
	PD := m.patchFloats()
	lat := make([]float32, 5*PD)
	for i := range lat {
		lat[i] = float32(i%7) / 10
	}
	m.voices = map[string]*voice{"v": {name: "v", text: "Said before.", latents: lat, patches: 5}}
	m.voiceNames = append(m.voiceNames, "v")
	var reqs []tts.Request
	for i := range 20 {
		req := tts.Request{Text: texts[i%len(texts)] + strings.Repeat("~", i%4), Seed: uint64(300 + i)}
		if i%3 == 0 {
			req.Voice = "v"
		}
		reqs = append(reqs, req)
	}
	f := newFakeRunner(m, 1+prefillSpare)
	inLine := startEngine(m, byteTokenizer{}, f, 1, false)
	t.Cleanup(func() { inLine.Close() })
	want := runAlone(t, inLine, reqs)
	if f.overlaps.Load() != 0 {
		t.Fatal("in line, a decode ran beside a step")
	}
	e, g := fakeEngine(t, m, 6)
	g.stepDelay, g.decodeDelay = 2*time.Millisecond, 2*time.Millisecond
	got := runTogether(t, e, reqs, func(i int) time.Duration { return time.Duration(i/6*25+i%4) * time.Millisecond })
	for i := range reqs {
		if got[i].err != nil || len(got[i].chunks) != len(want[i].chunks) || maxDiff(got[i].pcm(), want[i].pcm()) != 0 {
			t.Fatalf("request %d: %v, %d patches (%d in line), audio %g from in line", i, got[i].err,
				len(got[i].chunks), len(want[i].chunks), maxDiff(got[i].pcm(), want[i].pcm()))
		}
	}
	moved := 0
	for _, c := range g.callLog() {
		if strings.HasPrefix(c, "move states") {
			moved++
		}
	}
	if g.overlaps.Load() == 0 || moved == 0 {
		t.Fatalf("%d decodes beside a step, %d states moved: the test does not cover the overlap", g.overlaps.Load(), moved)
	}
	if e.Slots() != 0 {
		t.Fatalf("%d slots held after every request ended", e.Slots())
	}
}

// A decode that fails fails the requests it carried and those running when the scheduler sees
// it; the engine goes on with the next.
func TestEngineDecodeFails(t *testing.T) {
	m := fakeManifest()
	f := &failingDecode{fakeRunner: newFakeRunner(m, 4+prefillSpare)}
	e := newEngine(m, byteTokenizer{}, f, 4)
	t.Cleanup(func() { e.Close() })
	f.fail.Store(true)
	if r := run(t, e, tts.Request{Text: texts[1]}); r.err == nil || !strings.Contains(r.err.Error(), "decoder lost") {
		t.Fatalf("request over a failing decode: %v", r.err)
	}
	f.fail.Store(false)
	if r := run(t, e, tts.Request{Text: texts[0]}); r.err != nil || len(r.chunks) == 0 {
		t.Fatalf("the request after: %v, %d chunks", r.err, len(r.chunks))
	}
}

type failingDecode struct {
	*fakeRunner
	fail atomic.Bool
}

func (f *failingDecode) decode(n int, patch []float32) ([]float32, error) {
	if f.fail.Load() {
		return nil, errors.New("decoder lost")
	}
	return f.fakeRunner.decode(n, patch)
}

// A burst of arrivals joins before the next step, in groups of at most prefillGroup prompts of
// like lengths, each run as a power of two rows, and each request gives the audio it gives alone.
func TestEngineJoinsInGroups(t *testing.T) {
	m := fakeManifest()
	e, f := fakeEngine(t, m, 16)
	f.stepDelay = time.Millisecond
	var reqs []tts.Request
	for i := range 12 {
		reqs = append(reqs, tts.Request{Text: texts[i%len(texts)] + strings.Repeat("?", i), Seed: uint64(i)})
	}
	want := aloneResults(t, m, reqs)
	// The steps wait while the burst arrives: the gate is set as the running request's first
	// patch arrives, before its next step, so a slow machine cannot let it finish ungated.
	gate := make(chan struct{})
	first := make(chan struct{})
	var once sync.Once
	go e.Synthesize(context.Background(), tts.Request{Text: texts[1]}, func(tts.Chunk) error {
		once.Do(func() {
			f.mu.Lock()
			f.gate = gate
			f.mu.Unlock()
			close(first)
		})
		return nil
	})
	<-first
	for deadline := time.Now().Add(time.Minute); !f.gated.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the running request took no step after its first patch")
		}
	}
	got := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = run(t, e, req)
		}()
	}
	time.Sleep(200 * time.Millisecond)
	f.mu.Lock()
	f.gate = nil
	f.mu.Unlock()
	close(gate)
	wg.Wait()
	for i := range reqs {
		if got[i].err != nil || maxDiff(got[i].pcm(), want[i].pcm()) != 0 {
			t.Fatalf("request %d: %v, audio %g from alone", i, got[i].err, maxDiff(got[i].pcm(), want[i].pcm()))
		}
	}
	joined, most, groups := 0, 0, 0
	for _, c := range f.callLog() {
		switch {
		case strings.HasPrefix(c, "prefill"):
			var from, rows int
			if _, err := fmt.Sscanf(c, "prefill %d %d", &from, &rows); err != nil {
				t.Fatalf("%q: %v", c, err)
			}
			ls := strings.Fields(strings.Trim(c[strings.Index(c, "["):], "[]"))
			if len(ls) > prefillGroup || rows != prefillRows(len(ls)) {
				t.Fatalf("%q: %d prompts in %d rows, want at most %d in a power of two rows", c, len(ls), rows, prefillGroup)
			}
			if !slices.IsSortedFunc(ls, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y }) {
				t.Fatalf("%q: a group's prompts are not sorted by length", c)
			}
			joined += len(ls)
			groups++
			most = max(most, joined)
		case strings.HasPrefix(c, "step"):
			joined = 0
		}
	}
	if most <= prefillGroup || groups >= len(reqs) {
		t.Fatalf("at most %d requests joined between two steps in %d prefills: the burst did not join in groups at once", most, groups)
	}
}

// A request cancelled while it runs leaves its slot before the next step; the next request
// runs as it would alone.
func TestEngineCancel(t *testing.T) {
	m := fakeManifest()
	e, f := fakeEngine(t, m, 4)
	f.stepDelay = 2 * time.Millisecond
	err := cancelAfter(e, tts.Request{Text: strings.Repeat("long text ", 5)}, 2)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request returned %v", err)
	}
	waitSlotsFree(t, e, 5*time.Second, "the cancel")
	if c := e.CancelStats(); c.Count != 1 {
		t.Fatalf("cancel stats %+v, want one cancel", c)
	}
	req := tts.Request{Text: texts[0], Seed: 3}
	want := aloneResults(t, m, []tts.Request{req})[0]
	if r := run(t, e, req); r.err != nil || maxDiff(r.pcm(), want.pcm()) != 0 {
		t.Fatalf("request after a cancel: %v, audio %g from alone", r.err, maxDiff(r.pcm(), want.pcm()))
	}
	// An emit that fails ends the request the same way.
	boom := errors.New("client gone")
	if err := e.Synthesize(context.Background(), tts.Request{Text: texts[1]}, func(tts.Chunk) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failed emit returned %v", err)
	}
	waitSlotsFree(t, e, 5*time.Second, "a failed emit")
}

// A step that fails fails every running request, and the engine goes on with the next.
func TestEngineStepFails(t *testing.T) {
	m := fakeManifest()
	e, f := fakeEngine(t, m, 4)
	f.failStep = errors.New("device lost")
	if r := run(t, e, tts.Request{Text: texts[0]}); r.err == nil || !strings.Contains(r.err.Error(), "device lost") {
		t.Fatalf("request over a failing step: %v", r.err)
	}
	if e.Slots() != 0 {
		t.Fatalf("%d slots held after a failed step", e.Slots())
	}
}

// A prompt that leaves the caches no room for the fewest patches is the request's error, naming
// lm.max_positions; one that fits has its patches capped to the room left.
func TestPromptTooLong(t *testing.T) {
	m := fakeManifest()
	e, _ := fakeEngine(t, m, 2)
	long := strings.Repeat("a", m.LM.MaxPositions-2)
	err := run(t, e, tts.Request{Text: long}).err
	var te *tts.Error
	if !errors.As(err, &te) || te.Kind != tts.ErrInvalid || !strings.Contains(err.Error(), "lm.max_positions") {
		t.Fatalf("too long a prompt: %v, want an invalid-request error naming lm.max_positions", err)
	}
	fits := strings.Repeat("a", m.LM.MaxPositions-m.Generation.MinLen-3) // room for min_len+2 patches exactly
	r := run(t, e, tts.Request{Text: fits})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.chunks) > m.Generation.MinLen+2 {
		t.Fatalf("%d patches in a cache with room for %d", len(r.chunks), m.Generation.MinLen+2)
	}
	if err := run(t, e, tts.Request{Text: " \n "}).err; !errors.Is(err, tts.ErrEmptyText) {
		t.Fatalf("blank text: %v", err)
	}
}

// A voice's transcript goes before the text in one tokenization, its patches after audio_start;
// its last patch is patch 0's cond and its last context_patches prime the VAE state.
func TestVoicePrompt(t *testing.T) {
	m := fakeManifest()
	PD := m.patchFloats()
	lat := make([]float32, 5*PD)
	for i := range lat {
		lat[i] = float32(i) / 10
	}
	m.voices = map[string]*voice{"v": {name: "v", text: "Said before.", latents: lat, patches: 5}}
	m.voiceNames = append(m.voiceNames, "v")
	p, err := m.buildPrompt(byteTokenizer{}, m.voice("v"), "  Now   this.\n")
	if err != nil {
		t.Fatal(err)
	}
	want := append(byteTokenizer{}.Encode("Said before.Now this."), 101)
	if fmt.Sprint(p.ids) != fmt.Sprint(want) || p.targetTokens != len("Now this.") || p.length() != len(want)+5 {
		t.Fatalf("prompt ids %v (%d target tokens, length %d), want %v", p.ids, p.targetTokens, p.length(), want)
	}
	ids, textMask, feat, featMask := m.prefillInputs(p)
	nt := len(want)
	if ids[nt] != 0 || textMask[nt-1] != 1 || textMask[nt] != 0 || featMask[nt-1] != 0 || featMask[nt] != 1 || feat[nt*PD+1] != lat[1] || feat[(nt-1)*PD] != 0 {
		t.Fatal("prefill inputs do not lay the voice's patches after audio_start")
	}
	e, f := fakeEngine(t, m, 2)
	named := run(t, e, tts.Request{Text: "Now this.", Voice: "v", Seed: 1})
	if named.err != nil {
		t.Fatal(named.err)
	}
	if ctx := f.primed[0]; len(ctx) != 2*PD || ctx[0] != lat[3*PD] {
		t.Fatalf("VAE state primed with %v, want the voice's last 2 patches", ctx)
	}
	// The same latents as a request's prompt speak the same; a prompt replaces the named voice.
	vp := &tts.VoicePrompt{Text: "Said before.", Latents: lat, LatentDim: m.FeatDim}
	prompted := run(t, e, tts.Request{Text: "Now this.", Voice: "nobody", Prompt: vp, Seed: 1})
	if prompted.err != nil || maxDiff(named.pcm(), prompted.pcm()) != 0 {
		t.Fatalf("the voice as a request prompt: %v, audio %g apart", prompted.err, maxDiff(named.pcm(), prompted.pcm()))
	}
	plain := run(t, e, tts.Request{Text: "Now this.", Seed: 1})
	if plain.err != nil || maxDiff(named.pcm(), plain.pcm()) == 0 {
		t.Fatalf("the empty voice speaks in the default voice: %v", plain.err)
	}
	if ctx := f.primed[0]; ctx != nil {
		t.Fatalf("the default voice's VAE state primed with %d values, want zeros", len(ctx))
	}
	for _, c := range []struct {
		vp   tts.VoicePrompt
		want string
	}{
		{tts.VoicePrompt{Text: "x", Latents: lat, LatentDim: 4}, "feat_dim"},
		{tts.VoicePrompt{Text: "x", Latents: lat[:PD+1], LatentDim: 3}, "whole number of patches"},
		{tts.VoicePrompt{Text: "x"}, "no latents"},
		{tts.VoicePrompt{Text: "x", SpeechTokens: []int64{1}}, "made by the staged family"},
		{tts.VoicePrompt{Text: " ", Latents: lat, LatentDim: 3}, "text is empty"},
		{tts.VoicePrompt{Text: "x", Latents: []float32{float32(math.NaN()), 0, 0, 0, 0, 0}, LatentDim: 3}, "finite"},
	} {
		err := run(t, e, tts.Request{Text: "Now.", Prompt: &c.vp}).err
		var te *tts.Error
		if !errors.As(err, &te) || te.Kind != tts.ErrInvalid || !strings.Contains(err.Error(), c.want) {
			t.Errorf("prompt %+v: %v, want an invalid-request error saying %q", c.vp, err, c.want)
		}
	}
}

// Close fails what runs and frees the runner.
func TestEngineClose(t *testing.T) {
	m := fakeManifest()
	f := newFakeRunner(m, 2+prefillSpare)
	f.stepDelay = 5 * time.Millisecond
	e := newEngine(m, byteTokenizer{}, f, 2)
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error)
	go func() {
		done <- e.Synthesize(context.Background(), tts.Request{Text: texts[1]}, func(tts.Chunk) error {
			once.Do(func() { close(started) })
			return nil
		})
	}()
	<-started
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("request under way at Close: %v", err)
	}
	if !f.closed {
		t.Fatal("runner not closed")
	}
}
