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
	// Scratch, reused between steps.
	probs []float64
	top   []int
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
	end := len(logits) - 1
	p := s.softmax(logits, func(i int) bool { return i == end && !allowEnd })
	top := s.nucleus(p)
	w := s.spec.Window
	if w > 0 { // window 0: no repetition check
		rep := 0
		for _, t := range decoded[max(0, len(decoded)-w):] {
			if int(t) == top {
				rep++
			}
		}
		if float64(rep) >= float64(w)*s.spec.TauR {
			// Too repetitive: draw from everything but that token.
			p[top] = 0
			return s.draw(p, nil)
		}
	}
	return top
}

// softmax fills s.probs with the softmax of logits, banned entries 0 (a logit of -inf).
func (s *sampler) softmax(logits []float32, banned func(int) bool) []float64 {
	if cap(s.probs) < len(logits) {
		s.probs = make([]float64, len(logits))
	}
	p := s.probs[:len(logits)]
	hi := math.Inf(-1)
	for i, l := range logits {
		if !banned(i) {
			hi = max(hi, float64(l))
		}
	}
	var sum float64
	for i, l := range logits {
		if banned(i) {
			p[i] = 0
			continue
		}
		p[i] = math.Exp(float64(l) - hi)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

// nucleus takes tokens from the most likely down (ties: the lower id first) while their
// probability so far is below top_p and fewer than top_k are taken, and draws one of them in
// proportion to its probability.
func (s *sampler) nucleus(p []float64) int {
	k := s.spec.TopK
	top := s.top[:0]
	// The k most likely, in order, by insertion: k is small beside the vocabulary.
	for i, v := range p {
		if len(top) == k && v <= p[top[k-1]] {
			continue
		}
		j := len(top)
		if j < k {
			top = append(top, i)
		} else {
			j = k - 1
		}
		for j > 0 && p[top[j-1]] < v {
			top[j] = top[j-1]
			j--
		}
		top[j] = i
	}
	s.top = top
	var cum float64
	n := 0
	for n < len(top) && cum < s.spec.TopP {
		cum += p[top[n]]
		n++
	}
	return s.draw(p, top[:n])
}

// draw picks an index in proportion to p, among ids (all of p when ids is nil).
func (s *sampler) draw(p []float64, ids []int) int {
	var sum float64
	if ids == nil {
		for _, v := range p {
			sum += v
		}
	} else {
		for _, i := range ids {
			sum += p[i]
		}
	}
	r := s.rng.Float64() * sum
	last := -1
	if ids == nil {
		for i, v := range p {
			if v > 0 {
				last = i
				if r < v {
					return i
				}
				r -= v
			}
		}
		return last // r ran past the end by rounding
	}
	for _, i := range ids {
		last = i
		if r < p[i] {
			return i
		}
		r -= p[i]
	}
	return last
}
