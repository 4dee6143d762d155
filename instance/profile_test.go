package instance

import (
	"strings"
	"testing"
)

func TestProfileStages(t *testing.T) {
	p := tinyPipeline(t)
	defer p.Close()
	var seen []string
	res, err := p.ProfileStages([]int{1, 3}, []int{6}, 2, func(s StageTiming) { seen = append(seen, s.Stage) })
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 6 || len(seen) != 6 {
		t.Fatalf("%d timings, %d progress calls; want 6 (3 stages × 2 batch sizes)", len(res), len(seen))
	}
	want := []string{"lm_decode", "flow", "vocoder", "lm_decode", "flow", "vocoder"}
	for i, r := range res {
		if r.Stage != want[i] || r.Runs != 2 || r.Tokens != 6 || r.Mean <= 0 || r.AudioPerSecond <= 0 {
			t.Errorf("timing %d = %+v, want stage %s, 2 runs, 6 tokens, positive time and rate", i, r, want[i])
		}
	}
	if res[0].Batch != 1 || res[3].Batch != 3 {
		t.Errorf("batches %d, %d; want 1, 3", res[0].Batch, res[3].Batch)
	}
	// The decoder is empty again: a later request starts from a clean batch.
	if p.lm.size() != 0 {
		t.Errorf("%d LM rows left after profiling", p.lm.size())
	}
	if _, err := p.ProfileStages([]int{1}, []int{6}, 0, nil); err == nil || !strings.Contains(err.Error(), "runs") {
		t.Errorf("runs 0: err %v, want one naming runs", err)
	}
}
