package piper

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
)

// The runner's one batched stage, in StageStats' names: a run of a voice's graph (batch.go), one
// batch of sentences of any requests for that voice file. Every voice file's runs count in it.
const stageGraph = 0

var stageNames = []string{"vits"}

// What a cancel costs the runner: a request holds it from its start until Synthesize returns, and
// each of its sentences holds it while it waits for or runs in a graph run. A request cancelled
// while held returns at once; its sentence leaves the queue when a worker next takes it, or leaves
// with the run it is in when that run ends. The time from the cancel until nothing holds the
// request is runner time the cancel wasted (tts.CancelStats).

// request is one Synthesize call's hold on the runner.
type request struct {
	held atomic.Int32
	// cancelAt is when the request was cancelled while held (UnixNano; 0: not cancelled, -1:
	// counted).
	cancelAt atomic.Int64
	// ended is set once Synthesize returned for a reason other than its context ending (the
	// audio complete, a bad request, emit failing): a later cancel cost nothing.
	ended atomic.Bool
}

// begin holds the runner for a request with context ctx; end, called with what Synthesize
// returns, lets go of it.
func (r *Runner) begin(ctx context.Context) (q *request, end func(error)) {
	q = &request{}
	q.held.Store(1)
	note := func() {
		if q.ended.Load() {
			return
		}
		now := time.Now().UnixNano()
		if !q.cancelAt.CompareAndSwap(0, now) {
			return
		}
		if q.held.Load() == 0 && q.cancelAt.CompareAndSwap(now, -1) {
			// Every hold ended between the two loads: nothing was wasted that release saw.
			r.cancels.Add(0)
		}
	}
	stop := context.AfterFunc(ctx, note)
	return q, func(err error) {
		if err == nil || ctx.Err() == nil {
			q.ended.Store(true)
		}
		// The context package closes Done before it starts the watch's goroutine, so Synthesize
		// can wake on the cancel and end here first: the cancel is noted here then.
		if stop() && ctx.Err() != nil {
			note()
		}
		r.release(q)
	}
}

// hold marks q as held by one more sentence.
func (r *Runner) hold(q *request) { q.held.Add(1) }

// release ends one hold on q; the last one records a cancel's cost.
func (r *Runner) release(q *request) {
	if q.held.Add(-1) == 0 {
		r.cancels.Left(&q.cancelAt)
	}
}

// Report is the runner's graph runs, over every voice file, and its cancels; it does not time
// its requests' first audio (a request's first audio is its first sentence's run).
func (r *Runner) Report() engine.Report {
	return engine.Report{Stages: r.stats.Stats(), Cancels: r.cancels.Stats()}
}
