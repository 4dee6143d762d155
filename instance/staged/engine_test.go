package staged

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// ortLibrary finds the ONNX Runtime library that `make test` installs.
func ortLibrary(t testing.TB) string {
	t.Helper()
	p, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tinyPipeline loads models/tiny; the engine that gets it closes it.
func tinyPipeline(t testing.TB) *Pipeline {
	t.Helper()
	p, err := loadTiny(t, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// loadTiny loads models/tiny on the CPU with the given engine options.
func loadTiny(t testing.TB, opts Options) (*Pipeline, error) {
	return LoadPipeline(tts.LoadConfig{Manifest: "../../models/tiny/pipeline.yaml", Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, opts)})
}

func synth(t *testing.T, e *Engine, req tts.Request) []float32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pcm []float32
	next := 0
	err := e.Synthesize(ctx, req, func(c tts.Chunk) error {
		if c.Index != next {
			t.Errorf("chunk %d arrived as number %d", c.Index, next)
		}
		next++
		if c.SampleRate != 24000 {
			t.Errorf("sample rate %d, want 24000", c.SampleRate)
		}
		pcm = append(pcm, c.PCM...)
		return nil
	})
	if err != nil {
		t.Fatalf("synthesize %q: %v", req.Text, err)
	}
	return pcm
}

// synthEach synthesizes each request alone, one after the other.
func synthEach(t *testing.T, e *Engine, reqs []tts.Request) [][]float32 {
	out := make([][]float32, len(reqs))
	for i, r := range reqs {
		out[i] = synth(t, e, r)
	}
	return out
}

// synthTogether synthesizes every request at once, so the engine batches them.
func synthTogether(t *testing.T, e *Engine, reqs []tts.Request) [][]float32 {
	out := make([][]float32, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = synth(t, e, r)
		}()
	}
	wg.Wait()
	return out
}

func TestEngineLengthFollowsTokenBounds(t *testing.T) {
	p := tinyPipeline(t)
	e := NewEngine(p)
	defer e.Close()
	text := "Hello world."
	pcm := synth(t, e, tts.Request{Text: text})
	minTok, maxTok := p.m.TokenBounds(text, len(p.m.Tokenize(text))-2)
	perTok := p.m.Flow.FramesPerToken * p.m.Vocoder.Hop
	if len(pcm)%perTok != 0 {
		t.Fatalf("%d samples is not a whole number of tokens (%d samples each)", len(pcm), perTok)
	}
	if n := len(pcm) / perTok; n < minTok || n > maxTok {
		t.Fatalf("%d speech tokens, want %d..%d", n, minTok, maxTok)
	}
	for _, st := range e.Stats() {
		if st.Batches == 0 || st.Items < st.Batches || st.Busy <= 0 {
			t.Errorf("stage %s: %+v", st.Stage, st)
		}
	}
	var sum float64
	for _, v := range pcm {
		if math.IsNaN(float64(v)) || v < -1 || v > 1 {
			t.Fatalf("sample %v out of [-1,1]", v)
		}
		sum += float64(v) * float64(v)
	}
	if rms := math.Sqrt(sum / float64(len(pcm))); rms < 1e-3 {
		t.Fatalf("audio is silent (rms %g)", rms)
	}
}

// Batched runs must give the audio each request gives alone: every stage masks its padding and a
// request's chunk schedule and noise are its own. Tolerance: 1e-4 per sample (float32 kernels may
// sum in another order at another batch size).
func TestEngineBatchedEqualsAlone(t *testing.T) { testBatchedEqualsAlone(t, tinyPipeline(t), 0) }

// Small frame budgets split the flow and vocoder work into many batches, putting first chunks
// ahead: the audio must not change.
func TestEngineSmallBatchesEqualAlone(t *testing.T) { testBatchedEqualsAlone(t, tinyPipeline(t), 40) }

