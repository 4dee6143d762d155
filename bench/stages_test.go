package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func stageMetricsText(readings int, withBusy bool) string {
	var b strings.Builder
	n := float64(readings)
	for _, inst := range []string{"g0/0", "g1/0"} {
		fmt.Fprintf(&b, "voxmux_stage_batches_total{group=%q,instance=%q,stage=\"lm_decode\"} %g\n", inst[:2], inst, 100*n)
		fmt.Fprintf(&b, "voxmux_stage_batch_items_total{group=%q,instance=%q,stage=\"lm_decode\"} %g\n", inst[:2], inst, 4000*n)
		fmt.Fprintf(&b, "voxmux_stage_batches_total{group=%q,instance=%q,stage=\"flow\"} %g\n", inst[:2], inst, 10*n)
		fmt.Fprintf(&b, "voxmux_stage_batch_items_total{group=%q,instance=%q,stage=\"flow\"} %g\n", inst[:2], inst, 80*n)
		if withBusy {
			fmt.Fprintf(&b, "voxmux_stage_busy_seconds_total{group=%q,instance=%q,stage=\"lm_decode\"} %g\n", inst[:2], inst, 0.5*n)
			fmt.Fprintf(&b, "voxmux_stage_busy_seconds_total{group=%q,instance=%q,stage=\"flow\"} %g\n", inst[:2], inst, 1.5*n)
			fmt.Fprintf(&b, "voxmux_stage_wait_seconds_total{group=%q,instance=%q,stage=\"flow\"} %g\n", inst[:2], inst, 12*n)
		}
	}
	return b.String()
}

func readingOf(t *testing.T, text string, at time.Time) (stageReading, bool) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return stageReadingFrom(fams, at)
}

func TestStageStats(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, ok := readingOf(t, stageMetricsText(1, true), t0)
	if !ok {
		t.Fatal("no stages read")
	}
	b, _ := readingOf(t, stageMetricsText(3, true), t0.Add(2*time.Second))
	got := stageStats(a, b)
	if len(got) != 2 || got[0].Stage != "lm_decode" || got[1].Stage != "flow" {
		t.Fatalf("stages %+v, want lm_decode then flow", got)
	}
	// Two instances, each 200 decode runs of 40 rows and 2 s of busy time in a window of 2 s.
	d := got[0]
	if d.Instances != 2 || d.Runs != 400 || d.RunsPerSecond != 200 || d.MeanBatch != 40 || d.MeanRunMs != 5 || d.BusyPct != 50 {
		t.Errorf("lm_decode %+v", d)
	}
	// The flow's two workers kept each instance's flow busy 150% of the time.
	if f := got[1]; f.MeanBatch != 8 || f.MeanRunMs != 150 || f.BusyPct != 150 {
		t.Errorf("flow %+v", f)
	}
	// Each instance's flow items waited 24 s in all over the 2 s: 12 waiting at any time. The
	// decode steps have no wait counter.
	if w := got[1].MeanWaiting; w != 12 {
		t.Errorf("flow mean waiting %v, want 12", w)
	}
	if w := got[0].MeanWaiting; !math.IsNaN(float64(w)) {
		t.Errorf("lm_decode mean waiting %v, want none", w)
	}
	// A server without the busy counter: batches but no times.
	a, _ = readingOf(t, stageMetricsText(1, false), t0)
	b, _ = readingOf(t, stageMetricsText(2, false), t0.Add(time.Second))
	if got := stageStats(a, b); len(got) != 2 || got[0].MeanBatch != 40 || !math.IsNaN(float64(got[0].MeanRunMs)) || !math.IsNaN(float64(got[0].BusyPct)) {
		t.Errorf("without busy counters: %+v", got)
	}
	// Counters that went down (an instance restarted) leave the stage out.
	if got := stageStats(b, a); len(got) != 0 {
		t.Errorf("counters going down: %+v, want none", got)
	}
	if _, ok := readingOf(t, "voxmux_requests_total 3\n", t0); ok {
		t.Error("a server without stage counters read as having stages")
	}
}

