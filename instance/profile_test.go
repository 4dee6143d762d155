package instance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestProfileStages(t *testing.T) {
	p := tinyPipeline(t)
	defer p.Close()
	var seen []string
	res, err := p.ProfileStages(StageProfile{Batches: []int{1, 3}, Tokens: []int{6}, Runs: 2}, func(s StageTiming) { seen = append(seen, s.Stage) })
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
	if _, err := p.ProfileStages(StageProfile{Batches: []int{1}, Tokens: []int{6}}, nil); err == nil || !strings.Contains(err.Error(), "runs") {
		t.Errorf("runs 0: err %v, want one naming runs", err)
	}
}

func TestProfileStagesTogether(t *testing.T) {
	p := tinyPipeline(t)
	defer p.Close()
	res, err := p.ProfileStages(StageProfile{Batches: []int{2}, Tokens: []int{6}, Runs: 3, Together: true, Vary: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each stage alone, then the three again at once.
	want := []struct {
		stage    string
		together bool
	}{{"lm_decode", false}, {"flow", false}, {"vocoder", false}, {"lm_decode", true}, {"flow", true}, {"vocoder", true}}
	if len(res) != len(want) {
		t.Fatalf("%d timings, want %d", len(res), len(want))
	}
	for i, r := range res {
		if r.Stage != want[i].stage || r.Together != want[i].together || r.Runs < 3 || r.Mean <= 0 || r.Batch != 2 {
			t.Errorf("timing %d = %+v, want %s together=%v, at least 3 runs of batch 2", i, r, want[i].stage, want[i].together)
		}
	}
	if p.lm.size() != 0 {
		t.Errorf("%d LM rows left after profiling", p.lm.size())
	}
}

// The provider option profile makes ONNX Runtime profile every session of the pipeline, each to
// its own file, written when the pipeline closes.
func TestProfileOptionWritesEachSessionsProfile(t *testing.T) {
	dir := t.TempDir()
	p, err := loadTiny(t, map[string]string{"profile": filepath.Join(dir, "run-")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ProfileStages(StageProfile{Batches: []int{1}, Tokens: []int{6}, Runs: 1}, nil); err != nil {
		p.Close()
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lm", "flow_encoder", "flow_estimator", "vocoder"} {
		files, _ := filepath.Glob(filepath.Join(dir, "run-"+name+"_*.json"))
		if len(files) != 1 {
			t.Errorf("%s: %d profiles (%v), want 1", name, len(files), files)
			continue
		}
		b, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		var events []struct {
			Cat  string `json:"cat"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(b, &events); err != nil {
			t.Fatalf("%s: %v", files[0], err)
		}
		runs := 0
		for _, e := range events {
			if e.Cat == "Session" && e.Name == "model_run" {
				runs++
			}
		}
		if runs == 0 {
			t.Errorf("%s: no model_run events in %d", files[0], len(events))
		}
	}
	if _, err := loadTiny(t, map[string]string{"profile": ""}); err == nil || !strings.Contains(err.Error(), "profile") {
		t.Errorf("empty profile prefix: err %v, want one naming the option", err)
	}
}
