// Package enginetest drives a family's runner the way every family's tests check it: the figures
// it reports (engine.Report) for requests cancelled while it works on them.
package enginetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// Runner is what CheckCancelReport drives: a family's runner, one engine or engine.Replicas.
type Runner interface {
	Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error
	Report() engine.Report
}

// leaveWithin bounds the wait for a cancelled request to leave every stage (a stage's run under
// way ends first); a bound, not a speed target.
const leaveWithin = 30 * time.Second

// CheckCancelReport runs n requests for req at once on r, each cancelled when its first chunk
// arrives (req's text must make more than one chunk), and checks that r's report counts the
// cancels once r lets go of them, and names its stages with the runs that served them. A request
// the runner finished before its cancel arrived is not a cancel it paid for (on a loaded machine
// a small model can get there first), so at least one of the n must count, and no more than n.
func CheckCancelReport(t *testing.T, r Runner, req tts.Request, n int) {
	t.Helper()
	before := r.Report()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ctx, barge := context.WithCancel(ctx)
			errs[i] = r.Synthesize(ctx, req, func(tts.Chunk) error {
				barge()
				return nil
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("request %d cancelled at its first chunk returned %v, want context.Canceled", i, err)
		}
	}
	var rep engine.Report
	for deadline := time.Now().Add(leaveWithin); ; time.Sleep(time.Millisecond) {
		rep = r.Report()
		if rep.Cancels.Count-before.Cancels.Count >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if got := rep.Cancels.Count - before.Cancels.Count; got == 0 || got > uint64(n) {
		t.Errorf("report counts %d cancels for %d requests cancelled at their first chunk, want 1 to %d", got, n, n)
	}
	if rep.Cancels.MaxFreeing > rep.Cancels.Freeing {
		t.Errorf("cancels %+v: the longest is longer than the sum", rep.Cancels)
	}
	if len(rep.Stages) == 0 {
		t.Fatal("report names no stages")
	}
	var runs uint64
	for _, s := range before.Stages {
		runs -= s.Batches
	}
	for _, s := range rep.Stages {
		if s.Stage == "" {
			t.Errorf("a stage without a name: %+v", s)
		}
		runs += s.Batches
	}
	if runs == 0 {
		t.Errorf("stages %+v counted no runs for %d requests", rep.Stages, n)
	}
}

// CheckVoiceRefused runs req on r and checks the one rule for voices (tts.Request.Voice): an
// invalid request about the voice, no audio, and a message saying each of want.
func CheckVoiceRefused(t *testing.T, r Runner, req tts.Request, want ...string) {
	t.Helper()
	emitted := 0
	err := r.Synthesize(context.Background(), req, func(tts.Chunk) error { emitted++; return nil })
	var ie *tts.Error
	if !errors.As(err, &ie) || ie.Kind != tts.ErrInvalid || ie.Param != "voice" || emitted != 0 {
		t.Errorf("voice %q, prompt %v: %#v and %d chunks; want an invalid request about voice", req.Voice, req.Prompt != nil, err, emitted)
		return
	}
	for _, w := range want {
		if !strings.Contains(ie.Msg, w) {
			t.Errorf("voice %q: %q does not say %s", req.Voice, ie.Msg, w)
		}
	}
}
