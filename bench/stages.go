package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Counters a voxmux router exposes on /metrics for its instances' pipeline stages, one series
// per stage and instance (docs/api.md).
const (
	MetricStageBatches = "voxmux_stage_batches_total"
	MetricStageItems   = "voxmux_stage_batch_items_total"
	MetricStageBusy    = "voxmux_stage_busy_seconds_total"
	MetricStageWait    = "voxmux_stage_wait_seconds_total"
)

// StageStat is one pipeline stage over one level: the server's stage counters, summed over its
// instances, between the level's start and end. It says where a level's time went, stage by
// stage, without reading the instances' logs.
type StageStat struct {
	Stage     string `json:"stage"`
	Instances int    `json:"instances"` // instances that report the stage
	Runs      uint64 `json:"runs"`      // batched runs in the window
	// WindowSeconds is the time between the two readings the figures come from.
	WindowSeconds float64 `json:"window_seconds"`
	RunsPerSecond Value   `json:"runs_per_second"`
	MeanBatch     Value   `json:"mean_batch"`  // items per run
	MeanRunMs     Value   `json:"mean_run_ms"` // null when the server has no busy counter
	// BusyPct is the share of the window one instance's stage was running, in percent; a stage
	// that runs several batches at once (the flow's workers) can pass 100.
	BusyPct Value `json:"busy_pct"`
	// MeanWaiting is how many items waited for one instance's stage on average (its summed
	// wait over the window); null when the server has no wait counter.
	MeanWaiting Value `json:"mean_waiting"`
}

// stageCounters is one stage's counters summed over instances.
type stageCounters struct {
	batches, items, busy, wait float64
	instances                  int
	hasBusy, hasWait           bool
}

// stageReading is a server's stage counters at one time.
type stageReading struct {
	at     time.Time
	stages map[string]*stageCounters
}

// stageReadingFrom sums the stage counters of families by stage; ok is false when there are none
// (a server that is not voxmux, or one whose instances have not reported yet).
func stageReadingFrom(families map[string]*dto.MetricFamily, at time.Time) (r stageReading, ok bool) {
	r = stageReading{at: at, stages: map[string]*stageCounters{}}
	add := func(name string, f func(c *stageCounters, v float64)) {
		for _, m := range families[name].GetMetric() {
			stage := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					stage = l.GetValue()
				}
			}
			if stage == "" {
				continue
			}
			c := r.stages[stage]
			if c == nil {
				c = &stageCounters{}
				r.stages[stage] = c
			}
			f(c, counterValue(m))
		}
	}
	add(MetricStageBatches, func(c *stageCounters, v float64) { c.batches += v; c.instances++ })
	add(MetricStageItems, func(c *stageCounters, v float64) { c.items += v })
	add(MetricStageBusy, func(c *stageCounters, v float64) { c.busy += v; c.hasBusy = true })
	add(MetricStageWait, func(c *stageCounters, v float64) { c.wait += v; c.hasWait = true })
	return r, len(r.stages) > 0
}

// counterValue reads a series whether the server typed it as a counter or left it untyped.
func counterValue(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetUntyped().GetValue()
}

// stageOrder is the order of a staged pipeline; other stages follow by name.
var stageOrder = []string{"lm_prefill", "lm_decode", "flow", "vocoder"}

func compareStages(a, b string) int {
	ia, ib := slices.Index(stageOrder, a), slices.Index(stageOrder, b)
	switch {
	case ia >= 0 && ib >= 0:
		return cmp.Compare(ia, ib)
	case ia >= 0:
		return -1
	case ib >= 0:
		return 1
	}
	return strings.Compare(a, b)
}

