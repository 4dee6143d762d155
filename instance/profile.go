package instance

import (
	"errors"
	"fmt"
	"math/rand/v2"
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
	// Runs were timed after one untimed run; Mean is their mean.
	Runs int           `json:"runs"`
	Mean time.Duration `json:"mean_ns"`
	// AudioPerSecond is seconds of audio the stage turns out per second of its time at this
	// shape: the ceiling it puts on throughput (the LM's is tokens per second / token rate).
	AudioPerSecond float64 `json:"audio_per_second"`
}

// ProfileStages times each batched stage of p in isolation (nothing else on the device): the LM
// decode step, the whole flow (encoder and every solver step) and the vocoder, at every batch
// size for items of each length in tokens. It is how docs/benchmarks explains where the time of
// a load test goes. It drives the LM decoder directly, so p must not be serving an Engine at the
// same time. progress is called before each shape.
func (p *Pipeline) ProfileStages(batches, tokens []int, runs int, progress func(StageTiming)) ([]StageTiming, error) {
	if runs < 1 {
		return nil, errors.New("profile: runs must be at least 1")
	}
	m := p.m
	rng := rand.New(rand.NewPCG(1, 2))
	token := func() int64 { return int64(rng.IntN(m.LM.SpeechVocab)) }
	R, C := m.Flow.FramesPerToken, m.Flow.MelBins
	tokenSec := 1 / float64(m.LM.TokenRate)
	var out []StageTiming
	timeIt := func(t StageTiming, audio float64, run func() error) error {
		if progress != nil {
			progress(t)
		}
		if err := run(); err != nil { // untimed: first runs allocate and pick kernels
			return fmt.Errorf("%s, batch %d × %d tokens: %w", t.Stage, t.Batch, t.Tokens, err)
		}
		start := time.Now()
		for i := 0; i < runs; i++ {
			if err := run(); err != nil {
				return fmt.Errorf("%s, batch %d × %d tokens: %w", t.Stage, t.Batch, t.Tokens, err)
			}
		}
		t.Runs = runs
		t.Mean = time.Since(start) / time.Duration(runs)
		t.AudioPerSecond = audio / t.Mean.Seconds()
		out = append(out, t)
		return nil
	}
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
			ids := make([]int64, b)
			err = timeIt(StageTiming{Stage: "lm_decode", Batch: b, Tokens: n}, float64(b)*tokenSec, func() error {
				_, err := p.lm.step(rows, ids)
				return err
			})
			p.lm.release()
			if err != nil {
				return out, err
			}
			// Flow and vocoder: b chunks of n tokens.
			jobs := make([]flowJob, b)
			mels := make([][]float32, b)
			for i := range jobs {
				jobs[i].tokens = make([]int64, n)
				for j := range jobs[i].tokens {
					jobs[i].tokens[j] = token()
				}
				jobs[i].noise = p.noise(uint64(i), 0, n*R)
				mels[i] = make([]float32, C*n*R)
				for j := range mels[i] {
					mels[i][j] = float32(rng.NormFloat64())
				}
			}
			audio := float64(b*n) * tokenSec
			if err := timeIt(StageTiming{Stage: "flow", Batch: b, Tokens: n}, audio, func() error {
				_, err := p.flow.run(jobs)
				return err
			}); err != nil {
				return out, err
			}
			if err := timeIt(StageTiming{Stage: "vocoder", Batch: b, Tokens: n}, audio, func() error {
				_, err := p.voc.run(mels)
				return err
			}); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}
