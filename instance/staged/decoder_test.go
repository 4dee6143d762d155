package staged

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"

	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// newTestDecoder loads the tiny model's LM with the given cache contract: "concat" (lm.onnx) or
// "shared" (lm_shared.onnx, the same weights), or "graph": shared, with decode steps of fixed
// shapes as lm_cuda_graph runs them (on the CPU, without the graphs themselves) for up to 3 rows.
func newTestDecoder(t *testing.T, cache string) lmDecoder {
	return newTestDecoderRows(t, cache, 3)
}

func newTestDecoderRows(t *testing.T, cache string, graphRows int) lmDecoder {
	t.Helper()
	p := tinyPipeline(t) // initialises ONNX Runtime and iobind
	t.Cleanup(func() { p.Close() })
	m := *p.m
	m.LM.Cache, m.LM.MaxPositions, m.LM.File = "concat", 0, "lm.onnx"
	if cache != "concat" {
		m.LM.Cache, m.LM.MaxPositions, m.LM.File = "shared", 96, "lm_shared.onnx"
	}
	if cache != "graph" {
		graphRows = 0
	}
	d, err := newLMDecoder(&m, iobind.Placement{}, graphRows, graphRows > 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	return d
}

func maxDiff(a, b []float32) float64 {
	var w float64
	for i := range a {
		w = max(w, math.Abs(float64(a[i]-b[i])))
	}
	return w
}

// A sequence's logits must not depend on what else shares its batch: rows joining with longer
// prompts (the cache grows under it), rows leaving, and compaction (its real positions move).
func TestDecoderRowsAreIndependent(t *testing.T) {
	var want [][]float32 // B alone, concat cache: both contracts must give it
	for _, cache := range []string{"concat", "shared", "graph"} {
		t.Run(cache, func(t *testing.T) {
			got := decodeBesideOthers(t, cache)
			if want == nil {
				want = decodeAlone(t, cache)
			}
			for i := range want {
				if w := maxDiff(want[i], got[i]); w > 1e-4 {
					t.Errorf("step %d: batched logits differ from alone (concat cache) by %g", i, w)
				}
			}
			if alone := decodeAlone(t, cache); cache != "concat" {
				for i := range want {
					if w := maxDiff(want[i], alone[i]); w > 1e-4 {
						t.Errorf("step %d: alone, the %s cache differs from the concat cache by %g", i, cache, w)
					}
				}
			}
		})
	}
}

var (
	testPromptA = "short"
	testPromptB = "a much longer prompt than the first"
	testTokens  = []int64{260, 270, 280, 290, 300, 310, 320, 321}
)

// decodeAlone prefills prompt B alone and decodes every test token.
func decodeAlone(t *testing.T, cache string) [][]float32 {
	alone := newTestDecoder(t, cache)
	m := tinyManifest(t)
	rows, first, err := alone.join([][]int64{m.Tokenize(testPromptB)})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]float32{first[0]}
	for _, tok := range testTokens {
		l, err := alone.step(rows, []int64{tok})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, slices.Clone(l[0])) // a step's logits hold until the next
	}
	return want
}

