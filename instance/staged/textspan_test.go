package staged

import "testing"

// Segments are placed in the request's text in proportion to their characters: they tile it,
// in order, from its start to its end, even where normalization rewrote them.
func TestSegmentSpans(t *testing.T) {
	text := "One sentence here. And 2 more words! Last one."
	for _, segs := range [][]string{
		{text},
		{"One sentence here.", "And 2 more words!", "Last one."},
		{"One sentence here.", "And two more words!", "Last one."}, // normalized: longer than the text
	} {
		spans := segmentSpans(text, segs)
		if len(spans) != len(segs) || spans[0][0] != 0 || spans[len(spans)-1][1] != len(text) {
			t.Fatalf("%q: %v", segs, spans)
		}
		for i := 1; i < len(spans); i++ {
			if spans[i][0] != spans[i-1][1] || spans[i][1] < spans[i][0] {
				t.Fatalf("%q: spans %v do not tile the text", segs, spans)
			}
		}
	}
}
