package staged

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// Chunks leave for the flow with the voice's prompt tokens first, their left context, and, but
// for the last, the look-ahead tokens after them: a chunk is cut once they are decoded, or, at
// the end of speech, with as many as there are.
func TestChunksCarryPromptAndLookahead(t *testing.T) {
	m := &Manifest{Flow: FlowSpec{FramesPerToken: 2, LookaheadTokens: 3}, LM: LMSpec{SpeechVocab: 100},
		Streaming: StreamingSpec{ChunkTokens: []int{4, 6}, ContextTokens: 2}}
	e := &Engine{p: &Pipeline{m: m}, flowQ: engine.NewQueue[*flowItem](), tokensPerRune: 3}
	s := &stream{ctx: context.Background(), req: tts.Request{Text: "some text"}, textTo: 9, maxTok: 100, lmDone: make(chan struct{}),
		voice: &Voice{SpeechTokens: []int64{90, 91}}}
	var got []string
	pop := func() {
		items, _ := e.flowQ.TryPopAll()
		for _, it := range items {
			got = append(got, fmt.Sprintf("at %d: %v prompt %d ctx %d ahead %d from %d last %v",
				len(s.tokens), it.tokens, it.prompt, it.ctxTokens, it.lookahead, it.firstToken, it.last))
		}
	}
	for tok := range 17 { // token k is k
		if !e.advance(s, tok) {
			t.Fatal("left the LM early")
		}
		pop()
	}
	if e.advance(s, m.LM.SpeechVocab) { // end of speech
		t.Fatal("still in the LM after end of speech")
	}
	pop()
	want := []string{
		"at 7: [90 91 0 1 2 3 4 5 6] prompt 2 ctx 0 ahead 3 from 0 last false",
		"at 13: [90 91 2 3 4 5 6 7 8 9 10 11 12] prompt 2 ctx 2 ahead 3 from 2 last false",
		"at 17: [90 91 8 9 10 11 12 13 14 15 16] prompt 2 ctx 2 ahead 1 from 8 last false",
		"at 17: [90 91 14 15 16] prompt 2 ctx 2 ahead 0 from 14 last true",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("chunks:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Without look-ahead a chunk leaves as soon as one more token follows it (as always).
	if start, la := chunkInput(&Manifest{Streaming: StreamingSpec{ContextTokens: 2}}, 4, 10, 11, false); start != 2 || la != 0 {
		t.Fatalf("chunkInput without look-ahead: %d, %d", start, la)
	}
}

// A flow batch: the token mask covers every token, look-ahead included; the frame mask covers the
// prompt's, context's and chunk's frames, not the look-ahead's or padding; cond holds the
// prompt's mel in the first frames and zeros after; embedding a row per job.
func TestFlowJobLayout(t *testing.T) {
	m := &Manifest{Flow: FlowSpec{MelBins: 2, FramesPerToken: 2, EmbeddingDim: 3}}
	jobs := []flowJob{
		{tokens: []int64{7, 8, 1, 2, 3}, noise: seq(2*10, 1), prompt: 2, lookahead: 1,
			cond: []float32{10, 11, 12, 13, 20, 21, 22, 23}, embedding: []float32{1, 2, 3}},
		{tokens: []int64{4, 5}, noise: seq(2*4, 100), embedding: []float32{4, 5, 6}},
	}
	B, N := 3, 6
	F := N * 2
	toks, tmask, fmask, x := paddedJobs(m, jobs, B, N)
	if !slices.Equal(toks[:N], []int64{7, 8, 1, 2, 3, 0}) || !slices.Equal(toks[N:2*N], []int64{4, 5, 0, 0, 0, 0}) {
		t.Fatalf("tokens %v", toks)
	}
	if !slices.Equal(tmask, []float32{1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("token mask %v", tmask)
	}
	wantMask := make([]float32, B*F)
	for f := range 8 { // 4 tokens of 2 frames; the look-ahead token's 2 frames masked
		wantMask[f] = 1
	}
	for f := range 4 {
		wantMask[F+f] = 1
	}
	if !slices.Equal(fmask, wantMask) {
		t.Fatalf("frame mask %v, want %v", fmask, wantMask)
	}
	// The noise covers every frame the encoder gives mu for, look-ahead frames too.
	if x[9] != 10 || x[F+0] != 11 || x[(2+1)*F+3] != 107 || x[(2+1)*F+4] != 0 {
		t.Fatalf("noise laid out wrong: %v", x[:2*F])
	}
	cond, emb := paddedCond(m, jobs, B, F)
	wantCond := make([]float32, B*2*F)
	copy(wantCond[0:], []float32{10, 11, 12, 13})
	copy(wantCond[F:], []float32{20, 21, 22, 23})
	if !slices.Equal(cond, wantCond) || !slices.Equal(emb, []float32{1, 2, 3, 4, 5, 6, 0, 0, 0}) {
		t.Fatalf("cond %v, embedding %v", cond, emb)
	}
	// The flow returns the frames before the look-ahead: the prompt's, context's and chunk's.
	if fr := jobFrames(m, jobs); !slices.Equal(fr, []int{8, 4}) {
		t.Fatalf("frames returned %v, want [8 4]", fr)
	}
	mels := jobMels(m, jobFrames(m, jobs), x, F)
	if len(mels[0]) != 2*8 || mels[0][8] != 11 || len(mels[1]) != 2*4 || mels[1][4] != 104 {
		t.Fatalf("mels %v", mels)
	}
}

// seq is n values from first, counting up.
func seq(n int, first float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = first + float32(i)
	}
	return out
}

// flow.noise: window frame p < prompt takes table frame p; a later one takes table frame prompt +
// its frame in the stream; both mod the table's length. Without a table, a window without a
// prompt has the seeded noise it always had, and one with a prompt the same noise after it.
func TestFlowNoise(t *testing.T) {
	m := &Manifest{Flow: FlowSpec{MelBins: 2}}
	p := &Pipeline{m: m}
	m.noise = []float32{0, 100, 1, 101, 2, 102, 3, 103, 4, 104} // 5 frames, frame-major
	got := p.flowNoise(9, 2, 6, 10)                             // prompt 2, stream frames 6..9
	// Frames: 0, 1, then 2+6=8, 9, 10, 11 mod 5 = 3, 4, 0, 1.
	want := []float32{0, 1, 3, 4, 0, 1, 100, 101, 103, 104, 100, 101}
	if !slices.Equal(got, want) {
		t.Fatalf("table noise %v, want %v", got, want)
	}
	m.noise = nil
	if got, want := p.flowNoise(9, 0, 6, 10), p.noise(9, 6, 10); !slices.Equal(got, want) {
		t.Fatal("seeded noise without a prompt changed")
	}
	got = p.flowNoise(9, 3, 6, 10)
	stream := p.noise(9, 6, 10)
	for c := range 2 {
		if !slices.Equal(got[c*7+3:(c+1)*7], stream[c*4:(c+1)*4]) {
			t.Fatalf("bin %d: the stream's frames after a prompt are not its seeded noise", c)
		}
	}
	if again := p.flowNoise(9, 3, 6, 10); !slices.Equal(got, again) || got[0] == 0 {
		t.Fatal("prompt noise is not deterministic")
	}
}

// The Euler steps' times: linear as the engine always ran them; cosine t_k = 1 − cos(k/n·π/2),
// dt_k = t_{k+1} − t_k, so the steps reach 1.
func TestFlowSchedule(t *testing.T) {
	m := &Manifest{Flow: FlowSpec{Steps: 4, Schedule: "linear"}}
	ts, dts := flowSchedule(m)
	if !slices.Equal(ts, []float32{0, 0.25, 0.5, 0.75}) || !slices.Equal(dts, []float32{0.25, 0.25, 0.25, 0.25}) {
		t.Fatalf("linear: t %v, dt %v", ts, dts)
	}
	m.Flow.Steps, m.Flow.Schedule = 10, "cosine"
	ts, dts = flowSchedule(m)
	sum := 0.0
	for k := range 10 {
		want := 1 - math.Cos(float64(k)/10*math.Pi/2)
		next := 1 - math.Cos(float64(k+1)/10*math.Pi/2)
		if math.Abs(float64(ts[k])-want) > 1e-7 || math.Abs(float64(dts[k])-(next-want)) > 1e-7 {
			t.Fatalf("step %d: t %v dt %v, want %v %v", k, ts[k], dts[k], want, next-want)
		}
		sum += float64(dts[k])
	}
	if ts[0] != 0 || math.Abs(float64(ts[1])-0.0123117) > 1e-6 || math.Abs(sum-1) > 1e-6 {
		t.Fatalf("cosine: t %v, steps sum to %v", ts, sum)
	}
	m.Flow.Schedule = "quadratic"
	m.defaults()
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "flow.schedule") {
		t.Fatalf("schedule quadratic: err %v", err)
	}
}

// Buckets count each voice's prompt and the look-ahead: every chunk of the schedule with its
// context, look-ahead and prompt has a bucket of its own length, and the 16-token steps reach
// the longest.
func TestFlowTokenSizesWithPrompts(t *testing.T) {
	m := &Manifest{Voices: []string{"a", "b"}, Flow: FlowSpec{FramesPerToken: 2, LookaheadTokens: 3},
		Streaming: StreamingSpec{ChunkTokens: []int{8, 25}, ContextTokens: 4},
		voices:    map[string]*Voice{"b": {SpeechTokens: make([]int64, 40)}}}
	// Voice a: 8+3=11 → 12, 25+4+3=32; voice b: 51 → 52, 72; steps of 16 to 40+25+4+3=72.
	want := []int{12, 16, 32, 48, 52, 64, 72}
	if got := flowTokenSizes(m); !slices.Equal(got, want) {
		t.Fatalf("token buckets %v, want %v", got, want)
	}
}
