package staged

import (
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/engine/enginetest"
	"github.com/voxmux/voxmux/tts"
)

// The runner counts cancelled requests and its stages' runs, as the family opens it (one engine)
// and as replicas over two engines (a group on two GPUs), which report as one.
func TestRunnerReports(t *testing.T) {
	req := tts.Request{Text: strings.Repeat("Streams are batched together at every stage. ", 6), Seed: 1}
	cfg := tts.LoadConfig{Manifest: "../../models/tiny/pipeline.yaml", Provider: "cpu", ORTLibrary: ortLibrary(t)}
	t.Run("one", func(t *testing.T) {
		r, _, err := Family{}.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		enginetest.CheckCancelReport(t, r, req, 4)
	})
	t.Run("replicas", func(t *testing.T) {
		r, err := engine.OpenReplicas(2, func(int) (*Engine, error) { return NewEngine(tinyPipeline(t)), nil })
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, ok := r.(*engine.Replicas[*Engine]); !ok {
			t.Fatalf("two devices opened %T, want replicas", r)
		}
		var _ instance.Runner = r
		enginetest.CheckCancelReport(t, r, req, 4)
	})
}

// A report's first audio names its parts in the order a request goes through them.
func TestReportFirstAudio(t *testing.T) {
	f := FirstAudio{Prefill: 1, Decode: 2, Flow: 3, Vocoder: 4}.parts()
	want := []string{"prefill", "decode", "flow", "vocoder"}
	for i, p := range f {
		if p.Name != want[i] || p.Took != time.Duration(i+1) {
			t.Errorf("part %d: %+v, want %s of %d", i, p, want[i], i+1)
		}
	}
}
