// Package engine is the batching scheduler the model families build on: queues whose consumer
// takes everything waiting as one batch, the rule that picks a batch, and per-stage counters.
// It knows stages and batches, not models.
package engine

import "math"

// TakeBatch picks the next batch: first chunks of streams before later chunks (a new stream's
// first audio is what its client waits for), up to a budget of frames so one batch does not hold
// everyone else back for long; at least one item. With spread > 1, only items whose length falls
// in the leading item's band [spread^k, spread^(k+1)) join it; the others wait for a later batch.
// With spread 1 only items of the leading item's very length join it (no padding at all); with
// spread 0 any lengths mix.
// A stream's chunks stay in order: once one of its items waits, its later items wait too.
// info gives an item's length in frames, whether it is its stream's first, and its stream.
func TakeBatch[T any, K comparable](items []T, budget int, spread float64, busy map[K]bool, info func(T) (frames int, first bool, stream K)) (take, rest []T) {
	order := make([]T, 0, len(items))
	for _, it := range items {
		if _, first, _ := info(it); first {
			order = append(order, it)
		}
	}
	for _, it := range items {
		if _, first, _ := info(it); !first {
			order = append(order, it)
		}
	}
	band := func(frames int) int {
		switch {
		case spread == 1:
			return frames
		case spread < 1:
			return 0
		}
		return int(math.Floor(math.Log(float64(max(frames, 1))) / math.Log(spread)))
	}
	// Streams with a chunk in a batch under way (busy) wait as if an earlier item of theirs did.
	waiting := map[K]bool{}
	for s := range busy {
		waiting[s] = true
	}
	used, lead := 0, 0
	for _, it := range order {
		frames, _, s := info(it)
		if len(take) == 0 && !waiting[s] {
			lead = band(frames)
		}
		if waiting[s] || (len(take) > 0 && (used+frames > budget || band(frames) != lead)) {
			waiting[s] = true
			rest = append(rest, it)
			continue
		}
		used += frames
		take = append(take, it)
	}
	return take, rest
}
