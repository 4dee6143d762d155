package engine

import (
	"sync/atomic"
	"testing"
	"time"
)

// A cancel counts once, however many stages let go of its request; a request not cancelled
// counts not at all.
func TestCancelsLeft(t *testing.T) {
	var c Cancels
	var at, none atomic.Int64
	at.Store(time.Now().Add(-time.Second).UnixNano())
	c.Left(&at)
	c.Left(&at)
	c.Left(&none)
	c.Add(0)
	s := c.Stats()
	if s.Count != 2 || s.Freeing < time.Second || s.MaxFreeing != s.Freeing || at.Load() != -1 {
		t.Errorf("stats %+v, cancel mark %d; want 2 cancels, one of a second or more, counted (-1)", s, at.Load())
	}
}
