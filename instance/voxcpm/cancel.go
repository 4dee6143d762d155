package voxcpm

import (
	"context"
	"sync"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// What a cancel costs the engine: a request cancelled while it waits for a slot or holds one is
// dropped by the scheduler before its next step; the time from the cancel until then is engine
// time spent on audio nobody will hear (tts.CancelStats).

// cancelCounters sum the engine's cancels.
type cancelCounters struct {
	mu    sync.Mutex
	stats tts.CancelStats
}

// left records that the scheduler dropped cancelled request r.
func (c *cancelCounters) left(r *request) {
	t := r.cancelAt.Load()
	if t <= 0 || !r.cancelAt.CompareAndSwap(t, -1) {
		return
	}
	d := time.Since(time.Unix(0, t))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Count++
	c.stats.Freeing += d
	c.stats.MaxFreeing = max(c.stats.MaxFreeing, d)
}

// CancelStats sums the requests cancelled while the engine held them and the time each took to
// leave it.
func (e *Engine) CancelStats() tts.CancelStats {
	e.cancels.mu.Lock()
	defer e.cancels.mu.Unlock()
	return e.cancels.stats
}

// watchCancel notes when r's request is cancelled before its audio is complete; the returned
// func stops watching.
func (e *Engine) watchCancel(r *request) func() bool {
	return context.AfterFunc(r.ctx, func() {
		r.mu.Lock()
		ended := r.closed
		r.mu.Unlock()
		if !ended {
			r.cancelAt.CompareAndSwap(0, time.Now().UnixNano())
		}
	})
}
