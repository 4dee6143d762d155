package voxcpm

import "math/rand/v2"

// row is a running request's host state between steps, owned by the scheduler.
type row struct {
	r    *request
	slot int
	// pos is the cache positions the row fills: its prompt and the patches stepped so far.
	pos int
	// i is the index of the next patch.
	i int
	// mu and stop are patch i's condition and stop logits (from the prefill or the step before).
	mu   []float32
	stop [2]float32
	// cond is the previous patch: the voice's last patch, or zeros, for patch 0.
	cond []float32
}

// ends reports whether a row whose patch i came with stop logits stop ends after it: the stop
// head says stop once past patch index generation.min_len, or the next patch would pass the
// request's bound (docs/voxcpm.md, the row's loop).
func ends(i int, stop [2]float32, minLen, bound int) bool {
	return (i > minLen && stop[1] > stop[0]) || i+1 >= bound
}

// fillNoise writes patch i's starting noise for a request of seed into dst, [feat_dim][patch_size]
// (the step graph's layout). The draws are standard normal (math/rand/v2's NormFloat64) from a
// PCG seeded with (seed, i), taken in dst's order: feature 0's patch_size values first. A patch's
// noise thus depends on the seed and its index alone, not on what runs beside it.
func fillNoise(dst []float32, seed uint64, i int) {
	g := rand.New(rand.NewPCG(seed, uint64(i)))
	for k := range dst {
		dst[k] = float32(g.NormFloat64())
	}
}
