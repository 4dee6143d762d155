package router

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/voxmux/voxmux/tts"
)

// sseTimestamps is the speech.audio.timestamps event an SSE stream sends after each chunk's audio
// when the request asked for "timestamps": true: which text the chunk speaks (in characters of
// the input), where its audio lies (seconds from the start, after speed), and the words that end
// in it. A model that cannot say which text a chunk speaks gets its words in one event at the end.
type sseTimestamps struct {
	Type      string  `json:"type"`
	CharStart int     `json:"char_start"`
	CharEnd   int     `json:"char_end"`
	Start     float64 `json:"start"`
	End       float64 `json:"end"`
	Words     []Word  `json:"words"`
}

// timestamper makes a request's timestamp events.
type timestamper struct {
	al    *aligner
	text  string
	rate  float64 // samples per second of audio as sent
	done  int
	chars int
}

func newTimestamper(text string, rate int, speed float64) *timestamper {
	r := float64(rate) * speed
	al := newAligner(text, 0, 0, rate)
	al.rate = r
	return &timestamper{al: al, text: text, rate: r, chars: utf8.RuneCountInString(text)}
}

// chunk returns the event for a chunk of the stream.
func (t *timestamper) chunk(c tts.Chunk) []byte {
	ev := sseTimestamps{Type: "speech.audio.timestamps", CharEnd: t.chars, Start: round3(float64(t.done) / t.rate)}
	t.done += len(c.PCM)
	ev.End = round3(float64(t.done) / t.rate)
	ev.Words = t.al.chunk(len(c.PCM), c.Text)
	if ev.Words == nil {
		ev.Words = []Word{}
	}
	if sp := c.Text; sp != nil && sp.Start <= sp.End && sp.End <= len(t.text) {
		ev.CharStart = utf8.RuneCountInString(t.text[:sp.Start])
		ev.CharEnd = utf8.RuneCountInString(t.text[:sp.End])
	}
	return sseEvent(ev)
}

// finish returns the last event, with the words not yet placed; nil when there are none.
func (t *timestamper) finish() []byte {
	words := t.al.finish()
	if len(words) == 0 {
		return nil
	}
	end := round3(float64(t.done) / t.rate)
	return sseEvent(sseTimestamps{Type: "speech.audio.timestamps", CharStart: 0, CharEnd: t.chars, Start: 0, End: end, Words: words})
}

func sseEvent(v any) []byte {
	b, _ := json.Marshal(v) // cannot fail: fixed types
	b = append([]byte("data: "), b...)
	return append(b, "\n\n"...)
}
