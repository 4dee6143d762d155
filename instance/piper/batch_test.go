package piper

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// batchSentences have different lengths, so rows are padded.
var batchSentences = []string{
	"Hello there.",
	"The weather is nice today, so we will walk to the park.",
	"What? No!",
	"Please call me back when you get home tonight.",
}

// A batched sentence equals the same sentence alone within these bounds, per sample, of full scale. Away from its first and last batchEdge samples a row
// differs by float rounding only (measured 0.00001 on the CPU); at the edges by up to 1.3% of the
// sentence's peak (0.0037 of full scale; 0.0126 once scaled to the peak as requests get it): the decoder's convolutions see the
// batch's padding frames, whose activations are not exactly the zeros a row alone is padded with.
const (
	batchTolerance      = 0.02
	batchInnerTolerance = 0.001
	batchEdge           = 4096 // samples, 0.19 s at 22.05 kHz
)

// section writes o as a group's engine section.
func section(t testing.TB, o Options) tts.EngineSection {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jennyRunner(t *testing.T, opts Options) *Runner {
	t.Helper()
	p := reference(t)
	r, _, err := openPiper(tts.LoadConfig{Manifest: p.voice, Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, opts)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	r.m.Files[0].scales = [3]float32{0, 1, 0} // deterministic: no noise
	return r
}

func piperMaxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// The graph of a published voice gets its row lengths exposed; the tiny voice (no VITS length
// computation) is left to run one sentence at a time.
func TestPiperWithLengths(t *testing.T) {
	if g, err := piperWithLengths(reference(t).voice); err != nil || g == nil {
		t.Fatalf("jenny: %v (graph %d bytes)", err, len(g))
	}
	if g, err := piperWithLengths(tinyPiperEN); err != nil || g != nil {
		t.Fatalf("tiny voice: %v, %d bytes; want no rewrite", err, len(g))
	}
}

// One run of four padded rows gives each row the audio it gets alone: same length, samples within
// batchTolerance.
func TestPiperBatchEqualsAlone(t *testing.T) {
	r := jennyRunner(t, Options{Batch: 8, Workers: 1, Decode: DecodeSentences})
	f := r.m.Files[0]
	s, release, err := r.cache.acquire(f)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if !s.lengths || s.opts.Batch != 8 {
		t.Fatalf("session: lengths %v, batch %d", s.lengths, s.opts.Batch)
	}
	ph := testPhonemizer(t)
	var rows [][]int64
	for _, text := range batchSentences {
		ss, err := f.sentences(ph, text)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ss {
			rows = append(rows, x.IDs)
		}
	}
	sids := make([]int64, len(rows))
	batched, err := runPiperBatch(s.sess, f, true, rows, sids, ones(len(rows)), f.scales)
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range rows {
		alone, err := runPiperBatch(s.sess, f, true, [][]int64{row}, []int64{0}, ones(1), f.scales)
		if err != nil {
			t.Fatal(err)
		}
		if len(batched[i]) != len(alone[0]) {
			t.Errorf("row %d: %d samples batched, %d alone", i, len(batched[i]), len(alone[0]))
			continue
		}
		d, inner := piperDiffs(batched[i], alone[0])
		t.Logf("row %d: %d ids, %d samples, largest difference %.6f, %.6f away from the edges", i, len(row), len(batched[i]), d, inner)
		if inner > batchInnerTolerance {
			t.Errorf("row %d: batched differs from alone by %.6f away from the edges, more than %g", i, inner, batchInnerTolerance)
		}
		if d > batchTolerance {
			t.Errorf("row %d: batched differs from alone by %.4f, more than %g", i, d, batchTolerance)
		}
	}
}

// Concurrent requests share runs (fewer runs than sentences) and each gets the audio it gets alone,
// sentence by sentence.
func TestPiperConcurrentRequestsAreBatched(t *testing.T) {
	r := jennyRunner(t, Options{Batch: 8, Workers: 1})
	alone := make([][][]float32, len(batchSentences))
	for i, text := range batchSentences {
		alone[i] = speak(t, r, tts.Request{Text: text})
	}
	runs0, rows0 := graphRuns(r)
	const copies = 3 // each sentence asked by several requests at once
	got := make([][][]float32, len(batchSentences)*copies)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = speak(t, r, tts.Request{Text: batchSentences[i%len(batchSentences)]})
		}()
	}
	wg.Wait()
	runs, rows := graphRuns(r)
	runs, rows = runs-runs0, rows-rows0
	t.Logf("%d sentences in %d runs", rows, runs)
	if runs >= rows {
		t.Errorf("%d sentences took %d runs: concurrent requests were not batched", rows, runs)
	}
	for i, chunks := range got {
		want := alone[i%len(batchSentences)]
		if len(chunks) != len(want) {
			t.Fatalf("request %d: %d chunks, %d alone", i, len(chunks), len(want))
		}
		for c := range chunks {
			if len(chunks[c]) != len(want[c]) {
				t.Errorf("request %d chunk %d: %d samples, %d alone", i, c, len(chunks[c]), len(want[c]))
				continue
			}
			// Scaled to its peak, an edge's difference becomes a gain of up to 1.3% on the whole
			// sentence when the peak is at an edge, so only the overall bound applies here.
			if d := piperMaxDiff(chunks[c], want[c]); d > batchTolerance {
				t.Errorf("request %d chunk %d: differs from alone by %.4f", i, c, d)
			}
		}
	}
}

