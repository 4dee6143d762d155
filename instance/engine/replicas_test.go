package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// fakeReplica stands for one GPU's engine.
type fakeReplica struct {
	mu    sync.Mutex
	calls int
	hold  chan struct{} // Synthesize waits on it when set
	rep   Report
}

func (f *fakeReplica) Synthesize(context.Context, tts.Request, func(tts.Chunk) error) error {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	if f.hold != nil {
		<-f.hold
	}
	return nil
}
func (f *fakeReplica) Report() Report {
	r := f.rep
	f.rep.FirstAudio = nil
	return r
}
func (f *fakeReplica) Close() error { return nil }

// Requests go to the least loaded engine.
func TestReplicasLeastLoaded(t *testing.T) {
	a, b := &fakeReplica{hold: make(chan struct{})}, &fakeReplica{}
	r := NewReplicas([]*fakeReplica{a, b})
	done := make(chan struct{})
	go func() { r.Synthesize(context.Background(), tts.Request{}, nil); close(done) }()
	for {
		a.mu.Lock()
		n := a.calls
		a.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	r.Synthesize(context.Background(), tts.Request{}, nil)
	if b.calls != 1 {
		t.Errorf("engine b took %d requests while a was busy, want 1", b.calls)
	}
	close(a.hold)
	<-done
}

// Replicas report like one engine: stage counts and the time items waited summed stage by stage,
// cancels summed (the longest the longest of any), first audio of every engine's requests taken
// once.
func TestReplicasReport(t *testing.T) {
	fa := func(ms ...int) FirstAudio {
		var f FirstAudio
		for i, m := range ms {
			f = append(f, Part{Name: []string{"prefill", "decode"}[i], Took: time.Duration(m) * time.Millisecond})
		}
		return f
	}
	a := &fakeReplica{rep: Report{
		Stages:     []tts.StageStats{{Stage: "lm_prefill", Batches: 2, Items: 3, Busy: time.Second, Wait: 2 * time.Second}, {Stage: "flow", Batches: 1, Items: 4, Busy: 3 * time.Second, Wait: time.Second}},
		Cancels:    tts.CancelStats{Count: 2, Freeing: 30 * time.Millisecond, MaxFreeing: 20 * time.Millisecond},
		FirstAudio: []FirstAudio{fa(1, 2)},
	}}
	b := &fakeReplica{rep: Report{
		Stages:     []tts.StageStats{{Stage: "lm_prefill", Batches: 1, Items: 1, Busy: time.Second, Wait: 5 * time.Second}, {Stage: "flow", Batches: 3, Items: 6, Busy: time.Second, Wait: 4 * time.Second}},
		Cancels:    tts.CancelStats{Count: 1, Freeing: 50 * time.Millisecond, MaxFreeing: 50 * time.Millisecond},
		FirstAudio: []FirstAudio{fa(3, 4), fa(5, 6)},
	}}
	r := NewReplicas([]*fakeReplica{a, b})
	got := r.Report()
	want := []tts.StageStats{{Stage: "lm_prefill", Batches: 3, Items: 4, Busy: 2 * time.Second, Wait: 7 * time.Second}, {Stage: "flow", Batches: 4, Items: 10, Busy: 4 * time.Second, Wait: 5 * time.Second}}
	if len(got.Stages) != len(want) {
		t.Fatalf("stages %+v, want %+v", got.Stages, want)
	}
	for i := range want {
		if got.Stages[i] != want[i] {
			t.Errorf("stage %d: %+v, want %+v", i, got.Stages[i], want[i])
		}
	}
	if c := (tts.CancelStats{Count: 3, Freeing: 80 * time.Millisecond, MaxFreeing: 50 * time.Millisecond}); got.Cancels != c {
		t.Errorf("cancels %+v, want %+v", got.Cancels, c)
	}
	if len(got.FirstAudio) != 3 {
		t.Errorf("first audio of %d requests, want 3 (both engines')", len(got.FirstAudio))
	}
	s := SummarizeFirstAudio(got.FirstAudio)
	for _, part := range []string{"n=3", "total=7/11", "prefill=3/5", "decode=4/6"} {
		if !strings.Contains(s, part) {
			t.Errorf("summary %q lacks %q", s, part)
		}
	}
	if again := r.Report(); len(again.FirstAudio) != 0 || again.Cancels.Count != 3 {
		t.Errorf("second report: %d first audios (want 0, taken), %d cancels (want 3, cumulative)", len(again.FirstAudio), again.Cancels.Count)
	}
	if SummarizeFirstAudio(nil) != "" {
		t.Error("a summary with no requests")
	}
}

// A voice is made on the first engine; replicas of a model that makes none say so.
func TestReplicasExtractVoice(t *testing.T) {
	r := NewReplicas([]*fakeReplica{{}, {}})
	_, err := r.ExtractVoice(context.Background(), tts.VoiceClip{})
	var te *tts.Error
	if !errors.As(err, &te) || te.Kind != tts.ErrInvalid {
		t.Fatalf("ExtractVoice on replicas that make no voices: %v, want an invalid-request error", err)
	}
	x := NewReplicas([]*extractor{{}, {}})
	if _, err := x.ExtractVoice(context.Background(), tts.VoiceClip{}); err != nil || x.Engines[0].calls != 1 || x.Engines[1].calls != 0 {
		t.Fatalf("ExtractVoice: %v; calls %d, %d, want the first engine's only", err, x.Engines[0].calls, x.Engines[1].calls)
	}
}

// extractor is a replica that makes voices.
type extractor struct{ fakeReplica }

func (e *extractor) ExtractVoice(context.Context, tts.VoiceClip) (tts.VoicePrompt, error) {
	e.calls++
	return tts.VoicePrompt{}, nil
}

// A report's first audio is kept up to a bound when nobody takes it.
func TestFirstAudiosBounded(t *testing.T) {
	var f FirstAudios
	for range firstAudioKept/1000 + 1 {
		f.Add(make([]FirstAudio, 1000)...)
	}
	if n := len(f.Take()); n != firstAudioKept {
		t.Fatalf("kept %d, want %d", n, firstAudioKept)
	}
	if n := len(f.Take()); n != 0 {
		t.Fatalf("taken twice: %d", n)
	}
}
