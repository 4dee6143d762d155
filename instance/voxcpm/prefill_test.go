package voxcpm

import (
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// tinyPrompts are prompts of several lengths, one in the export's voice when it has one.
func tinyPrompts(t *testing.T, m *Manifest, n int) []*prompt {
	t.Helper()
	tok, err := loadTokenizer(m)
	if err != nil {
		t.Fatal(err)
	}
	var out []*prompt
	for i := range n {
		var v *voice
		if i == 2 && len(m.voiceNames) > 1 {
			v = m.voice(m.voiceNames[1])
		}
		p, err := m.buildPrompt(tok, v, texts[i%len(texts)]+strings.Repeat(" and more", i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// A batch of right-padded prompts, each written into its own slot, gives each prompt's mu and
// stop logits alone, at its own last position; placeholder rows take no part.
func TestTinyBatchedPrefill(t *testing.T) {
	m, rt := tinyRuntime(t)
	g, err := openGraphs(m, rt, 8, graphModes{step: StepGraphOff})
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	ps := tinyPrompts(t, m, 5)
	alone := make([]prefilled, len(ps))
	for i, p := range ps {
		out, err := g.prefill(0, []*prompt{p}, 1)
		if err != nil {
			t.Fatal(err)
		}
		alone[i] = out[0]
	}
	lengths := map[int]bool{}
	for _, p := range ps {
		lengths[m.prefillLength(p.length())] = true
	}
	if len(lengths) < 2 {
		t.Fatalf("the prompts all pad to one length: %v", lengths)
	}
	for _, c := range []struct{ from, rows int }{{0, 8}, {3, 8}, {1, 5}} {
		out, err := g.prefill(c.from, ps, c.rows)
		if err != nil {
			t.Fatal(err)
		}
		var worst float64
		for i := range ps {
			d := max(maxDiff(out[i].mu, alone[i].mu), maxDiff(out[i].stop[:], alone[i].stop[:]))
			worst = max(worst, d)
			if d > 1e-5 {
				t.Fatalf("%d prompts in %d rows from slot %d: prompt %d (%d positions) %g from alone", len(ps), c.rows, c.from, i, ps[i].length(), d)
			}
		}
		t.Logf("%d prompts in %d rows from slot %d: at most %g from alone", len(ps), c.rows, c.from, worst)
	}
	if _, err := g.prefill(0, ps, 4); err == nil {
		t.Fatal("5 prompts ran in 4 rows")
	}
	// The warm-up runs (on a GPU, at load) every shape of up to 8 rows and 256 positions.
	if err := g.warmPrefill(8); err != nil {
		t.Fatal(err)
	}
}

// A burst of requests arriving at once beside a running one joins in grouped prefills before
// the next step, and each request gives the audio it gives alone.
func TestTinyBurstEqualsAlone(t *testing.T) {
	e := tinyEngine(t, 16)
	var reqs []tts.Request
	for i := range 12 {
		reqs = append(reqs, tts.Request{Text: "Number " + strconv.Itoa(i) + strings.Repeat(" and so on", i%4), Seed: uint64(20 + i)})
	}
	if len(e.m.voiceNames) > 1 {
		reqs[5].Voice = e.m.voiceNames[1]
	}
	alone := runAlone(t, e, reqs)
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		done <- e.Synthesize(t.Context(), tts.Request{Text: texts[1], Seed: 99}, func(tts.Chunk) error {
			once.Do(func() { close(started) })
			return nil
		})
	}()
	<-started
	before := e.Stats()[stagePrefill]
	got := runTogether(t, e, reqs, nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after := e.Stats()[stagePrefill]
	var worst float64
	for i := range reqs {
		if got[i].err != nil || len(got[i].chunks) != len(alone[i].chunks) || closeTo(got[i], alone[i]) > 1e-4 {
			t.Fatalf("request %d in the burst: %v, %d patches (%d alone), %g from alone", i, got[i].err,
				len(got[i].chunks), len(alone[i].chunks), closeTo(got[i], alone[i]))
		}
		worst = max(worst, closeTo(got[i], alone[i]))
	}
	runs, items := after.Batches-before.Batches, after.Items-before.Items
	if items != uint64(len(reqs)) || runs >= items {
		t.Fatalf("%d requests prefilled in %d runs: the burst was not grouped", items, runs)
	}
	t.Logf("%d requests in %d prefill runs, at most %g from alone", items, runs, worst)
}
