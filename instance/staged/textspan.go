package staged

import (
	"unicode/utf8"

	"github.com/voxmux/voxmux/tts"
)

// Which text a chunk speaks. The LM reads the whole text before its first speech token and
// reports no alignment, so a chunk's place in the text is estimated from its place in the speech:
// a chunk ending at speech token n of a text of R characters ends near character
// n / (R × tokensPerRune) × R, tokensPerRune being what the LM's finished streams spoke per
// character. The last chunk ends at the text's end and each chunk starts where the one before
// ended, so the spans are exact at the request's ends (docs/api.md, Timestamps).

// textSpan returns the text of s's next chunk, whose speech tokens end at end.
func (e *Engine) textSpan(s *stream, end int, last bool) tts.TextSpan {
	text := s.req.Text[s.textFrom:s.textTo]
	span := tts.TextSpan{Start: s.textEnd, End: s.textTo}
	if !last {
		runes := utf8.RuneCountInString(text)
		// The stream has spoken at least end tokens, so it is expected to speak more than that.
		total := max(float64(runes)*e.tokensPerRune, float64(end+1))
		at := int(float64(end) / total * float64(runes))
		span.End = max(s.textEnd, s.textFrom+byteOffset(text, min(at, runes)))
	}
	s.textEnd = span.End
	return span
}

// segmentSpans places a request's segments in its text: in proportion to their characters, as
// normalization may have rewritten them (numbers read out), each starting where the one before
// ended and the last ending at the text's end.
func segmentSpans(text string, segs []string) [][2]int {
	spans := make([][2]int, len(segs))
	if len(segs) == 1 {
		spans[0] = [2]int{0, len(text)}
		return spans
	}
	total := 0
	for _, seg := range segs {
		total += utf8.RuneCountInString(seg)
	}
	runes := utf8.RuneCountInString(text)
	at, from := 0, 0
	for i, seg := range segs {
		at += utf8.RuneCountInString(seg)
		to := len(text)
		if i < len(segs)-1 && total > 0 {
			to = max(from, byteOffset(text, at*runes/total))
		}
		spans[i] = [2]int{from, to}
		from = to
	}
	return spans
}

// learnTokensPerRune folds a stream whose speech tokens are all decoded into the engine's speech
// tokens per character.
func (e *Engine) learnTokensPerRune(s *stream) {
	runes := utf8.RuneCountInString(s.req.Text[s.textFrom:s.textTo])
	if runes == 0 || len(s.tokens) == 0 {
		return
	}
	const weight = 0.1 // recent streams count most: the rate varies with voice and language
	e.tokensPerRune += weight * (float64(len(s.tokens))/float64(runes) - e.tokensPerRune)
}

// byteOffset is where character n of text starts (len(text) past its end).
func byteOffset(text string, n int) int {
	for i := range text {
		if n == 0 {
			return i
		}
		n--
	}
	return len(text)
}

// isShutDown reports whether done (the engine's) is closed.
func isShutDown(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}