// Several flow workers run batches at once, each in its own sessions, while batches of later
// chunks leave one worker to first chunks: the audio must not change.
func TestEngineFlowWorkersEqualAlone(t *testing.T) {
	p, err := loadTiny(t, Options{FlowWorkers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.flows) != 3 || p.flows[0] == p.flows[1] {
		t.Fatalf("%d flow workers, want 3 with their own sessions", len(p.flows))
	}
	testBatchedEqualsAlone(t, p, 40)
}

// flow_first_worker share lets batches of later chunks take every flow worker: the audio must
// not change either; an unknown value fails the load with the key.
func TestEngineFlowWorkersSharedEqualAlone(t *testing.T) {
	if _, err := loadTiny(t, Options{FlowFirstWorker: "none"}); err == nil ||
		!strings.Contains(err.Error(), `engine.flow_first_worker: "none" is not one of [keep share]`) {
		t.Errorf("flow_first_worker none: %v", err)
	}
	p, err := loadTiny(t, Options{FlowWorkers: 2, FlowFirstWorker: "share"})
	if err != nil {
		t.Fatal(err)
	}
	if !p.opt.flowShare {
		t.Fatal("flow_first_worker share did not reach the engine")
	}
	testBatchedEqualsAlone(t, p, 40)
}

// The vocoder's fixed-shape sessions (vocoder_batches) pad every chunk to the next length the
// engine makes and every batch to a fixed size: the audio must be what the one-session vocoder gives.
func TestEngineFixedVocoderShapes(t *testing.T) {
	p, err := loadTiny(t, Options{VocoderBatches: []int{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	// Chunks of 10, 25, 50 tokens, 2 frames each, after up to 4 tokens of context: 20 frames,
	// 50 + 8, 100 + 8, and again 100 + 8.
	if got, want := fmt.Sprint(p.voc.batches, p.voc.frames), "[1 2] [20 58 108]"; got != want {
		t.Fatalf("fixed vocoder batches and frames %s, want %s", got, want)
	}
	if len(p.voc.fixed) != 2 || len(p.voc.fixed[0]) != 3 || len(p.voc.fixed[1]) != 3 {
		t.Fatalf("fixed sessions %d × %d, want 2 × 3", len(p.voc.fixed), len(p.voc.fixed[0]))
	}
	// A batch's items are split over the fixed sessions and come back in order: items within the
	// shortest length, items that need the middle one, the longest, and over it (the session that
	// takes any shape). (Before the engine runs: closing it closes p.)
	for _, lens := range [][]int{{20, 7, 13}, {10, 17, 24, 31, 38}, {108, 60}, {120, 5}} {
		vocoderMatchesOneSession(t, p, lens, "from the fixed sessions")
	}
	dyn := NewEngine(tinyPipeline(t))
	defer dyn.Close()
	sameAudio(t, dyn, testBatchedEqualsAlone(t, p, 40), "fixed vocoder shapes against one session")
}

// vocoderMatchesOneSession runs a batch of items of lens frames through p's vocoder and checks
// each item's audio against the item run whole and alone in the session that takes any shape:
// the same length and samples within 1e-4. how says how the batch ran, for the failure.
func vocoderMatchesOneSession(t *testing.T, p *Pipeline, lens []int, how string) {
	t.Helper()
	mels := make([][]float32, len(lens))
	for i, n := range lens {
		mels[i] = make([]float32, 80*n)
		for j := range mels[i] {
			mels[i][j] = float32((j*(i+3))%17)/17 - 0.5
		}
	}
	got, err := p.voc.run(mels)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range mels {
		one, err := p.voc.runOn(p.voc.sess, [][]float32{m}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got[i]) != len(one[0]) {
			t.Fatalf("items of %v frames, item %d: %d samples, want %d", lens, i, len(got[i]), len(one[0]))
		}
		for j := range one[0] {
			if d := math.Abs(float64(got[i][j] - one[0][j])); d > 1e-4 {
				t.Fatalf("items of %v frames, item %d sample %d: %g %s, %g alone", lens, i, j, got[i][j], how, one[0][j])
			}
		}
	}
}

// sameAudio checks that got holds, for each of batchRequests, the audio e gives it: the same
// length and samples within 1e-4 (float32 kernels may sum in another order at another shape).
func sameAudio(t *testing.T, e *Engine, got [][]float32, what string) {
	t.Helper()
	for i, r := range batchRequests {
		want := synth(t, e, r)
		if len(want) != len(got[i]) {
			t.Fatalf("%q, %s: %d samples, want %d", r.Text, what, len(got[i]), len(want))
		}
		var worst float64
		for j := range want {
			worst = max(worst, math.Abs(float64(want[j]-got[i][j])))
		}
		if worst > 1e-4 {
			t.Errorf("%q, %s: differs by %g", r.Text, what, worst)
		}
	}
}

func TestVocoderBatchesOption(t *testing.T) {
	for _, v := range [][]int{{0}, {4, 2}, {1, 1}} {
		_, err := loadTiny(t, Options{VocoderBatches: v})
		if err == nil || !strings.Contains(err.Error(), "vocoder_batches") {
			t.Errorf("vocoder_batches %v: err %v, want one naming the option", v, err)
		}
	}
	p, err := loadTiny(t, Options{VocoderBatches: []int{}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if len(p.voc.fixed) != 0 {
		t.Errorf("vocoder_batches off: %d fixed sessions", len(p.voc.fixed))
	}
}

var batchRequests = []tts.Request{
	{Text: "Hello world.", Seed: 1},
	{Text: "A somewhat longer sentence, to be spoken while others run.", Seed: 2},
	{Text: "¿Dónde está la biblioteca?", Seed: 3},
	{Text: "你好，世界。", Seed: 4},
	{Text: "Hi", Seed: 5},
}

// testBatchedEqualsAlone serves the requests one by one and then all at once on p, checks the
// audio is the same, and returns it.
func testBatchedEqualsAlone(t *testing.T, p *Pipeline, budget int) [][]float32 {
	var e *Engine
	if budget > 0 {
		e = newEngine(p, budget, budget)
	} else {
		e = NewEngine(p)
	}
	defer e.Close()
	reqs := batchRequests
	alone := synthEach(t, e, reqs)
	batched := synthTogether(t, e, reqs)
	for i := range reqs {
		if len(alone[i]) != len(batched[i]) {
			t.Fatalf("%q: %d samples alone, %d batched", reqs[i].Text, len(alone[i]), len(batched[i]))
		}
		var worst float64
		for j := range alone[i] {
			worst = max(worst, math.Abs(float64(alone[i][j]-batched[i][j])))
		}
		if worst > 1e-4 {
			t.Errorf("%q: batched differs from alone by %g", reqs[i].Text, worst)
		}
		t.Logf("%q: %d samples, max diff %g", reqs[i].Text, len(alone[i]), worst)
	}
	return alone
}

func TestEngineCancel(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	defer e.Close()
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err := e.Synthesize(ctx, tts.Request{Text: "This request is cancelled after its first chunk arrives."}, func(tts.Chunk) error {
		n++
		cancel()
		return nil
	})
	if err == nil || n != 1 {
		t.Fatalf("got err %v after %d chunks, want a cancellation after 1", err, n)
	}
	// The engine still serves others.
	if pcm := synth(t, e, tts.Request{Text: "still alive"}); len(pcm) == 0 {
		t.Fatal("no audio after a cancellation")
	}
}

// The stage counters count what ran: one prefill item per request, one flow and one vocoder item
// per chunk, and batches that carry at least one item each.
func TestEngineStats(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	defer e.Close()
	texts := []string{"Hello world.", "A somewhat longer sentence, to be spoken while others run.", "Hi there"}
	var mu sync.Mutex
	chunks := 0
	var wg sync.WaitGroup
	for _, text := range texts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := e.Synthesize(ctx, tts.Request{Text: text}, func(tts.Chunk) error {
				mu.Lock()
				chunks++
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got := map[string]tts.StageStats{}
	for _, s := range e.Stats() {
		got[s.Stage] = s
		if s.Batches == 0 || s.Items < s.Batches {
			t.Errorf("%s: %d batches carrying %d items", s.Stage, s.Batches, s.Items)
		}
	}
	if got["lm_prefill"].Items != uint64(len(texts)) {
		t.Errorf("lm_prefill items %d, want one per request (%d)", got["lm_prefill"].Items, len(texts))
	}
	if got["flow"].Items != uint64(chunks) || got["vocoder"].Items != uint64(chunks) {
		t.Errorf("flow %d and vocoder %d items, want one per chunk (%d)", got["flow"].Items, got["vocoder"].Items, chunks)
	}
	// Every prompt, chunk and mel waits a moment at least between its queue and its run; the
	// decode steps have no queue.
	for _, st := range []string{"lm_prefill", "flow", "vocoder"} {
		if got[st].Wait <= 0 {
			t.Errorf("%s: waited %v in all, want more than nothing", st, got[st].Wait)
		}
	}
	if w := got["lm_decode"].Wait; w != 0 {
		t.Errorf("lm_decode: waited %v, want 0", w)
	}
	t.Logf("%+v", e.Stats())
}

// Flow lanes: batches of later chunks hold all workers but one, which first chunks take; a
// stream with a chunk under way waits; a single worker takes any batch.
func TestFlowLanes(t *testing.T) {
	a, b, c, d := &stream{}, &stream{}, &stream{}, &stream{}
	item := func(s *stream, tokens int, first bool) *flowItem {
		return &flowItem{s: s, tokens: make([]int64, tokens), first: first}
	}
	start := func(l *flowLanes, items []*flowItem) (*flowRun, []*flowItem) {
		t.Helper()
		take, rest, w := l.admit(items)
		if len(take) == 0 {
			return nil, rest
		}
		if w < 0 || l.runs[w] != nil {
			t.Fatalf("batch started on worker %d, runs %v", w, l.runs)
		}
		r := &flowRun{items: take, worker: w}
		l.add(r)
		return r, rest
	}
	l := newFlowLanes(2, 1000, 1.3, 2, nil, nil)
	// Idle: later chunks start a bulk batch.
	a1, b1 := item(a, 40, false), item(b, 40, false)
	bulk, rest := start(l, []*flowItem{a1, b1})
	if bulk == nil || len(bulk.items) != 2 || len(rest) != 0 {
		t.Fatalf("idle: bulk %v, rest %d", bulk, len(rest))
	}
	// A later chunk of a busy stream, another later chunk and two first chunks arrive: only the
	// first chunks start, on the last worker; the rest wait in order.
	a2, c0, x1, d0 := item(a, 40, false), item(c, 8, true), item(&stream{}, 40, false), item(d, 8, true)
	urgent, rest := start(l, []*flowItem{a2, c0, x1, d0})
	if urgent == nil || len(urgent.items) != 2 || urgent.items[0] != c0 || urgent.items[1] != d0 || urgent.worker == bulk.worker {
		t.Fatalf("urgent batch %+v", urgent)
	}
	if len(rest) != 2 || rest[0] != a2 || rest[1] != x1 {
		t.Fatalf("urgent rest %v", rest)
	}
	// Every worker busy: nothing starts.
	if take, _, w := l.admit([]*flowItem{item(&stream{}, 8, true)}); len(take) != 0 || w != -1 {
		t.Fatal("a batch started with every worker busy")
	}
	// The urgent batch ends; the bulk batch still holds all workers but one, so later chunks
	// wait and a first chunk starts.
	l.remove(urgent)
	if l.busy[c] || !l.busy[a] {
		t.Fatal("streams' busy marks wrong after the urgent batch")
	}
	e0 := item(&stream{}, 8, true)
	r, rest := start(l, []*flowItem{a2, x1, e0})
	if r == nil || len(r.items) != 1 || r.items[0] != e0 || len(rest) != 2 {
		t.Fatalf("with one worker free, got %+v, rest %d", r, len(rest))
	}
	l.remove(r)
	// Once the bulk batch is done, a's next chunk may run, with x1.
	l.remove(bulk)
	if all, _ := l.running(); all != 0 || l.busy[a] {
		t.Fatal("lanes not idle after every batch")
	}
	if r, _ := start(l, []*flowItem{a2, x1}); r == nil || len(r.items) != 2 {
		t.Fatal("a's next chunk waits with nothing under way")
	}
	// Shared workers: a second bulk batch takes the last worker.
	ls := newFlowLanes(2, 1000, 1.3, 2, nil, nil)
	ls.share = true
	for i := 0; i < 2; i++ {
		if r, _ := start(ls, []*flowItem{item(&stream{}, 40, false)}); r == nil {
			t.Fatalf("shared workers: bulk batch %d did not start", i+1)
		}
	}
	// Three workers: two bulk batches at once.
	l3 := newFlowLanes(3, 1000, 1.3, 2, nil, nil)
	for i := 0; i < 2; i++ {
		if r, _ := start(l3, []*flowItem{item(&stream{}, 40, false)}); r == nil {
			t.Fatalf("bulk batch %d did not start on three workers", i+1)
		}
	}
	if r, _ := start(l3, []*flowItem{item(&stream{}, 40, false)}); r != nil {
		t.Fatal("a third bulk batch took the last worker")
	}
	// One worker takes any batch.
	l1 := newFlowLanes(1, 1000, 1.3, 2, nil, nil)
	if r, _ := start(l1, []*flowItem{item(&stream{}, 40, false)}); r == nil {
		t.Fatal("one worker: later chunks did not start")
	}
}

// Each request's first audio is recorded once, its parts adding up to no more than the time the
// request took; the summary names every part.
func TestFirstAudio(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	defer e.Close()
	t0 := time.Now()
	synth(t, e, tts.Request{Text: "A sentence long enough for a few chunks of speech.", Seed: 1})
	synth(t, e, tts.Request{Text: "Hi", Seed: 2})
	took := time.Since(t0)
	fa := e.FirstAudio()
	if len(fa) != 2 {
		t.Fatalf("%d first audios recorded, want 2", len(fa))
	}
	for _, f := range fa {
		sum := f.Prefill + f.Decode + f.Flow + f.Vocoder
		if f.Prefill <= 0 || f.Decode < 0 || f.Flow <= 0 || f.Vocoder <= 0 || sum > took {
			t.Fatalf("first audio %+v (sum %v, requests took %v)", f, sum, took)
		}
	}
	if len(e.FirstAudio()) != 0 {
		t.Fatal("FirstAudio does not drain")
	}
	s := firstAudioSummary(fa)
	for _, part := range []string{"n=2", "total=", "prefill=", "decode=", "flow=", "vocoder="} {
		if !strings.Contains(s, part) {
			t.Fatalf("summary %q lacks %q", s, part)
		}
	}
}

// A burst of arrivals runs as prefills of at most the decoder's prepared batch size, each of
// prompts of similar length, and every stream is in exactly one of them.
func TestPrefillGroups(t *testing.T) {
	lens := []int{30, 5, 200, 17, 5, 90, 31, 64, 12, 150, 7}
	var fresh []*stream
	for _, n := range lens {
		fresh = append(fresh, &stream{prompt: make([]int64, n)})
	}
	groups := prefillGroups(fresh, 4, 0)
	if len(groups) != 3 {
		t.Fatalf("%d groups, want 3 (11 prompts, 4 a group)", len(groups))
	}
	seen := map[*stream]bool{}
	last := 0
	for _, g := range groups {
		if len(g) > 4 {
			t.Errorf("a group of %d prompts, want at most 4", len(g))
		}
		for _, s := range g {
			if len(s.prompt) < last {
				t.Errorf("prompt of %d tokens after one of %d: groups not by length", len(s.prompt), last)
			}
			last = len(s.prompt)
			seen[s] = true
		}
	}
	if len(seen) != len(fresh) {
		t.Errorf("%d streams in the groups, want %d", len(seen), len(fresh))
	}
	if g := prefillGroups(fresh, 0, 0); len(g) != 1 || len(g[0]) != len(fresh) {
		t.Errorf("n=0: %d groups, want one of every stream", len(g))
	}
	for i, s := range fresh {
		if len(s.prompt) != lens[i] {
			t.Fatalf("prefillGroups reordered its argument")
		}
	}
	if g := prefillGroups(nil, 8, 0); g != nil {
		t.Errorf("no streams: %d groups", len(g))
	}
	// With a bound of 200 tokens a group costs at most 200² = 40000: prompts of 200 go alone,
	// those of up to 100 four at a time, and a prompt never waits for want of company.
	lens = []int{200, 100, 100, 100, 100, 100, 90, 10, 10, 200}
	fresh = fresh[:0]
	for _, n := range lens {
		fresh = append(fresh, &stream{prompt: make([]int64, n)})
	}
	var sizes []int
	for _, g := range prefillGroups(fresh, 8, 200) {
		longest := len(g[len(g)-1].prompt)
		if len(g) > 1 && len(g)*longest*longest > 200*200 {
			t.Errorf("a group of %d prompts of up to %d tokens passes 200²", len(g), longest)
		}
		sizes = append(sizes, len(g))
	}
	if want := []int{4, 4, 1, 1}; !slices.Equal(sizes, want) {
		t.Errorf("group sizes %v, want %v", sizes, want)
	}
}

// The benchmark model's schedule: a first chunk of 8 tokens is vocoded as 16 frames, not padded
// to the longest item (232).
func TestVocoderFrames(t *testing.T) {
	var m Manifest
	m.Flow.FramesPerToken = 2
	m.Streaming.ChunkTokens = []int{8, 25, 50, 100}
	m.Streaming.ContextTokens = 16
	if got, want := fmt.Sprint(vocoderFrames(&m)), "[16 66 132 232]"; got != want {
		t.Errorf("vocoder lengths %s, want %s", got, want)
	}
	m.Streaming.ChunkTokens = []int{40}
	if got, want := fmt.Sprint(vocoderFrames(&m)), "[80 112]"; got != want {
		t.Errorf("one chunk size: vocoder lengths %s, want %s", got, want)
	}
}

func TestVocoderWindows(t *testing.T) {
	for _, c := range []struct {
		n, w, ctx int
		want      string
	}{
		{100, 132, 32, "[[0 100]] [0]"},
		{132, 132, 32, "[[0 132]] [0]"},
		{232, 132, 32, "[[0 132] [100 232]] [0 32]"},
		{300, 132, 32, "[[0 132] [100 232] [200 300]] [0 32 32]"},
		{50, 20, 20, "[[0 50]] [0]"}, // a window no longer than its context: never split
	} {
		windows, keep := vocoderWindows(c.n, c.w, c.ctx)
		if got := fmt.Sprint(windows, keep); got != c.want {
			t.Errorf("%d frames in windows of %d after %d: %s, want %s", c.n, c.w, c.ctx, got, c.want)
		}
	}
	// Whatever the sizes, the kept parts tile the item, and each window is at most w frames with
	// ctx frames before its kept part.
	for n := 1; n < 120; n++ {
		for w := 9; w < 40; w += 3 {
			windows, keep := vocoderWindows(n, w, 8)
			at := 0
			for i, win := range windows {
				if win[1]-win[0] > w || (i > 0 && keep[i] != 8) || win[0]+keep[i] != at {
					t.Fatalf("%d frames, window %d: %v keep %v", n, w, windows, keep)
				}
				at = win[1]
			}
			if at != n {
				t.Fatalf("%d frames, window %d: %v ends at %d", n, w, windows, at)
			}
		}
	}
	if got := defaultVocoderWindow([]int{16, 66, 132, 232}); got != 132 {
		t.Errorf("default window for the benchmark model's lengths: %d, want 132", got)
	}
}

// A vocoder window (vocoder_window) runs long items as overlapping windows after the manifest's
// context: the audio must be the whole item's.
func TestEngineVocoderWindow(t *testing.T) {
	for _, v := range []int{8, -2} { // the tiny model's context is 4 tokens of 2 frames
		if _, err := loadTiny(t, Options{VocoderWindow: v}); err == nil || !strings.Contains(err.Error(), "vocoder_window") {
			t.Errorf("vocoder_window %d: err %v, want one naming the option", v, err)
		}
	}
	// A manifest without context cannot have windows that keep the audio.
	m := tinyManifest(t)
	m.Streaming.ContextTokens = 0
	if _, err := loadPipeline(m, tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, Options{VocoderWindow: 20})}, 0, 0); err == nil || !strings.Contains(err.Error(), "no left context") {
		t.Errorf("vocoder_window without context: err %v, want one saying the manifest has none", err)
	}
	p, err := loadTiny(t, Options{VocoderBatches: []int{1, 2}, VocoderWindow: 20})
	if err != nil {
		t.Fatal(err)
	}
	// Items run at most 20 frames long, so the fixed lengths stop there.
	if got, want := fmt.Sprint(p.voc.window, p.voc.ctx, p.voc.frames), "20 8 [20]"; got != want {
		t.Fatalf("window, context and fixed lengths %s, want %s", got, want)
	}
	for _, lens := range [][]int{{108, 20, 7}, {58, 21}, {13}} {
		vocoderMatchesOneSession(t, p, lens, "in windows")
	}
	dyn := NewEngine(tinyPipeline(t))
	defer dyn.Close()
	sameAudio(t, dyn, testBatchedEqualsAlone(t, p, 40), "vocoder windows against whole items")
}
