package staged

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// tinyChunkEngine serves the tiny CosyVoice3 export with flow.chunk_step on the CPU, its prompt
// cache bounded to cacheBytes and its chunks ending as emit says; extra are more engine options
// (JSON members). mels records each chunk's mel.
func tinyChunkEngine(t *testing.T, cacheBytes int64, emit ChunkEmit, extra ...string) (*Engine, *melLog) {
	t.Helper()
	c, _ := tinyChunkFlow(t) // skips (or fails) without the export
	opts := append([]string{`"flow_chunk_emit": "` + string(emit) + `"`}, extra...)
	p, err := LoadPipeline(tts.LoadConfig{Manifest: c.m.File, Provider: "cpu", ORTLibrary: ortLibrary(t),
		Engine: tts.EngineSection("{" + strings.Join(opts, ", ") + "}")})
	if err != nil {
		t.Fatal(err)
	}
	p.prompts.limit = cacheBytes
	e := NewEngine(p)
	t.Cleanup(func() { e.Close() })
	log := &melLog{}
	e.onMel = log.add
	return e, log
}

// melLog keeps the chunks' mels of the engine's last request, and its tokens and voice.
type melLog struct {
	mu     sync.Mutex
	chunks [][]float32
	tokens []int64
	voice  *Voice
}

func (l *melLog) add(s *stream, mel []float32, last bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chunks = append(l.chunks, mel)
	if last {
		l.tokens, l.voice = slices.Clone(s.tokens), s.voice
	}
}

func (l *melLog) take() (chunks [][]float32, tokens []int64, voice *Voice) {
	l.mu.Lock()
	defer l.mu.Unlock()
	chunks, tokens, voice = l.chunks, l.tokens, l.voice
	l.chunks, l.tokens, l.voice = nil, nil, nil
	return
}

// wholeChunkRun is the mel of one run over the whole utterance (the voice's prompt, then tokens)
// under the chunk-causal mask, by the host runner chunkFlow: channel-major [mel][frames] from the
// voice prompt's first frame.
func wholeChunkRun(t *testing.T, e *Engine, v *Voice, tokens []int64) ([]float32, int) {
	t.Helper()
	m := e.p.m
	M, R := m.Flow.MelBins, m.Flow.FramesPerToken
	fc := e.p.flows[0].(*flowChunks)
	var prompt []int64
	var cond, emb []float32
	if v != nil {
		prompt, cond, emb = v.SpeechTokens, v.Mel, v.Embedding
	}
	all := slices.Concat(prompt, tokens)
	Fr := len(all) * R
	row := &chunkRow{tokens: all}
	if err := fc.encode([]*chunkRow{row}); err != nil {
		t.Fatal(err)
	}
	u := utterance{mu: row.mu[:Fr*M], cond: make([]float32, Fr*M), noise: make([]float32, Fr*M), emb: emb}
	if u.emb == nil {
		u.emb = make([]float32, m.Flow.EmbeddingDim)
	}
	pf := len(cond) / M
	copy(u.cond, frameMajor(cond, M, pf))
	T := len(m.noise) / M
	for f := range Fr {
		copy(u.noise[f*M:(f+1)*M], m.noise[(f%T)*M:])
	}
	cf, err := newChunkFlow(m, fc.step)
	if err != nil {
		t.Fatal(err)
	}
	mel, err := cf.run(cf.newState(), u, Fr, true)
	if err != nil {
		t.Fatal(err)
	}
	return mel, len(prompt) * R
}

