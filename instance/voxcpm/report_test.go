package voxcpm

import (
	"testing"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/engine/enginetest"
	"github.com/voxmux/voxmux/tts"
)

// The runner counts cancelled requests and its stages' runs, as the family opens it (one engine)
// and as replicas over two engines (a group on two GPUs; on the CPU both are device 0's), which
// report as one.
func TestRunnerReports(t *testing.T) {
	req := tts.Request{Text: "Hello world, this is a test of a longer request.", Seed: 1}
	t.Run("one", func(t *testing.T) {
		enginetest.CheckCancelReport(t, tinyEngine(t, 4), req, 2)
	})
	t.Run("replicas", func(t *testing.T) {
		r, err := engine.OpenReplicas(2, func(int) (*Engine, error) { return tinyEngine(t, 4), nil })
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.(*engine.Replicas[*Engine]); !ok {
			t.Fatalf("two devices opened %T, want replicas", r)
		}
		enginetest.CheckCancelReport(t, r, req, 2)
	})
}
