package bench

import (
	"bytes"
	"strings"
	"testing"
)

// An agent's reply leaves as LLM-sized tokens that join back into the reply.
func TestLLMTokens(t *testing.T) {
	for _, s := range Corpus {
		toks := llmTokens(s.Text)
		if strings.Join(toks, "") != s.Text {
			t.Fatalf("%q: tokens %q do not join back", s.Text, toks)
		}
		for _, tok := range toks {
			if n := len([]rune(strings.TrimSpace(tok))); n == 0 || n > 30 {
				t.Fatalf("%q: token %q", s.Text, tok)
			}
		}
	}
	if got := strings.Join(llmTokens("Hi there, 你好世界"), "|"); got != "Hi| there,| 你|好世|界" {
		t.Errorf("tokens %s", got)
	}
}

// Unknown figures (no engine counters on the server) print as a dash, not as NaN.
func TestWSReportMarkdown(t *testing.T) {
	r := &WSReport{URL: "http://x", TokenRate: 25, BargeIn: 0.3, Levels: []WSLevel{{Sessions: 4, Turns: 9, BargeIns: 2,
		FirstAudioP50: 210, FirstAudioP95: 480, CancelAckP50: 0.6, CancelAckP95: 1.2, EngineCancels: unknown, EngineFreeingMean: unknown}}}
	var b bytes.Buffer
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| 4 | 9 | 2 | 0 | 210 / 480 | 0.6 / 1.2 | – (–) | 0 | 0.0 |") || strings.Contains(b.String(), "NaN") {
		t.Errorf("markdown:\n%s", b.String())
	}
}