// stageStats are the stages' figures between readings a and b. A stage whose counters went
// down (its instance restarted in between) or whose instances changed is left out: its window
// is not the level's.
func stageStats(a, b stageReading) []StageStat {
	window := b.at.Sub(a.at).Seconds()
	var out []StageStat
	for name, cb := range b.stages {
		ca := a.stages[name]
		if ca == nil || ca.instances != cb.instances || window <= 0 {
			continue
		}
		runs, items, busy, wait := cb.batches-ca.batches, cb.items-ca.items, cb.busy-ca.busy, cb.wait-ca.wait
		if runs < 0 || items < 0 || busy < 0 || wait < 0 {
			continue
		}
		s := StageStat{Stage: name, Instances: cb.instances, Runs: uint64(runs), WindowSeconds: window,
			RunsPerSecond: Value(runs / window), MeanBatch: Value(math.NaN()), MeanRunMs: Value(math.NaN()), BusyPct: Value(math.NaN()),
			MeanWaiting: Value(math.NaN())}
		if runs > 0 {
			s.MeanBatch = Value(items / runs)
		}
		if cb.hasBusy && ca.hasBusy {
			s.BusyPct = Value(100 * busy / window / float64(cb.instances))
			if runs > 0 {
				s.MeanRunMs = Value(1000 * busy / runs)
			}
		}
		if cb.hasWait && ca.hasWait {
			s.MeanWaiting = Value(wait / window / float64(cb.instances))
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(x, y StageStat) int { return compareStages(x.Stage, y.Stage) })
	return out
}

// stageReader reads a target's stage counters from its /metrics.
type stageReader struct{ m *MetricsSampler }

// errNoStageCounters means the server's /metrics has no stage counters.
var errNoStageCounters = errors.New("no " + MetricStageBatches + " series")

// errStagesPending means a voxmux router has a ready instance but no stage counters from it yet:
// it asks its instances for them every 2 s, so they follow an instance's start by up to that.
var errStagesPending = fmt.Errorf("%w yet from the router's ready instances", errNoStageCounters)

// stagesWait is how long a reading waits for a router's pending stage counters.
const stagesWait = 3 * time.Second

// read reads the stage counters; while a router's are pending it tries again for up to
// stagesWait.
func (r stageReader) read(ctx context.Context) (stageReading, error) {
	deadline := time.Now().Add(stagesWait)
	for {
		rd, err := r.readOnce(ctx)
		if !errors.Is(err, errStagesPending) || time.Now().After(deadline) {
			return rd, err
		}
		select {
		case <-ctx.Done():
			return rd, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (r stageReader) readOnce(ctx context.Context) (stageReading, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	fams, err := r.m.families(ctx)
	if err != nil {
		return stageReading{}, err
	}
	if rd, ok := stageReadingFrom(fams, time.Now()); ok {
		return rd, nil
	}
	for _, m := range fams[metricInstanceReady].GetMetric() {
		if gaugeValue(m) == 1 {
			return stageReading{}, errStagesPending
		}
	}
	return stageReading{}, errNoStageCounters
}

// metricInstanceReady is a voxmux router's gauge of each instance's readiness.
const metricInstanceReady = "voxmux_instance_ready"

// stageTable is the markdown table of the levels' stage figures, with the reasons of levels that
// have none, or "" when there is neither.
func stageTable(t TargetResult) string {
	var names []string
	for _, l := range t.Levels {
		for _, s := range l.Stages {
			if !slices.Contains(names, s.Stage) {
				names = append(names, s.Stage)
			}
		}
	}
	var notes strings.Builder
	for _, l := range t.Levels {
		if l.StageError != "" {
			fmt.Fprintf(&notes, "- concurrency %d: %s\n", l.Concurrency, l.StageError)
		}
	}
	if len(names) == 0 {
		if notes.Len() > 0 {
			return "No stage figures:\n\n" + notes.String() + "\n"
		}
		return ""
	}
	slices.SortFunc(names, compareStages)
	var b strings.Builder
	b.WriteString("Where the time went, from the server's stage counters (`" + MetricStageBatches + "` and the like, summed over its instances; " +
		"the router refreshes them every 2 s, so a level's window is its own give or take 2 s). " +
		"Each cell: mean batch × mean run time, and the share of the window one instance's stage was running " +
		"(a stage that runs several batches at once, such as the flow's workers, can pass 100%); " +
		"then, where the server counts it, how many items waited for one instance's stage on average.\n\n")
	b.WriteString("| concurrency | " + strings.Join(names, " | ") + " |\n")
	b.WriteString("|---:|" + strings.Repeat("---|", len(names)) + "\n")
	for _, l := range t.Levels {
		if len(l.Stages) == 0 {
			continue
		}
		cells := make([]string, len(names))
		for i, n := range names {
			cells[i] = "–"
			for _, s := range l.Stages {
				if s.Stage == n {
					cells[i] = fmt.Sprintf("%s × %s ms, %s%%", num(s.MeanBatch, 1), num(s.MeanRunMs, 1), num(s.BusyPct, 0))
					if !math.IsNaN(float64(s.MeanWaiting)) {
						cells[i] += fmt.Sprintf(", %s waiting", num(s.MeanWaiting, 1))
					}
				}
			}
		}
		fmt.Fprintf(&b, "| %d | %s |\n", l.Concurrency, strings.Join(cells, " | "))
	}
	b.WriteString("\n")
	if notes.Len() > 0 {
		b.WriteString("Levels without stage figures:\n\n" + notes.String() + "\n")
	}
	return b.String()
}

// levelStages are a level's stage figures from the readings at its start and end, or why there
// are none. A server without stage counters (not voxmux: no reading of this level or an earlier
// one, stageServer, found any) gets neither; one that has them says what went wrong.
func levelStages(before stageReading, berr error, after stageReading, aerr error, stageServer bool) ([]StageStat, string) {
	switch {
	case berr == nil && aerr == nil:
		return stageStats(before, after), ""
	case stageServer || berr == nil || aerr == nil:
		return nil, fmt.Sprintf("stage counters at the level's start: %s; at its end: %s", errText(berr), errText(aerr))
	}
	return nil, ""
}

// errText is err's message, or "read" for none.
func errText(err error) string {
	if err == nil {
		return "read"
	}
	return err.Error()
}
