package router

import (
	"math"

	"github.com/voxmux/voxmux/tts"
)

// Character timings in ElevenLabs' shape, from the engine's timestamps: an instance says which
// text each chunk speaks (tts.Chunk.Text), and that text's characters are spread evenly over the
// chunk's audio, as the voxmux socket's words are (realtime_align.go). Whitespace between
// segments, which no request speaks, takes no time. A model that cannot say which text a chunk
// speaks gets no alignment.

// elevenAlignment is a socket message's alignment: its characters and their times in
// milliseconds from the start of the message's audio.
type elevenAlignment struct {
	Chars            []string `json:"chars"`
	CharStartTimesMs []int    `json:"charStartTimesMs"`
	CharDurationsMs  []int    `json:"charDurationsMs"`
}

// elevenHTTPAlignment is the HTTP API's alignment: times in seconds from the start of the audio.
type elevenHTTPAlignment struct {
	Characters                 []string  `json:"characters"`
	CharacterStartTimesSeconds []float64 `json:"character_start_times_seconds"`
	CharacterEndTimesSeconds   []float64 `json:"character_end_times_seconds"`
}

// charTimes are characters with their start and end times, in seconds.
type charTimes struct {
	chars      []string
	start, end []float64
}

// spread places text's characters evenly over [t0, t1].
func (c *charTimes) spread(text string, t0, t1 float64) {
	runes := []rune(text)
	for i, r := range runes {
		c.chars = append(c.chars, string(r))
		c.start = append(c.start, t0+(t1-t0)*float64(i)/float64(len(runes)))
		c.end = append(c.end, t0+(t1-t0)*float64(i+1)/float64(len(runes)))
	}
}

func (c *charTimes) empty() bool { return len(c.chars) == 0 }

func (c *charTimes) reset() { c.chars, c.start, c.end = nil, nil, nil }

// socket is the alignment in milliseconds from offset seconds; nil when there are no characters.
func (c *charTimes) socket(offset float64) *elevenAlignment {
	if c.empty() {
		return nil
	}
	a := &elevenAlignment{Chars: c.chars, CharStartTimesMs: make([]int, len(c.chars)), CharDurationsMs: make([]int, len(c.chars))}
	for i := range c.chars {
		s := int(math.Round((c.start[i] - offset) * 1000))
		e := int(math.Round((c.end[i] - offset) * 1000))
		a.CharStartTimesMs[i], a.CharDurationsMs[i] = max(s, 0), max(e-max(s, 0), 0)
	}
	return a
}

// http is the alignment in seconds (to the millisecond); nil when there are no characters.
func (c *charTimes) http() *elevenHTTPAlignment {
	if c.empty() {
		return nil
	}
	a := &elevenHTTPAlignment{Characters: c.chars, CharacterStartTimesSeconds: make([]float64, len(c.chars)), CharacterEndTimesSeconds: make([]float64, len(c.chars))}
	for i := range c.chars {
		a.CharacterStartTimesSeconds[i], a.CharacterEndTimesSeconds[i] = round3(c.start[i]), round3(c.end[i])
	}
	return a
}

// spanAligner follows one request's chunk spans and adds what each chunk speaks to a charTimes.
type spanAligner struct {
	text string // the request's text
	lead string // whitespace before it in the client's text, placed at the start of its audio
	pos  int    // byte of text the next span starts at; -1 once the chain broke
}

// chunk adds the characters the chunk speaking span over [t0, t1] says to out.
func (a *spanAligner) chunk(span *tts.TextSpan, t0, t1 float64, out *charTimes) {
	if a.lead != "" {
		out.spread(a.lead, t0, t0)
		a.lead = ""
	}
	if span == nil || a.pos < 0 || span.Start != a.pos || span.End < span.Start || span.End > len(a.text) {
		a.pos = -1
		return
	}
	out.spread(a.text[span.Start:span.End], t0, t1)
	a.pos = span.End
}
