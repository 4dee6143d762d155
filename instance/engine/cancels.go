package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// Cancels sums what cancelled requests cost an engine: how many, and the time from each cancel
// until the engine let go of its request (tts.CancelStats). Safe for concurrent use; the zero
// value is ready.
type Cancels struct {
	mu    sync.Mutex
	stats tts.CancelStats
}

// Add records one cancel that took d to leave the engine.
func (c *Cancels) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Count++
	c.stats.Freeing += d
	c.stats.MaxFreeing = max(c.stats.MaxFreeing, d)
}

// Left records a request leaving the engine whose cancel was noted in at: UnixNano of the
// cancel, 0 when not cancelled, -1 once counted. A cancel is counted once, whoever sees it first.
func (c *Cancels) Left(at *atomic.Int64) {
	if t := at.Load(); t > 0 && at.CompareAndSwap(t, -1) {
		c.Add(time.Since(time.Unix(0, t)))
	}
}

// Stats returns the sums so far.
func (c *Cancels) Stats() tts.CancelStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}
