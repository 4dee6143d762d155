package staged

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/ort"
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
		if r.Min <= 0 || r.Min > r.Median || r.Min > r.Mean {
			t.Errorf("timing %d: fastest run %v, median %v, mean %v; want 0 < fastest ≤ median and mean", i, r.Min, r.Median, r.Mean)
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

// A timing's mean, median and fastest run come from each run's own duration: one slow run lifts
// the mean and leaves the median.
func TestStageTimingFromRuns(t *testing.T) {
	ms := time.Millisecond
	s := stageRun{t: StageTiming{Stage: "lm_decode", Batch: 4}, audio: 0.16}
	got := s.done([]time.Duration{2 * ms, 1 * ms, 13 * ms, 3 * ms, 1 * ms})
	if got.Runs != 5 || got.Mean != 4*ms || got.Median != 2*ms || got.Min != ms || got.AudioPerSecond != 40 {
		t.Errorf("runs of 2, 1, 13, 3 and 1 ms: %+v; want 5 runs, mean 4 ms, median 2 ms, fastest 1 ms, 40 audio s per s", got)
	}
	if got := s.done([]time.Duration{4 * ms, 1 * ms, 2 * ms, 9 * ms}); got.Median != 3*ms {
		t.Errorf("runs of 4, 1, 2 and 9 ms: median %v, want 3ms (between the middle two)", got.Median)
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
	p, err := loadTiny(t, Options{Options: ort.Options{Profile: filepath.Join(dir, "run-")}})
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
}

// A stage that fails at once stops the others, some perhaps before their first run: the error
// comes back, and a stage without runs has no timing instead of a division by zero.
func TestTimeTogetherStageFails(t *testing.T) {
	// On one thread the stage started last runs first, so the failing one, last here, stops the
	// other before its first run.
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(1))
	for i := 0; i < 20; i++ {
		stages := []stageRun{
			{t: StageTiming{Stage: "flow"}, audio: 1, run: func() error { time.Sleep(100 * time.Microsecond); return nil }},
			{t: StageTiming{Stage: "lm_decode"}, run: func() error { return errors.New("boom") }},
		}
		if _, err := timeTogether(stages, 3); err == nil || !strings.Contains(err.Error(), "boom") {
			t.Fatalf("err %v, want the failing stage's", err)
		}
	}
}
