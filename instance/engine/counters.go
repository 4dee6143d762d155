package engine

import (
	"sync/atomic"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// Counters count each stage's batched runs, the items they carried, the time they kept the stage
// busy and the time items waited for it. Safe for concurrent use.
type Counters struct {
	names []string
	c     []counter
}

type counter struct {
	batches, items atomic.Uint64
	busy           atomic.Int64 // nanoseconds
	wait           atomic.Int64 // nanoseconds, summed over the items that waited
}

// NewCounters makes counters for the stages called names; a stage is its index in names.
func NewCounters(names ...string) *Counters {
	return &Counters{names: names, c: make([]counter, len(names))}
}

// Count records one run of stage that carried items and began at since.
func (c *Counters) Count(stage, items int, since time.Time) {
	c.CountFor(stage, items, time.Since(since))
}

// CountFor records one run of stage that carried items and kept it busy for d.
func (c *Counters) CountFor(stage, items int, d time.Duration) {
	c.c[stage].batches.Add(1)
	c.c[stage].items.Add(uint64(items))
	c.c[stage].busy.Add(int64(d))
}

// Waited records that items waiting since each of queued were taken into a run of stage now.
func (c *Counters) Waited(stage int, now time.Time, queued ...time.Time) {
	var d time.Duration
	for _, q := range queued {
		d += now.Sub(q)
	}
	c.c[stage].wait.Add(int64(d))
}

// Stats is every stage's counts since the counters were made.
func (c *Counters) Stats() []tts.StageStats {
	out := make([]tts.StageStats, len(c.c))
	for i := range out {
		out[i] = tts.StageStats{Stage: c.names[i], Batches: c.c[i].batches.Load(), Items: c.c[i].items.Load(),
			Busy: time.Duration(c.c[i].busy.Load()), Wait: time.Duration(c.c[i].wait.Load())}
	}
	return out
}

// Sum adds stats of the same stages (several engines' Stats) stage by stage, in the first's order.
func Sum(all ...[]tts.StageStats) []tts.StageStats {
	var out []tts.StageStats
	for _, stats := range all {
		for i, s := range stats {
			if i >= len(out) {
				out = append(out, tts.StageStats{Stage: s.Stage})
			}
			out[i].Batches += s.Batches
			out[i].Items += s.Items
			out[i].Busy += s.Busy
			out[i].Wait += s.Wait
		}
	}
	return out
}
