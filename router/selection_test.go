package router

import (
	"math/rand/v2"
	"testing"
)

// Equally loaded backends share the requests: ties are broken at random, not always towards the
// first backend; a less loaded backend always wins, and full or skipped ones never do.
func TestLeastLoadedTies(t *testing.T) {
	a, b, c := &Backend{Name: "a", Capacity: 4}, &Backend{Name: "b", Capacity: 4}, &Backend{Name: "c", Capacity: 4}
	rnd := rand.New(rand.NewPCG(1, 2))
	none := func(*Backend) bool { return false }
	picks := map[string]int{}
	for range 3000 {
		best, _ := leastLoaded([]*Backend{a, b, c}, none, rnd)
		picks[best.Name]++
	}
	for _, n := range []string{"a", "b", "c"} {
		if picks[n] < 800 || picks[n] > 1200 {
			t.Errorf("idle, equal backends: %v, want about 1000 each", picks)
			break
		}
	}
	a.inflight.Store(1)
	b.inflight.Store(1)
	if best, _ := leastLoaded([]*Backend{a, b, c}, none, rnd); best != c {
		t.Errorf("picked %s, want the least loaded c", best.Name)
	}
	// Relative to capacity: 1 of 4 is less loaded than 1 of 2.
	c.Capacity = 2
	c.inflight.Store(1)
	for range 100 {
		if best, _ := leastLoaded([]*Backend{c, a}, none, rnd); best != a {
			t.Fatalf("picked %s, want a (1 of 4 against 1 of 2)", best.Name)
		}
	}
	a.inflight.Store(4)
	b.inflight.Store(4)
	best, full := leastLoaded([]*Backend{a, b}, none, rnd)
	if best != nil || !full {
		t.Errorf("all full: %v, %v", best, full)
	}
	best, full = leastLoaded([]*Backend{a, b, c}, func(x *Backend) bool { return x == c }, rnd)
	if best != nil || !full {
		t.Errorf("only full ones left after skipping: %v, %v", best, full)
	}
}