// With a queue of one sentence and one worker, a burst of requests gets some refused as busy
// (HTTP 429 at the router) and the rest served: the runs stay bounded by the batch.
func TestPiperFullQueueRefusesAsBusy(t *testing.T) {
	r := jennyRunner(t, Options{Batch: 2, Workers: 1, Queue: 1})
	var wg sync.WaitGroup
	var mu sync.Mutex
	busy, ok := 0, 0
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			err := r.Synthesize(ctx, tts.Request{Text: "Please call me back when you get home tonight."}, func(tts.Chunk) error { return nil })
			mu.Lock()
			defer mu.Unlock()
			var ie *tts.Error
			switch {
			case err == nil:
				ok++
			case errors.As(err, &ie) && ie.Kind == tts.ErrBusy:
				busy++
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d served, %d refused as busy", ok, busy)
	if busy == 0 || ok == 0 {
		t.Errorf("%d served, %d busy: want both", ok, busy)
	}
}

func TestPiperOptions(t *testing.T) {
	o := piperOptionsFrom(tts.LoadConfig{Provider: "cuda"}, Options{Batch: 16})
	if o.Batch != 16 || o.Workers != piperCUDAWorkers || o.Queue != piperQueue || o.BatchIDs != 16*piperRowIDs {
		t.Fatalf("cuda, batch 16: %+v", o)
	}
	if o := piperOptionsFrom(tts.LoadConfig{Provider: "cpu", MaxInflight: 5}, Options{}); o.Batch != 1 || o.Workers != 5 {
		t.Fatalf("cpu defaults %+v", o)
	}
	if o := piperOptionsFrom(tts.LoadConfig{Provider: "cuda"}, Options{Batch: 1}); o.Batch != 1 {
		t.Fatalf("batching off: %+v", o)
	}
	for _, bad := range []Options{{Batch: -1}, {Workers: 257}, {Queue: -1}} {
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "piper_") {
			t.Errorf("%+v: %v, want an error naming the option", bad, err)
		}
	}
}

func TestParseOptions(t *testing.T) {
	o, err := Family{}.ParseOptions(tts.EngineSection(`{"piper_batch": 16, "piper_queue": 8, "intra_op_num_threads": 2, "profile": null}`))
	if want := (Options{Options: ort.Options{IntraOpThreads: 2}, Batch: 16, Queue: 8}); err != nil || o != want {
		t.Fatalf("got %+v, %v; want %+v", o, err, want)
	}
	for section, want := range map[string]string{
		`{"piper_batch": 2000}`:        "engine.piper_batch: 2000 is not a number from 1 to 1024",
		`{"piper_workers": "two"}`:     `engine.piper_workers: "two" is not a whole number`,
		`{"flow_workers": 2}`:          "engine.flow_workers: unknown key; the piper family's keys are " + strings.Join(Family{}.OptionKeys(), ", "),
		`{"intra_op_num_threads": -1}`: "engine.intra_op_num_threads: -1 is not a thread count",
	} {
		if _, err := (Family{}).ParseOptions(tts.EngineSection(section)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", section, err, want)
		}
	}
}

// piperDiffs is the largest difference of a from b, everywhere and away from the edges.
func piperDiffs(a, b []float32) (all, inner float64) {
	all = piperMaxDiff(a, b)
	if len(a) > 2*batchEdge {
		inner = piperMaxDiff(a[batchEdge:len(a)-batchEdge], b[batchEdge:len(b)-batchEdge])
	}
	return all, inner
}

// graphRuns is the runner's graph runs so far and the sentences in them.
func graphRuns(r *Runner) (runs, rows uint64) {
	st := r.Report().Stages[stageGraph]
	return st.Batches, st.Items
}