// speak runs one request and compares its chunks' mels with the whole chunk-masked run: every
// chunk but an early first one within float32 rounding. It returns the largest difference of the
// exact chunks and the first chunk's.
func speak(t *testing.T, e *Engine, log *melLog, req tts.Request, earlyFirst bool) (exact, first float64) {
	t.Helper()
	if err := e.Synthesize(context.Background(), req, func(tts.Chunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	chunks, tokens, voice := log.take()
	whole, P := wholeChunkRun(t, e, voice, tokens)
	M := e.p.m.Flow.MelBins
	Fr := len(whole) / M
	at := P
	for i, c := range chunks {
		n := len(c) / M
		want := make([]float32, 0, M*n)
		for ch := range M {
			want = append(want, whole[ch*Fr+at:ch*Fr+at+n]...)
		}
		d := float64(maxDiff(c, want))
		if i == 0 && earlyFirst {
			first = d
		} else {
			exact = max(exact, d)
			if d > 1e-4 {
				t.Errorf("chunk %d of %d (frames %d..%d): max |diff| %.3g against the whole chunk-masked run", i, len(chunks), at, at+n, d)
			}
		}
		at += n
	}
	if at != Fr {
		t.Fatalf("the chunks hold frames %d..%d, the utterance %d..%d", P, at, P, Fr)
	}
	return exact, first
}

const chunkText = "Hello world. This is voxmux, speaking through the chunk-causal flow."

// Streamed through the engine, every chunk after the first equals one run over the whole
// utterance under CosyVoice's streaming mask, and a second request in the same voice reads the
// voice's kept frames instead of computing them.
func TestChunkFlowEngineStreamsExactly(t *testing.T) {
	e, log := tinyChunkEngine(t, 1<<30, ChunkEmitEarly)
	exact, first := speak(t, e, log, tts.Request{Text: chunkText, Voice: "bench", Seed: 1}, true)
	t.Logf("default schedule: chunks after the first within %.2g of the whole run; the early first chunk %.3g", exact, first)
	if first == 0 {
		t.Error("the early first chunk equals the whole run's: it does not end inside its chunk")
	}
	pc := e.Report().PromptCache
	if pc.Misses != 1 || pc.Hits != 0 || pc.Voices != 1 || pc.Bytes == 0 {
		t.Fatalf("after one request: %+v, want one miss and one voice kept", pc)
	}
	speak(t, e, log, tts.Request{Text: "Another sentence, in the same voice.", Voice: "bench", Seed: 2}, true)
	if pc2 := e.Report().PromptCache; pc2.Misses != 1 || pc2.Hits != 1 || pc2.Bytes != pc.Bytes {
		t.Fatalf("after a second request in the voice: %+v, want one hit and nothing more computed", pc2)
	}
	// A voice without a prompt keeps nothing across requests.
	speak(t, e, log, tts.Request{Text: chunkText, Voice: "default", Seed: 3}, true)
	if pc3 := e.Report().PromptCache; pc3.Misses != 1 || pc3.Hits != 1 {
		t.Fatalf("after a request without a prompt: %+v", pc3)
	}
}

// With flow_chunk_emit: cosyvoice every chunk, the first included, equals the whole run.
func TestChunkFlowEngineCosyVoiceBoundaries(t *testing.T) {
	e, log := tinyChunkEngine(t, 1<<30, ChunkEmitCosyVoice)
	exact, _ := speak(t, e, log, tts.Request{Text: chunkText, Voice: "bench", Seed: 1}, false)
	t.Logf("CosyVoice's boundaries: every chunk within %.2g of the whole run", exact)
}

// A cache too small for a voice drops it once its request ends, and the next request computes it
// again; a voice whose content changed under the same use (a library voice deleted and made
// again) is a new entry, never the old one's frames.
func TestChunkFlowPromptCacheEvictsAndChangedVoice(t *testing.T) {
	e, log := tinyChunkEngine(t, 1, ChunkEmitEarly)
	req := tts.Request{Text: chunkText, Voice: "bench", Seed: 1}
	speak(t, e, log, req, true)
	speak(t, e, log, req, true)
	pc := e.Report().PromptCache
	if pc.Misses != 2 || pc.Hits != 0 || pc.Evictions != 2 || pc.Bytes != 0 || pc.Voices != 0 {
		t.Fatalf("a 1-byte cache after two requests: %+v, want two misses, two evictions, nothing kept", pc)
	}

	e, log = tinyChunkEngine(t, 1<<30, ChunkEmitEarly)
	v := e.p.m.voice("bench")
	M := e.p.m.Flow.MelBins
	prompt := func(scale float32) *tts.VoicePrompt {
		mel := frameMajor(v.Mel, M, len(v.Mel)/M)
		for i := range mel {
			mel[i] *= scale
		}
		return &tts.VoicePrompt{Text: v.Text, SpeechTokens: v.SpeechTokens, Mel: mel, MelBins: M, Embedding: v.Embedding}
	}
	speak(t, e, log, tts.Request{Text: chunkText, Prompt: prompt(1), Seed: 1}, true)
	// The same name's voice, made again from another clip: its own frames, exact against its own
	// whole run (speak compares with the changed voice's).
	speak(t, e, log, tts.Request{Text: chunkText, Prompt: prompt(0.5), Seed: 1}, true)
	if pc := e.Report().PromptCache; pc.Misses != 2 || pc.Hits != 0 || pc.Voices != 2 {
		t.Fatalf("a changed voice: %+v, want a second miss", pc)
	}
	speak(t, e, log, tts.Request{Text: chunkText, Prompt: prompt(1), Seed: 1}, true)
	if pc := e.Report().PromptCache; pc.Hits != 1 {
		t.Fatalf("the first voice again: %+v, want a hit", pc)
	}
}

// Under a flow_kv_memory_mb too small for the requests at once, every one of many concurrent
// streams completes with the mel it has alone in an unbounded engine: batches wait for memory
// and streams give up their kept frames and compute them again, and the memory in use never
// passes the bound.
func TestChunkFlowMemoryBound(t *testing.T) {
	texts := []string{chunkText, "Another sentence, in the same voice.", "A third one, somewhat longer than the second, to keep more chunks.",
		"Short.", "The fifth request speaks of memory, and of waiting for it.", "Six streams at once."}
	run := func(limit int64) (map[uint64][]float32, tts.FlowMemoryStats, tts.PromptCacheStats) {
		e, _ := tinyChunkEngine(t, 1<<30, ChunkEmitEarly)
		if limit > 0 {
			e.p.flowMem.limit = limit
		}
		var mu sync.Mutex
		mels := map[uint64][]float32{}
		M := e.p.m.Flow.MelBins
		e.onMel = func(s *stream, mel []float32, last bool) {
			mu.Lock()
			defer mu.Unlock()
			// Frame-major, so that chunks append.
			mels[s.req.Seed] = append(mels[s.req.Seed], frameMajor(mel, M, len(mel)/M)...)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(texts))
		for i, text := range texts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = e.Synthesize(context.Background(), tts.Request{Text: text, Voice: "bench", Seed: uint64(i + 1)}, func(tts.Chunk) error { return nil })
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("limit %d, request %d: %v", limit, i, err)
			}
		}
		r := e.Report()
		return mels, r.FlowMemory, r.PromptCache
	}
	want, free, _ := run(0)
	if free.Peak == 0 || free.Waits != 0 || free.Preemptions != 0 {
		t.Fatalf("unbounded: %+v", free)
	}
	// One stream's worth: the requests must take turns.
	e, _ := tinyChunkEngine(t, 1<<30, ChunkEmitEarly)
	one := tinyPeak(t, e, texts[2])
	got, fm, pc := run(one)
	t.Logf("unbounded peak %d bytes; bound %d: %+v", free.Peak, one, fm)
	if fm.Peak > fm.Limit || fm.Limit != one {
		t.Errorf("peak %d bytes under a bound of %d", fm.Peak, fm.Limit)
	}
	if fm.Waits == 0 || fm.Preemptions == 0 {
		t.Errorf("under a bound of one stream no batch waited for memory or no stream gave up its frames: %+v", fm)
	}
	if fm.Bytes != pc.Bytes {
		t.Errorf("after every request: %d bytes in use, the prompt cache's %d", fm.Bytes, pc.Bytes)
	}
	for seed, w := range want {
		if d := maxDiff(got[seed], w); len(got[seed]) != len(w) || d > 1e-4 {
			t.Errorf("request %d: %d values, max |diff| %.3g against the unbounded run's %d", seed, len(got[seed]), d, len(w))
		}
	}
}

