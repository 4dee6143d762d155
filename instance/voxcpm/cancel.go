package voxcpm

import (
	"context"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// What a cancel costs the engine: a request cancelled while it waits for a slot or holds one is
// dropped by the scheduler before its next step; the time from the cancel until then is engine
// time spent on audio nobody will hear (tts.CancelStats).

// cancelCounters sum the engine's cancels.
type cancelCounters struct {
	engine.Cancels
}

// left records that the scheduler dropped request r for its ended context: a cancel, counted
// even where watchCancel's callback, which runs on a goroutine of its own, has not marked it yet.
func (c *cancelCounters) left(r *request) {
	r.cancelAt.CompareAndSwap(0, time.Now().UnixNano())
	c.Left(&r.cancelAt)
}

// CancelStats sums the requests cancelled while the engine held them and the time each took to
// leave it.
func (e *Engine) CancelStats() tts.CancelStats { return e.cancels.Stats() }

// watchCancel notes when r's request is cancelled before its audio is complete; the returned
// func stops watching.
func (e *Engine) watchCancel(r *request) func() bool {
	return context.AfterFunc(r.ctx, func() {
		if ended, _ := r.out.Ended(); !ended {
			r.cancelAt.CompareAndSwap(0, time.Now().UnixNano())
		}
	})
}
