package voxcpm

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// runAlone runs reqs on e one after another; a request that fails fails t.
func runAlone(t *testing.T, e *Engine, reqs []tts.Request) []result {
	t.Helper()
	out := make([]result, len(reqs))
	for i, req := range reqs {
		if out[i] = run(t, e, req); out[i].err != nil {
			t.Fatal(out[i].err)
		}
	}
	return out
}

// runTogether runs reqs on e at once, request i after wait(i) (nil: none), and returns their
// results in order.
func runTogether(t *testing.T, e *Engine, reqs []tts.Request, wait func(i int) time.Duration) []result {
	out := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if wait != nil {
				time.Sleep(wait(i))
			}
			out[i] = run(t, e, req)
		}()
	}
	wg.Wait()
	return out
}

// cancelAfter runs req on e and cancels it once its n-th chunk has come; it returns what
// Synthesize did.
func cancelAfter(e *Engine, req tts.Request, n int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := 0
	return e.Synthesize(ctx, req, func(tts.Chunk) error {
		if got++; got == n {
			cancel()
		}
		return nil
	})
}

// waitSlotsFree fails t unless every slot of e is free within d; after says after what.
func waitSlotsFree(t *testing.T, e *Engine, d time.Duration, after string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for e.Slots() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still held after %s", e.Slots(), after)
		}
		time.Sleep(time.Millisecond)
	}
}
