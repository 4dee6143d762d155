package staged

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// StageTiming is how long one batched run of a stage took, alone on its device, for one shape.
type StageTiming struct {
	Stage string `json:"stage"`
	// Batch is the number of items in the run; Tokens is each item's length in speech tokens
	// (frames = tokens · frames_per_token for the flow and the vocoder; for the LM decode step,
	// the cache length).
	Batch  int `json:"batch"`
	Tokens int `json:"tokens"`
	// Runs were timed after one untimed run; Mean is their mean, Median and Min their median and
	// fastest (a mean well above the median says a few runs were slow, not every one).
	Runs   int           `json:"runs"`
	Mean   time.Duration `json:"mean_ns"`
	Median time.Duration `json:"median_ns"`
	Min    time.Duration `json:"min_ns"`
	// AudioPerSecond is seconds of audio the stage turns out per second of its time at this
	// shape: the ceiling it puts on throughput (the LM's is tokens per second / token rate).
	AudioPerSecond float64 `json:"audio_per_second"`
	// Together: timed while the other stages ran at the same time, each at this shape.
	Together bool `json:"together,omitempty"`
	// Skipped says why this shape was not timed (a flow run larger than the manifest allows);
	// Runs, Mean and AudioPerSecond are then zero.
	Skipped string `json:"skipped,omitempty"`
}

// StageProfile says what ProfileStages times.
type StageProfile struct {
	Batches, Tokens []int
	Runs            int // timed runs per shape, after one untimed run
	// Together also times each shape with the three stages running at once, each in its own
	// goroutine as in the engine: the gap to the timings alone says what they cost each other.
	Together bool
	// Vary gives every flow and vocoder run items one token longer than the run before, as a
	// serving engine's batches do, instead of one fixed shape: ONNX Runtime redoes per-shape work
	// (cuDNN's convolution plans among it) whenever a session's input shape changes.
	Vary bool
}

// ProfileStages times each batched stage of p in isolation (nothing else on the device): the LM
// decode step, the whole flow (encoder and every solver step) and the vocoder, at every batch
// size for items of each length in tokens. It is how docs/benchmarks explains where the time of a
// load test goes. It drives the LM decoder directly, so p must not be serving an Engine at the
// same time. progress is called before each shape.
func (p *Pipeline) ProfileStages(o StageProfile, progress func(StageTiming)) ([]StageTiming, error) {
	batches, tokens, runs := o.Batches, o.Tokens, o.Runs
	if runs < 1 {
		return nil, errors.New("profile: runs must be at least 1")
	}
	m := p.m
	rng := rand.New(rand.NewPCG(1, 2))
	token := func() int64 { return int64(rng.IntN(m.LM.SpeechVocab)) }
	R, C := m.Flow.FramesPerToken, m.Flow.MelBins
	tokenSec := 1 / float64(m.LM.TokenRate)
	var out []StageTiming
	for _, n := range tokens {
		for _, b := range batches {
			// LM: b sequences whose caches hold n positions, one decode step each.
			prompts := make([][]int64, b)
			for i := range prompts {
				prompts[i] = make([]int64, n)
				for j := range prompts[i] {
					prompts[i][j] = token() + int64(m.LM.SpeechTokenOffset)
				}
			}
			rows, _, err := p.lm.join(prompts)
			if err != nil {
				return out, fmt.Errorf("lm prefill, batch %d × %d tokens: %w", b, n, err)
			}
			// Flow and vocoder: b chunks of n tokens (with Vary, n, n+1, ... in successive runs).
			sets := 1
			if o.Vary {
				sets = runs + 1
			}
			jobs := make([][]flowJob, sets)
			mels := make([][][]float32, sets)
			for k := range jobs {
				jobs[k] = make([]flowJob, b)
				mels[k] = make([][]float32, b)
				for i := range jobs[k] {
					jobs[k][i].tokens = make([]int64, n+k)
					for j := range jobs[k][i].tokens {
						jobs[k][i].tokens[j] = token()
					}
					jobs[k][i].noise = p.noise(uint64(i), 0, (n+k)*R)
					mels[k][i] = make([]float32, C*(n+k)*R)
					for j := range mels[k][i] {
						mels[k][i][j] = float32(rng.NormFloat64())
					}
				}
			}
			flowRun, vocRun := 0, 0
			ids := make([]int64, b)
			audio := float64(b*n) * tokenSec
			stages := []stageRun{
				{StageTiming{Stage: "lm_decode", Batch: b, Tokens: n}, float64(b) * tokenSec, func() error {
					_, err := p.lm.step(rows, ids)
					return err
				}},
				{StageTiming{Stage: "flow", Batch: b, Tokens: n}, audio, func() error {
					_, err := p.flows[0].run(jobs[flowRun%sets], nil)
					flowRun++
					return err
				}},
				{StageTiming{Stage: "vocoder", Batch: b, Tokens: n}, audio, func() error {
					_, err := p.voc.run(mels[vocRun%sets])
					vocRun++
					return err
				}},
			}
			// A flow run past the graphs' limit would not fail cleanly but kill the process: the
			// shape is reported as skipped, and the other stages are timed without it.
			flowErr := m.flowBatchFits(b, n)
			var run []stageRun
			for _, st := range stages {
				if st.t.Stage == "flow" && flowErr != nil {
					t := st.t
					t.Skipped = flowErr.Error()
					out = append(out, t)
					continue
				}
				run = append(run, st)
				if progress != nil {
					progress(st.t)
				}
				t, err := st.time(runs)
				if err != nil {
					p.lm.release()
					return out, err
				}
				out = append(out, t)
			}
			if o.Together {
				if progress != nil {
					progress(StageTiming{Stage: "all three", Batch: b, Tokens: n, Together: true})
				}
				ts, err := timeTogether(run, runs)
				if err != nil {
					p.lm.release()
					return out, err
				}
				out = append(out, ts...)
			}
			p.lm.release()
		}
	}
	return out, nil
}

