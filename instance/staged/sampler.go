package staged

import (
	"math"
	"math/rand/v2"
)

// sampler draws speech tokens for one request as CosyVoice's LM does (ras_sampling): nucleus
// sampling, and a draw from the whole distribution when the nucleus' pick repeats too often in
// the recent tokens. Its generator is the request's own, seeded from the request, so a request's
// tokens depend on its seed and its logits alone, never on the requests beside it.
type sampler struct {
	spec SamplingSpec
	rng  *rand.Rand
	// Scratch, reused between steps: unnormalized probabilities, the top_k ids.
	w   []float64
	top []int
}

// segmentStream numbers a request's segments' generators apart from one another (PCG's second
// word), so segment 2 does not replay segment 1's draws.
const segmentStream = 0x5eed_0000_0000_0000

func newSampler(spec SamplingSpec, seed uint64, segment int) *sampler {
	return &sampler{spec: spec, rng: rand.New(rand.NewPCG(seed, segmentStream+uint64(segment)))}
}

// pick returns the next token for logits (speech tokens, then end of speech last), given the
// tokens decoded so far; end of speech is banned while allowEnd is false.
func (s *sampler) pick(logits []float32, decoded []int64, allowEnd bool) int {
	n := len(logits)
	if !allowEnd {
		n-- // end of speech, the last, is out
	}
	// The k most likely tokens, by logit (softmax keeps the order), and the normalizer.
	top, hi := s.topK(logits[:n])
	if cap(s.w) < n {
		s.w = make([]float64, n)
	}
	w := s.w[:n]
	var z float64
	for i, l := range logits[:n] {
		w[i] = expNeg(float64(l) - hi)
		z += w[i]
	}
	// The nucleus: from the top while the probability taken is below top_p.
	var cum float64
	k := 0
	for k < len(top) && cum < s.spec.TopP {
		cum += w[top[k]] / z
		k++
	}
	tok := s.drawAmong(w, top[:k])
	if win := s.spec.Window; win > 0 { // window 0: no repetition check
		rep := 0
		for _, t := range decoded[max(0, len(decoded)-win):] {
			if int(t) == tok {
				rep++
			}
		}
		if float64(rep) >= float64(win)*s.spec.TauR {
			// Too repetitive: draw from everything but that token.
			z -= w[tok]
			w[tok] = 0
			return s.drawAll(w, z)
		}
	}
	return tok
}

// topK returns the ids of the top_k highest logits, highest first (ties: the lower id first),
// and the highest logit.
func (s *sampler) topK(logits []float32) ([]int, float64) {
	k := s.spec.TopK
	top := s.top[:0]
	for i, v := range logits {
		if len(top) == k && v <= logits[top[k-1]] {
			continue
		}
		j := len(top)
		if j < k {
			top = append(top, i)
		} else {
			j = k - 1
		}
		for j > 0 && logits[top[j-1]] < v {
			top[j] = top[j-1]
			j--
		}
		top[j] = i
	}
	s.top = top
	return top, float64(logits[top[0]])
}

// drawAmong draws one of ids in proportion to its weight in w.
func (s *sampler) drawAmong(w []float64, ids []int) int {
	var sum float64
	for _, i := range ids {
		sum += w[i]
	}
	r := s.rng.Float64() * sum
	for _, i := range ids {
		if r < w[i] {
			return i
		}
		r -= w[i]
	}
	return ids[len(ids)-1] // r ran past the end by rounding
}

// drawAll draws an index in proportion to w, whose sum is sum.
func (s *sampler) drawAll(w []float64, sum float64) int {
	r := s.rng.Float64() * sum
	last := -1
	for i, p := range w {
		if p > 0 {
			last = i
			if r < p {
				return i
			}
			r -= p
		}
	}
	return last
}

// expNeg is e^x for x ≤ 0, to about 1e-14 relative, without math.Exp's handling of every
// range: a pick computes it for every speech token. x = (32m + j)·ln2/32 + r with
// |r| ≤ ln2/64; e^x = 2^m · 2^(j/32) · e^r, the first built in the bits, the second from a
// table, the third by its Taylor series to r⁵.
func expNeg(x float64) float64 {
	if x < -708 || x != x {
		return 0
	}
	const (
		inv    = 32 / math.Ln2
		stepHi = 6.93147180369123816490e-01 / 32 // ln2/32 in two parts, the first exact in its
		stepLo = 1.90821492927058770002e-10 / 32 // bits, so n·stepHi loses nothing
	)
	n := int64(x*inv - 0.5) // nearest integer: x*inv ≤ 0
	r := x - float64(n)*stepHi - float64(n)*stepLo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120)))))
	m, j := n>>5, n&31
	return p * exp2Frac[j] * math.Float64frombits(uint64(m+1023)<<52)
}

// exp2Frac[j] is 2^(j/32).
var exp2Frac = func() (t [32]float64) {
	for j := range t {
		t[j] = math.Exp2(float64(j) / 32)
	}
	return t
}()
