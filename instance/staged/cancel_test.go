package staged

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/voxmux/voxmux/tts"
)

// A request cancelled mid-stream beside a live one (a barge-in) leaves the LM's batch before the
// next decode step, emits nothing more, and is counted with the time it took to leave every
// stage; the live one is served whole and the engine ends up holding nothing.
func TestEngineCancelFreesWithinOneStep(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	defer e.Close()
	long := strings.Repeat("Streams are batched together at every stage. ", 5)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	wg.Add(1)
	var liveErr error
	go func() {
		defer wg.Done()
		liveErr = e.Synthesize(ctx, tts.Request{Text: long, Seed: 1}, func(tts.Chunk) error { return nil })
	}()

	bctx, barge := context.WithCancel(ctx)
	var after int
	cancelled := false
	err := e.Synthesize(bctx, tts.Request{Text: long, Seed: 2}, func(c tts.Chunk) error {
		if cancelled {
			after++
		}
		if c.Index == 1 {
			barge()
			cancelled = true
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request returned %v, want context.Canceled", err)
	}
	if after != 0 {
		t.Errorf("%d chunks emitted after the cancel", after)
	}
	wg.Wait()
	if liveErr != nil {
		t.Fatalf("live request beside the cancelled one: %v", liveErr)
	}
	// The live request finished, so only the cancelled one's last hold can remain; it goes
	// once the flow or vocoder run it may be in ends (bounded wait, not a speed target).
	waitIdle(e, 30*time.Second)
	if n := e.Active(); n != 0 {
		t.Fatalf("engine still holds %d streams", n)
	}
	steps := e.CancelSteps()
	if steps > 1 {
		t.Errorf("the cancelled stream left the LM's batch after %d decode steps, want at most the one under way", steps)
	}
	st := e.CancelStats()
	if st.Count != 1 {
		t.Errorf("%d cancels counted, want 1 (the live request ended by itself)", st.Count)
	}
	t.Logf("cancel to freed: %v (decode steps after the cancel: %d)", st.Freeing, steps)
}

// A request cancelled while it waits for the LM loop is never prefilled, and a cancel of a
// request that completed costs nothing.
func TestEngineCancelCountsOnlyUnfinished(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	defer e.Close()
	synth(t, e, tts.Request{Text: "Complete."})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Synthesize(ctx, tts.Request{Text: "Never started."}, func(tts.Chunk) error { return nil }); err == nil {
		t.Fatal("a cancelled request succeeded")
	}
	// A request cancelled before it started may still be leaving the LM loop's queue.
	waitIdle(e, 2*time.Second)
	if st := e.CancelStats(); st.Count != 0 || e.Active() != 0 {
		t.Errorf("cancels %+v, active %d; want none", st, e.Active())
	}
}

// A client gone while its context is still live (emit fails: the router's stream broke) leaves
// the engine's work on the rest of its text wasted: the cancel is counted once the engine lets go,
// though no watch of the context ever fired.
func TestEngineCancelCountsEmitFailure(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	defer e.Close()
	gone := errors.New("the client left")
	long := strings.Repeat("Streams are batched together at every stage. ", 5)
	err := e.Synthesize(context.Background(), tts.Request{Text: long, Seed: 1}, func(tts.Chunk) error { return gone })
	if !errors.Is(err, gone) {
		t.Fatalf("Synthesize returned %v, want emit's error", err)
	}
	waitIdle(e, 30*time.Second)
	if n := e.Active(); n != 0 {
		t.Fatalf("engine still holds %d streams", n)
	}
	if st := e.CancelStats(); st.Count != 1 {
		t.Errorf("cancels %+v, want 1", st)
	}
}

// Each chunk says which text it speaks: the spans follow each other from the text's start to its
// end, on character boundaries. The estimate inside (speech tokens in proportion to characters)
// is compared with the proportional position the finished request gives in hindsight; the
// difference is logged, the tiny model's random weights give it no meaning beyond the test.
func TestEngineTextSpans(t *testing.T) {
	e := NewEngine(tinyPipeline(t))
	defer e.Close()
	var sumErr, n float64
	var sumMs float64
	for _, r := range append(batchRequests, tts.Request{Text: strings.Repeat("Words follow words in a long text. ", 4), Seed: 9}) {
		var spans []tts.TextSpan
		var samples []int
		err := e.Synthesize(context.Background(), r, func(c tts.Chunk) error {
			if c.Text == nil {
				t.Fatalf("%q: chunk %d has no text span", r.Text, c.Index)
			}
			spans = append(spans, *c.Text)
			samples = append(samples, len(c.PCM))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		at := 0
		for i, s := range spans {
			if s.Start != at || s.End < s.Start || !utf8.RuneStart(r.Text[min(s.End, len(r.Text)-1)]) && s.End != len(r.Text) {
				t.Fatalf("%q: chunk %d spans %v after %d", r.Text, i, s, at)
			}
			at = s.End
		}
		if at != len(r.Text) {
			t.Fatalf("%q: spans end at %d of %d bytes", r.Text, at, len(r.Text))
		}
		total := 0
		for _, k := range samples {
			total += k
		}
		runes := float64(utf8.RuneCountInString(r.Text))
		sec := float64(total) / 24000
		done := 0
		for i, s := range spans[:len(spans)-1] {
			done += samples[i]
			hind := float64(done) / float64(total) * runes
			est := float64(utf8.RuneCountInString(r.Text[:s.End]))
			d := hind - est
			if d < 0 {
				d = -d
			}
			sumErr += d
			sumMs += d / runes * sec * 1000
			n++
		}
	}
	if n > 0 {
		t.Logf("chunk ends placed within %.1f characters (%.0f ms of audio) of the proportional position on average, %d chunk ends", sumErr/n, sumMs/n, int(n))
	}
}

// waitIdle waits until e holds no stream, or within has passed (a bound, not a speed target).
func waitIdle(e *Engine, within time.Duration) {
	for deadline := time.Now().Add(within); e.Active() != 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}
