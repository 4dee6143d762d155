package router

import "math/rand/v2"

// leastLoaded picks, among candidates with a free slot, the one with the fewest in-flight
// requests relative to its capacity. Equally loaded candidates are chosen among at random (one
// pass, reservoir sampling), so an idle pool spreads requests over every instance rather than
// sending each to the first. full reports that some candidate was skipped for having no free slot.
func leastLoaded(cands []*Backend, skip func(*Backend) bool, rnd *rand.Rand) (best *Backend, full bool) {
	var bestLoad float64
	ties := 0
	for _, c := range cands {
		if skip(c) {
			continue
		}
		n := c.inflight.Load()
		if int(n) >= c.Capacity {
			full = true
			continue
		}
		load := float64(n) / float64(c.Capacity)
		switch {
		case best == nil || load < bestLoad:
			best, bestLoad, ties = c, load, 1
		case load == bestLoad:
			ties++
			if rnd.IntN(ties) == 0 {
				best = c
			}
		}
	}
	return best, full
}