// tinyPeak is the most flow memory one request of text takes alone.
func tinyPeak(t *testing.T, e *Engine, text string) int64 {
	t.Helper()
	if err := e.Synthesize(context.Background(), tts.Request{Text: text, Voice: "bench", Seed: 9}, func(tts.Chunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return e.Report().FlowMemory.Peak
}

// A flow run's copies between host and device memory and its waits for the device do not grow
// with its Euler steps: each step's x window is laid out from device memory, and the steps are
// queued without waiting in between.
func TestChunkFlowRunIODoesNotGrowWithSteps(t *testing.T) {
	e, _ := tinyChunkEngine(t, 1<<30, ChunkEmitEarly)
	fc := e.p.flows[0].(*flowChunks)
	steps := fc.m.Flow.Steps
	few, many := chunkRunIO(t, fc, 2), chunkRunIO(t, fc, steps)
	t.Logf("per run, 2 steps: %+v; %d steps: %+v", few, steps, many)
	if !slices.Equal(few, many) {
		t.Errorf("host-device copies and waits per run: %+v at 2 Euler steps, %+v at %d", few, many, steps)
	}
	for _, io := range many {
		if io.syncs >= steps || io.transfers >= steps {
			t.Errorf("%+v in a run of %d steps", io, steps)
		}
	}
}

// chunkRunIO runs two chunks of one stream through fc at the given number of Euler steps (the
// second reads the first's keys, values and context samples) and returns each run's copies
// between host and device memory and waits.
func chunkRunIO(t *testing.T, fc *flowChunks, steps int) []chunkIO {
	t.Helper()
	f := fc.m.Flow
	F, R := f.ChunkFrames, f.FramesPerToken
	toks := make([]int64, 2*F/R+8)
	for i := range toks {
		toks[i] = int64(1 + i%40)
	}
	emb := make([]float32, f.EmbeddingDim)
	m := *fc.m
	m.Flow.Steps = steps
	c := *fc
	c.m = &m
	st := &chunkKV{}
	defer st.close()
	var got []chunkIO
	for _, end := range []int{F, 2 * F} {
		from := m.chunkTokFrom(st.done())
		row := &chunkRow{st: st, end: end, keep: end - st.done(), tokens: toks[from:], tokFrom: from, emb: emb}
		if _, err := c.compute([]*chunkRow{row}, nil, nil); err != nil {
			t.Fatal(err)
		}
		got = append(got, c.last)
	}
	return got
}
