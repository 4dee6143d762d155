package staged

import (
	"fmt"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// vocItem is one chunk's mel window waiting for the vocoder.
type vocItem struct {
	s      *stream
	queued time.Time
	win    vocWindow // the mel and which of its audio is kept
	first  bool
	last   bool
	text   tts.TextSpan
}

// vocoderLoop runs the waiting windows in batches (of frames up to vocFrames, lengths within
// spread, one window per stream where a window's phase comes from the one before) and hands each
// stream its audio.
func (e *Engine) vocoderLoop() {
	defer e.wg.Done()
	m := e.p.m
	hop, rate := m.Vocoder.Hop, m.SampleRate
	for {
		items, ok := e.vocQ.PopAll()
		if !ok {
			return
		}
		items = liveItems(e, items, func(it *vocItem) *stream { return it.s })
		items, rest := engine.TakeBatch(items, e.vocFrames, e.spread, nil, func(it *vocItem) (int, bool, *stream) {
			return len(it.win.mel) / m.Flow.MelBins, it.first, it.s
		})
		if m.Vocoder.SourcePhase > 0 {
			// A window's phase comes from its stream's window before it.
			items, rest = oneWindowPerStream(items, rest)
		}
		e.vocQ.PushFront(rest)
		if len(items) == 0 {
			continue
		}
		jobs := make([]vocJob, len(items))
		t0 := time.Now()
		var err error
		for i, it := range items {
			jobs[i] = vocJob{mel: it.win.mel, offset: int64(it.win.start * hop)}
			if m.Vocoder.SourcePhase > 0 && err == nil {
				jobs[i].phase, jobs[i].phaseAt, err = windowPhase(m, it.s.vocPhase, it.win.start)
			}
			e.stats.Waited(stageVocoder, t0, it.queued)
		}
		var audio, phase [][]float32
		if err == nil {
			audio, phase, err = e.p.voc.runJobs(jobs)
		}
		e.stats.Count(stageVocoder, len(jobs), t0)
		for i, it := range items {
			if err != nil {
				it.s.finish(fmt.Errorf("vocoder: %w", err))
				e.release(it.s)
				continue
			}
			if phase != nil {
				it.s.vocPhase = &vocPhase{start: it.win.start, out: phase[i]}
			}
			it.s.push(audio[i][it.win.keepFrom*hop:it.win.keepTo*hop], rate, it.text)
			if it.first {
				e.firstAudioOut(it.s)
			}
			// Released before the last chunk finishes the stream: a request whose Synthesize has
			// returned is no longer counted as active.
			e.release(it.s)
			if it.last {
				it.s.finish(nil)
			}
		}
	}
}

// oneWindowPerStream keeps the first of each stream's items in take; the others wait in rest,
// ahead of what rest held.
func oneWindowPerStream(take, rest []*vocItem) ([]*vocItem, []*vocItem) {
	seen := map[*stream]bool{}
	var keep, wait []*vocItem
	for _, it := range take {
		if seen[it.s] {
			wait = append(wait, it)
			continue
		}
		seen[it.s] = true
		keep = append(keep, it)
	}
	return keep, append(wait, rest...)
}
