package router

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// spanSynth speaks one chunk of 2400 samples per word of its text, saying which word.
type spanSynth struct{}

func (spanSynth) Synthesize(_ context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	at := 0
	for i, w := range strings.SplitAfter(req.Text, " ") {
		if err := emit(tts.Chunk{PCM: make([]float32, 2400), SampleRate: 24000, Index: i, Text: &tts.TextSpan{Start: at, End: at + len(w)}}); err != nil {
			return err
		}
		at += len(w)
	}
	return nil
}

// An SSE stream with "timestamps": true says after each chunk which text it spoke and when the
// words that ended in it play; speed divides the times.
func TestSSETimestamps(t *testing.T) {
	url := serveTest(t, ready("a", spanSynth{}, 1))
	resp, body := post(t, url, `{"input":"one two three","response_format":"pcm","stream_format":"sse","timestamps":true,"speed":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var words []Word
	var spans [][2]int
	for _, line := range strings.Split(string(body), "\n") {
		ev, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var e sseTimestamps
		if err := json.Unmarshal([]byte(ev), &e); err != nil {
			t.Fatal(err)
		}
		if e.Type == "speech.audio.timestamps" {
			words = append(words, e.Words...)
			spans = append(spans, [2]int{e.CharStart, e.CharEnd})
		}
	}
	if got := fmtSpans(spans); got != "[[0 4] [4 8] [8 13]]" {
		t.Errorf("chunk spans %s", got)
	}
	// Each word's chunk is 0.1 s of model audio, 0.05 s at speed 2; a word ends before its space.
	if len(words) != 3 || words[1].Word != "two" || words[1].Start != 0.05 || words[1].End != 0.088 || words[2].End != 0.15 {
		t.Errorf("words %+v", words)
	}
	if resp, _ := post(t, url, `{"input":"x","timestamps":true}`); resp.StatusCode != 400 {
		t.Errorf("timestamps without sse: status %d, want 400", resp.StatusCode)
	}
}

func fmtSpans(s [][2]int) string {
	b, _ := json.Marshal(s)
	return strings.ReplaceAll(string(b), ",", " ")
}
