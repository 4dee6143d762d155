package staged

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// What a cancel costs the engine. A stream is held by the LM loop from its arrival until its last
// speech token, and by each of its chunks while the chunk waits for or runs in the flow or the
// vocoder. A request cancelled while the engine still holds its stream (its client left, a
// WebSocket context closed) is dropped by the LM loop before its next decode step, from the flow
// and vocoder queues when they next take work, and from a flow batch under way at its next Euler
// step when every item of the batch was cancelled; the time from the cancel until nothing holds
// the stream is the engine time the cancel wasted (tts.CancelStats).

// cancelCounters sums the engine's cancels.
type cancelCounters struct {
	engine.Cancels
	mu sync.Mutex
	// The most decode steps that started between a cancel and its stream leaving the LM's batch.
	maxLMSteps int64
}

// leftLM records a cancelled stream leaving the LM's batch when steps decode steps had started.
func (c *cancelCounters) leftLM(s *stream, steps int64) {
	at := s.cancelStep.Load()
	if at == 0 {
		return // dropped before the cancel's watcher ran: no step started in between
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.maxLMSteps = max(c.maxLMSteps, steps-(at-1))
}

// CancelStats sums the requests cancelled while the engine held them and the time each took to
// leave every stage.
func (e *Engine) CancelStats() tts.CancelStats { return e.cancels.Stats() }

// CancelSteps is the most decode steps that started between a cancel and its stream leaving
// the LM's batch: 0 or 1 (the step under way when the cancel came) when cancels act within one step.
func (e *Engine) CancelSteps() int64 {
	e.cancels.mu.Lock()
	defer e.cancels.mu.Unlock()
	return e.cancels.maxLMSteps
}

// Active is the number of streams some stage holds now: in the LM's batch or waiting for it, or
// with a chunk waiting for or in the flow or the vocoder.
func (e *Engine) Active() int { return int(e.active.Load()) }

// hold marks s as held by one more stage (the LM loop, a flow or vocoder item).
func (e *Engine) hold(s *stream) {
	if s.held.Add(1) == 1 {
		e.active.Add(1)
	}
}

// release ends one stage's hold on s; the last one records a cancel's cost.
func (e *Engine) release(s *stream) {
	if s.held.Add(-1) != 0 {
		return
	}
	e.active.Add(-1)
	e.cancels.Left(&s.cancelAt)
	// No stage holds the stream: its kept keys and values go.
	e.freeKV(s)
}

// watchCancel notes when s's request is cancelled while the engine still works on it (not when
// it ends after its audio is complete, or failed). The returned func stops watching; when it
// returns true the watch never ran, and Synthesize notes the cancel itself (abandon).
func (e *Engine) watchCancel(s *stream) func() bool {
	return context.AfterFunc(s.ctx, func() { e.noteCancel(s) })
}

// abandon notes the cancel of a stream that Synthesize leaves early (its request's context ended
// or emit failed) while watchCancel's watch had not run: the context package closes a context's
// Done before it starts the watch's goroutine, so Synthesize can wake, return and stop the watch
// first; without this, such a cancel went uncounted.
func (e *Engine) abandon(s *stream, early bool) {
	if s.stopWatch() && early {
		e.noteCancel(s)
	}
}

// noteCancel marks s cancelled unless its output ended otherwise or no stage holds it; the
// stage that lets go of it last counts the cancel (release).
func (e *Engine) noteCancel(s *stream) {
	if closed, err := s.out.Ended(); (closed && !isCancel(err)) || s.held.Load() == 0 {
		return
	}
	s.cancelStep.Store(e.steps.Load() + 1)
	select { // its chunks waiting for the flow leave the queue now
	case e.wakeFlow <- struct{}{}:
	default:
	}
	now := time.Now().UnixNano()
	if !s.cancelAt.CompareAndSwap(0, now) {
		return
	}
	if s.held.Load() == 0 && s.cancelAt.CompareAndSwap(now, -1) {
		// Every stage let go between the two loads: nothing was wasted that release saw.
		e.cancels.Add(0)
	}
}

func isCancel(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// cancelledBatch returns a channel that closes once every item of a flow batch is cancelled or
// the engine shuts down, so the batch stops before its next Euler step; stop frees its watchers.
func cancelledBatch(items []*flowItem, done <-chan struct{}) (ch <-chan struct{}, stop func()) {
	c := make(chan struct{})
	var once sync.Once
	closeIt := func() { once.Do(func() { close(c) }) }
	var left atomic.Int64
	left.Store(int64(len(items)))
	stops := make([]func() bool, 0, len(items)+1)
	for _, it := range items {
		stops = append(stops, context.AfterFunc(it.s.ctx, func() {
			if left.Add(-1) == 0 {
				closeIt()
			}
		}))
	}
	quit := make(chan struct{})
	go func() {
		select {
		case <-done:
			closeIt()
		case <-quit:
		}
	}()
	return c, func() {
		close(quit)
		for _, s := range stops {
			s()
		}
	}
}
