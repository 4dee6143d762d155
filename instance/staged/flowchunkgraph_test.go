package staged

import (
	"slices"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// tinyChunkFlows opens the tiny CosyVoice3 export's chunk-causal flow on the CPU with the engine
// options opts (a JSON object's members).
func tinyChunkFlows(t *testing.T, opts string) *flowChunks {
	t.Helper()
	c, _ := tinyChunkFlow(t) // skips (or fails) without the export
	p, err := LoadPipeline(tts.LoadConfig{Manifest: c.m.File, Provider: "cpu", ORTLibrary: ortLibrary(t),
		Engine: tts.EngineSection("{" + opts + "}")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p.flows[0].(*flowChunks)
}

// chunkStream is one utterance driven chunk by chunk through a flowChunks: a voice's prompt (or
// none), then tokens.
type chunkStream struct {
	st     *chunkKV
	voice  *Voice
	tokens []int64 // the voice's prompt tokens, then the stream's
}

// chunkRound is one batch: each entry computes stream i to frame end (from its voice prompt's
// first), last ending it.
type chunkRound []struct {
	i, end int
	last   bool
}

// chunkGraphRounds are five rounds of batches of 1 to 3 streams in voice v with different past
// lengths: an early first chunk, whole chunks, a two-chunk first chunk, short last chunks.
func chunkGraphRounds(m *Manifest, v *Voice) []chunkRound {
	CF, R := m.Flow.ChunkFrames, m.Flow.FramesPerToken
	P := len(v.SpeechTokens) * R // the voice's frames: stream 0's frames start there
	next := func(f int) int { return (f/CF + 1) * CF }
	a1 := P + 8*R // early: 8 tokens
	a2 := next(a1)
	return []chunkRound{
		{{0, a1, false}},
		{{0, a2, false}, {1, 2 * CF, false}},
		{{0, next(a2), false}, {1, 3 * CF, false}, {2, 8 * R, false}},
		{{0, next(a2) + 17, true}, {1, 4 * CF, false}, {2, CF, false}},
		{{1, 4*CF + 9, true}, {2, 2 * CF, false}},
	}
}

// runChunkRounds drives streams through fc round by round and returns each round's rows' mels
// and the bucket each round ran in (nil: its own shape).
func runChunkRounds(t *testing.T, fc *flowChunks, voice *Voice, rounds []chunkRound) ([][][]float32, []*chunkBucket) {
	t.Helper()
	m := fc.m
	f := m.Flow
	streams := make([]*chunkStream, 3)
	for i := range streams {
		s := &chunkStream{st: &chunkKV{}}
		var prompt []int64
		if i == 0 {
			s.voice = voice
			prompt = voice.SpeechTokens
			if err := fc.attachVoice(s.st, voice, voice.Embedding, nil); err != nil {
				t.Fatal(err)
			}
		}
		own := make([]int64, 120)
		for j := range own {
			own[j] = int64(1 + (j*7+i*13)%40)
		}
		s.tokens = slices.Concat(prompt, own)
		streams[i] = s
		t.Cleanup(s.st.close)
	}
	var mels [][][]float32
	var used []*chunkBucket
	for _, round := range rounds {
		var rows []*chunkRow
		for _, e := range round {
			s := streams[e.i]
			_, keep := m.chunkPlan(s.st.done(), &chunkSpan{end: e.end}, e.last)
			from := m.chunkTokFrom(s.st.done())
			row := &chunkRow{st: s.st, end: e.end, keep: keep, tokens: s.tokens[from:], tokFrom: from, emb: make([]float32, f.EmbeddingDim)}
			if s.voice != nil {
				row.cond, row.emb = s.voice.Mel, s.voice.Embedding
			}
			rows = append(rows, row)
		}
		var out [][]float32
		err := fc.graphs.do(func() (err error) {
			out, err = fc.compute(rows, nil, nil)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		mels = append(mels, out)
		used = append(used, fc.lastBucket)
	}
	return mels, used
}

// A batch run in a fixed shape (flow_chunk_cuda_graph: fixed; on the CPU, on runs the same)
// computes what the batch run in its own shape computes, within float32 rounding: batches of 1, 2
// and 3 rows (3 padded to a bucket of 4) of different past lengths, the voice's kept frames and
// the streams' own, an early first chunk that ends inside its chunk and keeps nothing, a first
// chunk of CosyVoice's boundaries (two chunks at once), whole chunks and a last, shorter one. A
// batch of more rows than flow_chunk_graph_rows runs in its own shape, and gives the same.
func TestChunkGraphBucketsMatchOwnShapes(t *testing.T) {
	plain := tinyChunkFlows(t, `"flow_chunk_cuda_graph": "off"`)
	m := plain.m
	v := m.voice("bench")
	if v == nil || len(v.SpeechTokens) == 0 {
		t.Fatal("the tiny export's bench voice has no prompt")
	}
	rounds := chunkGraphRounds(m, v)
	want, own := runChunkRounds(t, plain, v, rounds)
	for i, b := range own {
		if b != nil {
			t.Fatalf("round %d ran in bucket %+v with flow_chunk_cuda_graph off", i, b)
		}
	}
	check := func(name string, got [][][]float32, used []*chunkBucket, fixed func(round int) bool) {
		t.Helper()
		worst := 0.0
		for r := range rounds {
			if (used[r] != nil) != fixed(r) {
				t.Errorf("%s, round %d of %d rows: bucket %v, want one: %v", name, r, len(rounds[r]), used[r], fixed(r))
			}
			if used[r] != nil && used[r].B < len(rounds[r]) {
				t.Errorf("%s, round %d: %d rows in a bucket of %d", name, r, len(rounds[r]), used[r].B)
			}
			for j := range rounds[r] {
				if len(got[r][j]) != len(want[r][j]) {
					t.Fatalf("%s, round %d row %d: %d values, want %d", name, r, j, len(got[r][j]), len(want[r][j]))
				}
				d := float64(maxDiff(got[r][j], want[r][j]))
				worst = max(worst, d)
				if d > 1e-4 {
					t.Errorf("%s, round %d row %d: max |diff| %.3g against the run in its own shape", name, r, j, d)
				}
			}
		}
		t.Logf("%s: every row within %.2g of the runs in their own shapes", name, worst)
	}
	fixed := tinyChunkFlows(t, `"flow_chunk_cuda_graph": "fixed"`)
	got, used := runChunkRounds(t, fixed, v, rounds)
	check("4 rows", got, used, func(int) bool { return true })
	if used[2].B != 4 {
		t.Errorf("3 rows ran in a bucket of %d rows, want 4", used[2].B)
	}
	two := tinyChunkFlows(t, `"flow_chunk_cuda_graph": "on", "flow_chunk_graph_rows": 2`)
	got, used = runChunkRounds(t, two, v, rounds)
	check("2 rows", got, used, func(r int) bool { return len(rounds[r]) <= 2 })
}

// Through the engine, with fixed shapes every chunk after an early first one equals the whole
// chunk-masked run on both chunk schedules, and the flow's batches are counted as fixed-shape
// runs (the flow_graph stage).
func TestChunkGraphEngineStreamsExactly(t *testing.T) {
	for _, emit := range []ChunkEmit{ChunkEmitEarly, ChunkEmitCosyVoice} {
		t.Run(string(emit), func(t *testing.T) {
			e, log := tinyChunkEngine(t, 1<<30, emit, `"flow_chunk_cuda_graph": "fixed"`)
			exact, first := speak(t, e, log, tts.Request{Text: chunkText, Voice: "bench", Seed: 1}, emit == ChunkEmitEarly)
			t.Logf("chunks after the first within %.2g of the whole run; the first %.3g", exact, first)
			var flow, fixed tts.StageStats
			for _, st := range e.Stats() {
				switch st.Stage {
				case "flow":
					flow = st
				case "flow_graph":
					fixed = st
				}
			}
			t.Logf("flow batches %d, in fixed shapes %d", flow.Batches, fixed.Batches)
			if fixed.Batches == 0 || fixed.Batches > flow.Batches {
				t.Errorf("flow batches %+v, of them in fixed shapes %+v", flow, fixed)
			}
		})
	}
}

// The buckets' shapes follow the chunk schedule: whole chunks of new frames up to the longest
// first chunk, every chunk of past up to 8 and then at most an eighth of padding, and batch sizes
// in powers of two up to flow_chunk_graph_rows.
func TestChunkGraphShapes(t *testing.T) {
	if got := chunkGraphRows(4); !slices.Equal(got, []int{1, 2, 4}) {
		t.Errorf("rows 4: %v", got)
	}
	if got := chunkGraphRows(6); !slices.Equal(got, []int{1, 2, 4, 6}) {
		t.Errorf("rows 6: %v", got)
	}
	if got := chunkGraphRows(1); !slices.Equal(got, []int{1}) {
		t.Errorf("rows 1: %v", got)
	}
	ps := chunkGraphPasts(50, 2048)
	if ps[0] != 50 || ps[7] != 400 || ps[len(ps)-1] > 2048 || len(ps) > 40 {
		t.Errorf("pasts: %v", ps)
	}
	for i := 1; i < len(ps); i++ {
		if ps[i]%50 != 0 || ps[i] <= ps[i-1] || (ps[i-1] >= 400 && (ps[i]-ps[i-1])*8 > ps[i-1]+400) {
			t.Errorf("pasts: %v", ps)
			break
		}
	}
	c, _ := tinyChunkFlow(t)
	m := c.m
	for _, emit := range []ChunkEmit{ChunkEmitEarly, ChunkEmitCosyVoice} {
		news := m.chunkGraphNews(emit)
		t.Logf("%s: new frames %v", emit, news)
		if news[0] != m.Flow.ChunkFrames || len(news) < 2 || len(news) > 3 {
			t.Errorf("%s: new frames %v", emit, news)
		}
	}
}
