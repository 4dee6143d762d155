package router

import (
	"unicode"
	"unicode/utf8"

	"github.com/voxmux/voxmux/tts"
)

// Word timestamps of a segment's audio. An instance says which text each chunk speaks
// (tts.Chunk.Text); inside a chunk the characters are spread evenly over its audio, so a word's
// times are exact where a chunk begins or ends and interpolated between. A model that cannot say
// gets its words spread over the whole segment's audio when the segment ends, exact at the
// segment's ends.

// Word is one word of the text and when its audio plays, in seconds from the start of its
// context's audio; CharStart and CharEnd are its place in the context's text in Unicode
// characters (code points), [CharStart, CharEnd).
type Word struct {
	Word      string  `json:"word"`
	Start     float64 `json:"start"`
	End       float64 `json:"end"`
	CharStart int     `json:"char_start"`
	CharEnd   int     `json:"char_end"`
}

type wordSpan struct{ from, to int } // bytes of the segment's request text

// aligner places a segment's words on its audio as the chunks arrive.
type aligner struct {
	text     string  // the request's text
	charBase int     // characters of the context's text before text
	t0       float64 // seconds of the context's audio before the segment's
	rate     float64 // samples per second
	words    []wordSpan
	next     int // first word not yet placed
	done     int // samples of the segment so far
	spans    []placed
	pos      int // byte where the next chunk without a span starts, for the check
}

// placed is a chunk's text and where its audio lies, in seconds from the context's start.
type placed struct {
	from, to int
	t0, t1   float64
}

func newAligner(text string, charBase int, t0 float64, rate int) *aligner {
	a := &aligner{text: text, charBase: charBase, t0: t0, rate: float64(rate)}
	start := -1
	for i, r := range text {
		if unicode.IsSpace(r) {
			if start >= 0 {
				a.words = append(a.words, wordSpan{start, i})
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		a.words = append(a.words, wordSpan{start, len(text)})
	}
	return a
}

// chunk records a chunk of samples samples and returns the words that end in it; text is what
// the instance said it speaks (nil: unknown, placed by finish).
func (a *aligner) chunk(samples int, text *tts.TextSpan) []Word {
	t0 := a.t0 + float64(a.done)/a.rate
	a.done += samples
	t1 := a.t0 + float64(a.done)/a.rate
	if text == nil || text.Start != a.pos || text.End < text.Start || text.End > len(a.text) {
		a.pos = -1 // not a span chain this aligner can use: finish spreads the words
		return nil
	}
	a.pos = text.End
	a.spans = append(a.spans, placed{text.Start, text.End, t0, t1})
	return a.place(text.End)
}

// finish places the words not yet placed, over the segment's whole audio when the chunks did
// not say their text.
func (a *aligner) finish() []Word {
	if a.pos != len(a.text) {
		a.spans = []placed{{0, len(a.text), a.t0, a.t0 + float64(a.done)/a.rate}}
		a.pos = len(a.text)
	}
	return a.place(len(a.text))
}

// place returns the unplaced words that end at or before byte end.
func (a *aligner) place(end int) []Word {
	var out []Word
	for a.next < len(a.words) && a.words[a.next].to <= end {
		w := a.words[a.next]
		a.next++
		out = append(out, Word{
			Word:      a.text[w.from:w.to],
			Start:     round3(a.at(w.from, false)),
			End:       round3(a.at(w.to, true)),
			CharStart: a.charBase + utf8.RuneCountInString(a.text[:w.from]),
			CharEnd:   a.charBase + utf8.RuneCountInString(a.text[:w.to]),
		})
	}
	return out
}

// at is when byte b of the text is reached: the start of a word (b begins a chunk's text) or the
// end of one (b ends a chunk's text).
func (a *aligner) at(b int, end bool) float64 {
	for _, p := range a.spans {
		inside := !end && b >= p.from && b < p.to || end && b > p.from && b <= p.to
		if !inside {
			continue
		}
		return p.t0 + float64(b-p.from)/float64(p.to-p.from)*(p.t1-p.t0)
	}
	// A chunk that speaks no text (its span empty): its place is where it starts.
	for _, p := range a.spans {
		if b <= p.from {
			return p.t0
		}
	}
	if n := len(a.spans); n > 0 {
		return a.spans[n-1].t1
	}
	return a.t0
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }
