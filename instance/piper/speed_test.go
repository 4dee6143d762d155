package piper

import (
	"math"
	"os"
	"sync"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// speedText is three sentences, about 12.7 s at speed 1 with the jenny voice.
const speedText = "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore, " +
	"and the shells she sells are surely sea shells. Peter Piper picked a peck of pickled peppers; " +
	"how many pickled peppers did Peter Piper pick?"

// speedTolerance bounds |duration(s)·s / duration(1) − 1|. A sentence's frames at speed s are its
// frames at speed 1 over s, rounded to a whole frame (256 samples, 11.6 ms), and so is the silence
// between sentences to a sample: measured within 0.1% for speedText from 0.25 to 4.
const speedTolerance = 0.01

func ones(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

// atSpeed is n rows' speeds for a run of s's graph (its front, where it is chunked): nil where
// the graph does not take piperSpeedInput.
func atSpeed(s *piperSession, n int, speed float32) []float32 {
	if !s.speed {
		return nil
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = speed
	}
	return v
}

func samples(chunks [][]float32) int {
	n := 0
	for _, c := range chunks {
		n = len(c) + n
	}
	return n
}

// A request's audio at speed s lasts its audio at speed 1 over s, over the range the API takes
// (0.25 to 4), whether sentences are decoded in chunks (the speed is in the front graph) or run
// whole; both give the same number of samples at every speed. Noise is off (jennyRunner), so
// durations are the same from run to run.
func TestPiperSpeedIsProportional(t *testing.T) {
	speeds := []float32{1, 0.25, 0.5, 2, 4}
	got := map[Decode][]int{}
	for _, mode := range []Decode{DecodeChunks, DecodeSentences} {
		r := jennyRunner(t, Options{Batch: 1, Workers: 1, Decode: mode})
		s, release, err := r.cache.acquire(r.m.Files[0])
		if err != nil {
			t.Fatal(err)
		}
		if (s.chunks != nil) != (mode == DecodeChunks) || !s.speed {
			t.Fatalf("%s: chunked %v, speed input %v", mode, s.chunks != nil, s.speed)
		}
		release()
		for _, sp := range speeds {
			got[mode] = append(got[mode], samples(speak(t, r, tts.Request{Text: speedText, Speed: sp})))
		}
		base := got[mode][0]
		t.Logf("%s, speed 1: %d samples, %.3f s", mode, base, float64(base)/22050)
		for i, sp := range speeds[1:] {
			n := got[mode][i+1]
			ratio := float64(base) / float64(n)
			t.Logf("%s, speed %g: %d samples, %.3f s: %.3f× shorter", mode, sp, n, float64(n)/22050, ratio)
			if e := ratio/float64(sp) - 1; math.Abs(e) > speedTolerance {
				t.Errorf("%s, speed %g: audio %.3f× shorter than at speed 1, want %g× (within %g%%)", mode, sp, ratio, sp, 100*speedTolerance)
			}
		}
	}
	for i, sp := range speeds {
		if c, w := got[DecodeChunks][i], got[DecodeSentences][i]; c != w {
			t.Errorf("speed %g: %d samples decoded in chunks, %d run whole", sp, c, w)
		}
	}
}

// At speed 1 the rewritten graph is Piper's: the same durations and samples as the voice file
// run as it is.
func TestPiperSpeedOneIsPipers(t *testing.T) {
	r := jennyRunner(t, Options{Batch: 1, Workers: 1, Decode: DecodeSentences})
	f := r.m.Files[0]
	s, release, err := r.cache.acquire(f)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if !s.speed {
		t.Fatal("the jenny voice's session has no speed input")
	}
	plain, err := r.rt.Session("piper", f.Path, []string{"input", "input_lengths", "scales"}, []string{"output"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Destroy()
	ph := testPhonemizer(t)
	ss, err := f.sentences(ph, speedText)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range ss {
		got, err := runPiperBatch(s.sess, f, false, [][]int64{x.IDs}, []int64{0}, ones(1), f.scales)
		if err != nil {
			t.Fatal(err)
		}
		want, err := runPiperBatch(plain, f, false, [][]int64{x.IDs}, []int64{0}, nil, f.scales)
		if err != nil {
			t.Fatal(err)
		}
		if len(got[0]) != len(want[0]) {
			t.Fatalf("sentence %d: %d samples, %d from the voice file as it is", i, len(got[0]), len(want[0]))
		}
		if d := piperMaxDiff(got[0], want[0]); d > 1e-5 {
			t.Errorf("sentence %d: differs from the voice file as it is by %g", i, d)
		}
	}
}

// Requests at different speeds share graph runs (speed is a row's own input, not the batch's
// scales), whole or chunked (there the front's runs), and each row gets the audio it gets alone,
// within the bounds of TestPiperBatchEqualsAlone (a batch's padding touches a row's edges only).
func TestPiperSpeedsShareABatch(t *testing.T) {
	speeds := []float32{1, 2, 0.5, 4}
	for _, mode := range []Decode{DecodeChunks, DecodeSentences} {
		t.Run(string(mode), func(t *testing.T) {
			r := jennyRunner(t, Options{Batch: 8, Workers: 1, Decode: mode})
			f := r.m.Files[0]
			ss, err := f.sentences(testPhonemizer(t), batchSentences[1])
			if err != nil || len(ss) != 1 {
				t.Fatalf("%d sentences, %v", len(ss), err)
			}
			s, release, err := r.cache.acquire(f)
			if err != nil {
				t.Fatal(err)
			}
			if !s.speed {
				t.Fatal("the jenny voice's session has no speed input")
			}
			rows := make([][]int64, len(speeds))
			for i := range rows {
				rows[i] = ss[0].IDs
			}
			// run is rows at speeds as one run of the session's graph, each row's audio whole.
			run := func(rows [][]int64, speeds []float32) [][]float32 {
				t.Helper()
				if s.chunks == nil {
					out, err := runPiperBatch(s.sess, f, true, rows, make([]int64, len(rows)), speeds, f.scales)
					if err != nil {
						t.Fatal(err)
					}
					return out
				}
				ls, err := s.chunks.runFront(f, rows, make([]int64, len(rows)), speeds, f.scales)
				if err != nil {
					t.Fatal(err)
				}
				out := make([][]float32, len(ls))
				for i := range ls {
					pcm, err := s.chunks.decode(f, []window{{l: &ls[i], hi: ls[i].frames, to: ls[i].frames}})
					if err != nil {
						t.Fatal(err)
					}
					out[i] = pcm[0]
				}
				return out
			}
			batched := run(rows, speeds)
			for i, sp := range speeds {
				alone := run(rows[i:i+1], speeds[i:i+1])
				if len(batched[i]) != len(alone[0]) {
					t.Errorf("speed %g: %d samples batched, %d alone", sp, len(batched[i]), len(alone[0]))
					continue
				}
				d, inner := piperDiffs(batched[i], alone[0])
				t.Logf("speed %g: %d samples, largest difference %.6f, %.6f away from the edges", sp, len(alone[0]), d, inner)
				if inner > batchInnerTolerance || d > batchTolerance {
					t.Errorf("speed %g: batched differs from alone by %.6f (%.6f away from the edges)", sp, d, inner)
				}
			}
			release()

			runs0, rows0 := graphRuns(r)
			var wg sync.WaitGroup
			for i := range 2 * len(speeds) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					speak(t, r, tts.Request{Text: batchSentences[1], Speed: speeds[i%len(speeds)]})
				}()
			}
			wg.Wait()
			runs, n := graphRuns(r)
			runs, n = runs-runs0, n-rows0
			t.Logf("%d requests at %d speeds in %d runs", n, len(speeds), runs)
			if runs >= n {
				t.Errorf("%d sentences took %d runs: requests at different speeds were not batched", n, runs)
			}
		})
	}
}

// A graph without VITS's duration rounding (the tiny voice) is left as it is; its speed divides
// length_scale.
func TestPiperWithSpeedLeavesOtherGraphs(t *testing.T) {
	data, err := os.ReadFile(tinyPiperEN)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := piperWithSpeed(data); err != nil || g != nil {
		t.Fatalf("tiny voice: %v, %d bytes; want no rewrite", err, len(g))
	}
}
