package piper

import (
	"testing"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/engine/enginetest"
	"github.com/voxmux/voxmux/tts"
)

// reportText is several sentences: a request cancelled at its first is still under way.
const reportText = "One sentence. Another sentence. A third one. And a fourth."

// The runner counts cancelled requests and its graph runs, alone and as replicas over two
// runners (Piper runs a group on one GPU; the shared replicas type reports for any family).
func TestRunnerReports(t *testing.T) {
	t.Run("one", func(t *testing.T) {
		r, _ := openTinyPiper(t, tinyPiperDir)
		enginetest.CheckCancelReport(t, r, tts.Request{Text: reportText}, 2)
		if st := r.Report().Stages; len(st) != 1 || st[0].Stage != "vits" {
			t.Errorf("stages %+v, want the graph's runs alone", st)
		}
	})
	t.Run("replicas", func(t *testing.T) {
		a, _ := openTinyPiper(t, tinyPiperDir)
		b, _ := openTinyPiper(t, tinyPiperDir)
		enginetest.CheckCancelReport(t, engine.NewReplicas([]*Runner{a, b}), tts.Request{Text: reportText}, 2)
	})
}

// A request that completes, then has its context cancelled, costs nothing; one refused costs
// nothing either.
func TestRunnerCountsOnlyUnfinished(t *testing.T) {
	r, _ := openTinyPiper(t, tinyPiperDir)
	speak(t, r, tts.Request{Text: reportText})
	if err := r.Synthesize(t.Context(), tts.Request{Text: reportText, Voice: "nobody"}, func(tts.Chunk) error { return nil }); err == nil {
		t.Fatal("an unknown voice spoke")
	}
	rep := r.Report()
	if rep.Cancels.Count != 0 {
		t.Errorf("cancels %+v, want none", rep.Cancels)
	}
	if rep.Stages[stageGraph].Batches == 0 || rep.Stages[stageGraph].Items < 4 {
		t.Errorf("stages %+v: want a run per sentence at least", rep.Stages)
	}
}
