package staged

import (
	"context"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// fakeEngine stands for one GPU's engine behind replicas.
type fakeEngine struct {
	stats []tts.StageStats
	first []FirstAudio
}

func (f *fakeEngine) Synthesize(context.Context, tts.Request, func(tts.Chunk) error) error {
	return nil
}
func (f *fakeEngine) Stats() []tts.StageStats { return f.stats }
func (f *fakeEngine) FirstAudio() []FirstAudio {
	out := f.first
	f.first = nil
	return out
}
func (f *fakeEngine) Close() error { return nil }

// One engine per GPU: the runner's figures are the sum of its engines', the time items waited
// and their first audio included, so a replicated group's metrics read like a single engine's.
func TestReplicasStats(t *testing.T) {
	a := &fakeEngine{
		stats: []tts.StageStats{{Stage: "lm_prefill", Batches: 2, Items: 3, Busy: time.Second, Wait: 2 * time.Second}, {Stage: "flow", Batches: 1, Items: 4, Busy: 3 * time.Second, Wait: time.Second}},
		first: []FirstAudio{{Prefill: time.Millisecond}},
	}
	b := &fakeEngine{
		stats: []tts.StageStats{{Stage: "lm_prefill", Batches: 1, Items: 1, Busy: time.Second, Wait: 5 * time.Second}, {Stage: "flow", Batches: 3, Items: 6, Busy: time.Second, Wait: 4 * time.Second}},
		first: []FirstAudio{{Flow: time.Millisecond}, {Vocoder: time.Millisecond}},
	}
	r := newReplicas([]*fakeEngine{a, b})
	want := []tts.StageStats{{Stage: "lm_prefill", Batches: 3, Items: 4, Busy: 2 * time.Second, Wait: 7 * time.Second}, {Stage: "flow", Batches: 4, Items: 10, Busy: 4 * time.Second, Wait: 5 * time.Second}}
	got := r.Stats()
	if len(got) != len(want) {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("stage %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if fa := r.FirstAudio(); len(fa) != 3 {
		t.Errorf("first audio of %d requests, want 3 (both engines')", len(fa))
	}
	if fa := r.FirstAudio(); len(fa) != 0 {
		t.Errorf("first audio read twice: %d", len(fa))
	}
	if r.FirstAudioSummary() != "" {
		t.Error("a summary with no requests")
	}
}
