package staged

import (
	"math"
	"slices"
	"testing"
)

// draws samples n tokens from fixed logits and returns how often each id came.
func draws(s *sampler, logits []float32, decoded []int64, allowEnd bool, n int) []float64 {
	freq := make([]float64, len(logits))
	for range n {
		freq[s.pick(logits, decoded, allowEnd)]++
	}
	for i := range freq {
		freq[i] /= float64(n)
	}
	return freq
}

func logitsOf(probs ...float64) []float32 {
	out := make([]float32, len(probs))
	for i, p := range probs {
		out[i] = float32(math.Log(p))
	}
	return out
}

func near(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for i := range want {
		if math.Abs(got[i]-want[i]) > 0.015 {
			t.Errorf("%s: frequencies %.3f, want %.3f", what, got, want)
			return
		}
	}
}

const nDraws = 40000

func TestSamplerTopK(t *testing.T) {
	// Ten tokens and end of speech, each less likely than the one before; the 3 most likely
	// are drawn in proportion to their probabilities, renormalized.
	probs := []float64{0.2, 0.15, 0.12, 0.1, 0.1, 0.09, 0.08, 0.07, 0.05, 0.03, 0.01}
	s := newSampler(SamplingSpec{TopP: 1, TopK: 3}, 1, 0)
	got := draws(s, logitsOf(probs...), nil, true, nDraws)
	sum := 0.2 + 0.15 + 0.12
	near(t, "top-k 3", got, []float64{0.2 / sum, 0.15 / sum, 0.12 / sum, 0, 0, 0, 0, 0, 0, 0, 0})
}

func TestSamplerTopP(t *testing.T) {
	// Probability so far 0 → 0.5 → 0.75 (both below 0.8, so a third is taken) → 0.95: the
	// nucleus is the first three; the fourth never comes.
	probs := []float64{0.5, 0.25, 0.2, 0.05 - 1e-9, 1e-9}
	s := newSampler(SamplingSpec{TopP: 0.8, TopK: 25, Window: 10, TauR: 0.1}, 2, 0)
	got := draws(s, logitsOf(probs...), nil, true, nDraws)
	near(t, "top-p 0.8", got, []float64{0.5 / 0.95, 0.25 / 0.95, 0.2 / 0.95, 0, 0})
	if got[3] != 0 || got[4] != 0 {
		t.Errorf("tokens outside the nucleus were drawn: %v", got)
	}
}

func TestSamplerTiesGoToLowerIDs(t *testing.T) {
	s := newSampler(SamplingSpec{TopP: 1, TopK: 2}, 3, 0)
	got := draws(s, []float32{1, 1, 1, 1, -10}, nil, true, nDraws)
	near(t, "four equal logits, top-k 2", got, []float64{0.5, 0.5, 0, 0, 0})
}

func TestSamplerRepetitionWindow(t *testing.T) {
	// The nucleus (top-k 1) always picks token 0; once token 0 is among the last 10 tokens
	// (window 10 × tau_r 0.1 = 1 repeat) it is drawn again from the whole distribution without
	// token 0.
	probs := []float64{0.94, 0.02, 0.02, 0.02 - 1e-9, 1e-9}
	spec := SamplingSpec{TopP: 0.8, TopK: 1, Window: 10, TauR: 0.1}
	recent := []int64{0, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1} // token 0 is 11 back: outside the window
	got := draws(newSampler(spec, 4, 0), logitsOf(probs...), recent, true, nDraws)
	near(t, "repeat outside the window", got, []float64{1, 0, 0, 0, 0})
	recent = append(recent[1:], 0)
	got = draws(newSampler(spec, 4, 0), logitsOf(probs...), recent, true, nDraws)
	near(t, "repeat inside the window", got, []float64{0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0})
	// tau_r 0.3: 3 repeats needed.
	spec.TauR = 0.3
	got = draws(newSampler(spec, 4, 0), logitsOf(probs...), []int64{0, 0, 5, 5}, true, nDraws)
	near(t, "2 repeats, 3 needed", got, []float64{1, 0, 0, 0, 0})
	got = draws(newSampler(spec, 4, 0), logitsOf(probs...), []int64{0, 0, 0, 5}, true, nDraws)
	near(t, "3 repeats", got, []float64{0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0})
}