// stageRun is one stage at one shape: run does one batched run that turns out audio seconds.
type stageRun struct {
	t     StageTiming
	audio float64
	run   func() error
}

func (s stageRun) fail(err error) error {
	return fmt.Errorf("%s, batch %d × %d tokens: %w", s.t.Stage, s.t.Batch, s.t.Tokens, err)
}

// time runs s once untimed (first runs allocate and pick kernels), then runs times.
func (s stageRun) time(runs int) (StageTiming, error) {
	if err := s.run(); err != nil {
		return s.t, s.fail(err)
	}
	took := make([]time.Duration, runs)
	for i := range took {
		start := time.Now()
		if err := s.run(); err != nil {
			return s.t, s.fail(err)
		}
		took[i] = time.Since(start)
	}
	return s.done(took), nil
}

// done is s's timing from each timed run's duration (at least one).
func (s stageRun) done(took []time.Duration) StageTiming {
	t := s.t
	t.Runs = len(took)
	var total time.Duration
	for _, d := range took {
		total += d
	}
	t.Mean = total / time.Duration(len(took))
	sorted := slices.Sorted(slices.Values(took))
	t.Min = sorted[0]
	t.Median = sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		t.Median = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	t.AudioPerSecond = s.audio / t.Mean.Seconds()
	return t
}

// timeTogether runs every stage in its own goroutine, over and over, until each has done runs
// runs, and times each stage's runs; a stage that finishes first keeps running so that the
// others are timed beside it to the end.
func timeTogether(stages []stageRun, runs int) ([]StageTiming, error) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	left := sync.WaitGroup{}
	left.Add(len(stages))
	out := make([]StageTiming, len(stages))
	errs := make([]error, len(stages))
	for i, st := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var took []time.Duration
			reached := false
			defer func() {
				if !reached {
					left.Done()
				}
			}()
			for !stop.Load() {
				start := time.Now()
				if err := st.run(); err != nil {
					errs[i] = st.fail(err)
					stop.Store(true)
					return
				}
				took = append(took, time.Since(start))
				if len(took) == runs {
					reached = true
					left.Done()
				}
			}
			// Another stage's error can stop this one before its first run: then it has no timing,
			// and the error is what the caller gets.
			if len(took) > 0 {
				out[i] = st.done(took)
				out[i].Together = true
			}
		}()
	}
	left.Wait()
	stop.Store(true)
	wg.Wait()
	return out, errors.Join(errs...)
}