// A level's readings that failed are named, unless the server never had stage counters.
func TestLevelStages(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, _ := readingOf(t, stageMetricsText(1, true), t0)
	b, _ := readingOf(t, stageMetricsText(2, true), t0.Add(time.Second))
	if st, msg := levelStages(a, nil, b, nil, true); len(st) != 2 || msg != "" {
		t.Errorf("both read: %d stages, %q", len(st), msg)
	}
	fail := errors.New("connection refused")
	if st, msg := levelStages(stageReading{}, fail, b, nil, true); st != nil || msg != "stage counters at the level's start: connection refused; at its end: read" {
		t.Errorf("start failed: %v, %q", st, msg)
	}
	// Not voxmux: no counters at either end, nothing to say.
	if st, msg := levelStages(stageReading{}, errNoStageCounters, stageReading{}, errNoStageCounters, false); st != nil || msg != "" {
		t.Errorf("no stage server: %v, %q", st, msg)
	}
	// A voxmux server whose counters vanished says so.
	if _, msg := levelStages(stageReading{}, errNoStageCounters, stageReading{}, errNoStageCounters, true); !strings.Contains(msg, "no voxmux_stage_batches_total series") {
		t.Errorf("counters gone: %q", msg)
	}
	var md strings.Builder
	md.WriteString(stageTable(TargetResult{Levels: []LevelResult{{Concurrency: 1, StageError: "stage counters at the level's start: x; at its end: read"}}}))
	if !strings.Contains(md.String(), "- concurrency 1: stage counters at the level's start: x") {
		t.Errorf("markdown lacks the reason:\n%s", md.String())
	}
}

// A level against a server with stage counters reports them, in JSON and as a markdown table.
func TestStagesFromServerMetrics(t *testing.T) {
	var reads atomic.Int64
	fake := &fakeTTS{rate: 24000, samplesPerChar: 10, metricsFunc: func() string {
		return stageMetricsText(int(reads.Add(1)), true)
	}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{1, 2},
		RequestsPerLevel: 2,
		Corpus:           []Sentence{{"en", "Hi."}},
		SampleInterval:   time.Hour, // the GPU recorder reads /metrics once per level at most
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.Targets[0].Levels {
		if len(l.Stages) != 2 || l.Stages[0].Stage != "lm_decode" || l.Stages[0].MeanBatch != 40 || l.Stages[1].MeanBatch != 8 {
			t.Errorf("level %d: stages %+v", l.Concurrency, l.Stages)
		}
	}
	if md := markdown(t, rep); !strings.Contains(md, "| concurrency | lm_decode | flow |") || !strings.Contains(md, "| 1 | 40.0 × 5.0 ms, ") ||
		!strings.Contains(md, " waiting |") {
		t.Errorf("markdown lacks the stage table:\n%s", md)
	}
}

// A router that has not reported its instances' stage counters yet (they follow an instance's
// start by up to 2 s) is waited for, so the first level has figures too.
func TestStagesPendingAtFirstLevel(t *testing.T) {
	var reads atomic.Int64
	start := time.Now()
	fake := &fakeTTS{rate: 24000, samplesPerChar: 10, metricsFunc: func() string {
		n := reads.Add(1)
		if time.Since(start) < 600*time.Millisecond {
			return "voxmux_instance_ready{group=\"g0\",instance=\"g0/0\"} 1\n"
		}
		return stageMetricsText(int(n), true)
	}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{1},
		RequestsPerLevel: 1,
		Corpus:           []Sentence{{"en", "Hi."}},
		SampleInterval:   time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := rep.Targets[0].Levels[0]; len(l.Stages) != 2 || l.StageError != "" {
		t.Errorf("first level: stages %+v, error %q", l.Stages, l.StageError)
	}
	// A server without stage counters is not waited for.
	began := time.Now()
	plain := httptest.NewServer(&fakeTTS{metrics: "voxmux_requests_total 1\n"})
	defer plain.Close()
	r := stageReader{&MetricsSampler{Client: plain.Client(), URL: plain.URL}}
	if _, err := r.read(context.Background()); !errors.Is(err, errNoStageCounters) || errors.Is(err, errStagesPending) || time.Since(began) > time.Second {
		t.Errorf("plain server: %v after %v", err, time.Since(began))
	}
}