func TestSamplerEndBannedBeforeMinimum(t *testing.T) {
	// End of speech is the most likely token; before the minimum length it never comes.
	probs := []float64{0.1, 0.1, 0.8}
	spec := SamplingSpec{TopP: 0.8, TopK: 25, Window: 10, TauR: 0.1}
	got := draws(newSampler(spec, 5, 0), logitsOf(probs...), nil, false, nDraws)
	near(t, "end banned", got, []float64{0.5, 0.5, 0})
	got = draws(newSampler(spec, 5, 0), logitsOf(probs...), nil, true, nDraws)
	near(t, "end allowed", got, []float64{0, 0, 1})
}

func TestSamplerSeeded(t *testing.T) {
	spec := SamplingSpec{TopP: 0.8, TopK: 25, Window: 10, TauR: 0.1}
	logits := logitsOf(0.3, 0.3, 0.2, 0.1, 0.05, 0.05)
	seq := func(seed uint64, segment int) []int {
		s := newSampler(spec, seed, segment)
		var out []int
		var decoded []int64
		for range 200 {
			tok := s.pick(logits, decoded, true)
			out = append(out, tok)
			decoded = append(decoded, int64(tok))
		}
		return out
	}
	if a, b := seq(7, 0), seq(7, 0); !slices.Equal(a, b) {
		t.Error("the same seed gave different tokens")
	}
	if a, b := seq(7, 0), seq(8, 0); slices.Equal(a, b) {
		t.Error("seeds 7 and 8 gave the same 200 tokens")
	}
	if a, b := seq(7, 0), seq(7, 1); slices.Equal(a, b) {
		t.Error("segments 0 and 1 of one request gave the same 200 tokens")
	}
}

func TestTokenBoundsPerTextToken(t *testing.T) {
	m := &Manifest{LM: LMSpec{MinTokensPerTextToken: 2, MaxTokensPerTextToken: 20, MaxTokens: 100}}
	if lo, hi := m.TokenBounds("seven characters", 4); lo != 8 || hi != 80 {
		t.Errorf("4 text tokens: %d..%d speech tokens, want 8..80", lo, hi)
	}
	if lo, hi := m.TokenBounds("x", 7); lo != 14 || hi != 100 {
		t.Errorf("7 text tokens: %d..%d, want 14..100 (lm.max_tokens)", lo, hi)
	}
}

// One draw over CosyVoice3's 6,561 speech tokens and end of speech.
func BenchmarkSamplerPick(b *testing.B) {
	logits := make([]float32, 6562)
	for i := range logits {
		logits[i] = float32((i*7919)%1000) / 100
	}
	s := newSampler(SamplingSpec{TopP: 0.8, TopK: 25, Window: 10, TauR: 0.1}, 1, 0)
	decoded := make([]int64, 0, 4096)
	for b.Loop() {
		tok := s.pick(logits, decoded, true)
		if len(decoded) == cap(decoded) {
			decoded = decoded[:0]
		}
		decoded = append(decoded, int64(tok))
	}
}

func TestExpNeg(t *testing.T) {
	for x := -708.0; x <= 0; x += 0.0137 {
		if got, want := expNeg(x), math.Exp(x); math.Abs(got-want) > 1e-14*want {
			t.Fatalf("expNeg(%g) = %g, want %g", x, got, want)
		}
	}
	if expNeg(-800) != 0 || expNeg(math.Inf(-1)) != 0 || expNeg(0) != 1 {
		t.Error("expNeg at its edges")
	}
}