// decodeBesideOthers runs B in a shared batch: A runs first; B joins with a longer prompt after
// A's steps; A leaves and the cache is compacted in the middle of B's decoding.
func decodeBesideOthers(t *testing.T, cache string) [][]float32 {
	m := tinyManifest(t)
	promptA := m.Tokenize(testPromptA)
	promptB := m.Tokenize(testPromptB)
	tokens := testTokens
	d := newTestDecoder(t, cache)
	ra, _, err := d.join([][]int64{promptA})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := d.step(ra, []int64{int64(290 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	rb, got0, err := d.join([][]int64{promptB})
	if err != nil {
		t.Fatal(err)
	}
	got := [][]float32{got0[0]}
	for i, tok := range tokens {
		rowsNow := []*lmRow{rb[0]}
		toks := []int64{tok}
		if i < 4 {
			rowsNow = append(rowsNow, ra[0])
			toks = append(toks, int64(300+i))
		}
		if i == 4 {
			d.leave(ra[0])
			if err := d.compact(); err != nil {
				t.Fatal(err)
			}
			switch d := d.(type) {
			case *decoder:
				if len(d.rows) != 1 || d.P != rb[0].real {
					t.Fatalf("after compaction: %d rows, P %d, want 1 row and P %d", len(d.rows), d.P, rb[0].real)
				}
			case *sharedDecoder:
				if d.size() != 1 || rb[0].slot != 0 {
					t.Fatalf("after compaction: %d rows, B in slot %d, want 1 row in slot 0", d.size(), rb[0].slot)
				}
			}
		}
		l, err := d.step(rowsNow, toks)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, slices.Clone(l[0]))
	}
	return got
}

func tinyManifest(t *testing.T) *Manifest {
	t.Helper()
	m, err := LoadManifest("../../models/tiny/pipeline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// With the shared cache a request must fit lm.max_positions: text that cannot is refused before
// it reaches the LM, naming the limit, and text that fits is cut to the room left.
func TestSharedCacheLimit(t *testing.T) {
	m := tinyManifest(t)
	m.LM.Cache, m.LM.File, m.LM.MaxPositions = "shared", "lm_shared.onnx", 40
	p, err := loadPipeline(m, tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t)}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(p)
	defer e.Close()
	err = e.Synthesize(context.Background(), tts.Request{Text: strings.Repeat("long text ", 3), Voice: "default"}, func(tts.Chunk) error { return nil })
	var ie *tts.Error
	if !errors.As(err, &ie) || ie.Kind != tts.ErrInvalid || !strings.Contains(ie.Msg, "lm.max_positions") {
		t.Fatalf("30 characters in 40 positions: err %v, want tts.ErrInvalid naming lm.max_positions", err)
	}
	// 4 characters: a prompt of 6 and at most 16 tokens fit.
	pcm := synth(t, e, tts.Request{Text: "okay", Voice: "default"})
	if len(pcm) == 0 {
		t.Fatal("no audio for text that fits")
	}
}

// Prompts of different lengths prefilled in one padded run, then decoded together, give what
// each gives alone.
func TestDecoderJoinTogether(t *testing.T) {
	for _, cache := range []string{"concat", "shared", "graph"} {
		t.Run(cache, func(t *testing.T) {
			m := tinyManifest(t)
			want := decodeAlone(t, cache)
			d := newTestDecoder(t, cache)
			// Three rows: the shared cache prefills them as four, the last a placeholder.
			rows, first, err := d.join([][]int64{m.Tokenize(testPromptA), m.Tokenize(testPromptB), m.Tokenize(testPromptA)})
			if err != nil {
				t.Fatal(err)
			}
			got := [][]float32{first[1]}
			for i, tok := range testTokens {
				l, err := d.step(rows, []int64{int64(300 + i), tok, int64(310 + i)})
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, slices.Clone(l[1]))
			}
			for i := range want {
				if w := maxDiff(want[i], got[i]); w > 1e-4 {
					t.Errorf("step %d: joined together, logits differ from alone by %g", i, w)
				}
			}
		})
	}
}

// With CUDA graphs the cache never grows: a join that finds no room above the highest row moves
// every row down first, and the rows moved decode on as before; past the slots the graphs were
// made for, a join fails with the reason.
func TestGraphCacheCompactsToMakeRoom(t *testing.T) {
	m := tinyManifest(t)
	want := decodeAlone(t, "graph")
	d := newTestDecoderRows(t, "graph", 3) // 4 slots
	a, _, err := d.join([][]int64{m.Tokenize(testPromptA)})
	if err != nil {
		t.Fatal(err)
	}
	b, got0, err := d.join([][]int64{m.Tokenize(testPromptB)})
	if err != nil {
		t.Fatal(err)
	}
	got := [][]float32{got0[0]}
	c, _, err := d.join([][]int64{m.Tokenize(testPromptA)})
	if err != nil {
		t.Fatal(err)
	}
	step := func(rows []*lmRow, i int) {
		t.Helper()
		toks := make([]int64, len(rows))
		for j := range toks {
			toks[j] = int64(300 + j)
		}
		toks[0] = testTokens[i]
		l, err := d.step(rows, toks)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, slices.Clone(l[0]))
	}
	step([]*lmRow{b[0], a[0], c[0]}, 0)
	// a leaves slot 0 free: two new rows fit only once b and c have moved down.
	d.leave(a[0])
	two, _, err := d.join([][]int64{m.Tokenize(testPromptA), m.Tokenize(testPromptA)})
	if err != nil {
		t.Fatalf("join into a full cache after compaction: %v", err)
	}
	if c[0].slot != 0 || b[0].slot != 1 || two[0].slot != 2 || two[1].slot != 3 {
		t.Errorf("slots after compaction: c %d, b %d, new %d and %d; want 0, 1, 2, 3", c[0].slot, b[0].slot, two[0].slot, two[1].slot)
	}
	for i := 1; i < len(testTokens); i++ {
		step([]*lmRow{b[0], c[0], two[0], two[1]}, i)
	}
	for i := range want {
		if w := maxDiff(want[i], got[i]); w > 1e-4 {
			t.Errorf("step %d: logits differ from alone by %g", i, w)
		}
	}
	if _, _, err := d.join([][]int64{m.Tokenize(testPromptA)}); err == nil || !strings.Contains(err.Error(), "slots the CUDA graphs were made for") {
		t.Errorf("a fifth row in four slots: %v", err)
	}
}

// A decode step in the graphs' fixed shapes hands back its logits in one buffer kept for every
// step of its bucket, so a busy LM allocates no B × vocabulary floats per step for Go's collector
// (each row's logits are a view of it, valid until the next step).
func TestGraphStepReusesLogits(t *testing.T) {
	d := newTestDecoder(t, "graph")
	m := tinyManifest(t)
	rows, _, err := d.join([][]int64{m.Tokenize(testPromptA), m.Tokenize(testPromptB)})
	if err != nil {
		t.Fatal(err)
	}
	first, err := d.step(rows, []int64{300, 301})
	if err != nil {
		t.Fatal(err)
	}
	kept := slices.Clone(first[1])
	second, err := d.step(rows, []int64{302, 303})
	if err != nil {
		t.Fatal(err)
	}
	if &first[1][0] != &second[1][0] {
		t.Errorf("the second step's logits are in new memory, want the buffer of the first")
	}
	if maxDiff(kept, second[1]) == 0 {
		t.Errorf("the second step's logits equal the first's: the buffer was not refilled")
	}
	if len(second[0]) != m.LM.SpeechVocab+1 || cap(second[0]) != len(second[0]) {
		t.Errorf("row 0's logits: %d values, capacity %d; want %d of each (appending must not reach row 1)", len(second[0]), cap(second[0]), m.LM.SpeechVocab+1)
	}
}
