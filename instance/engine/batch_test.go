package engine

import "testing"

func TestTakeBatch(t *testing.T) {
	a, b, c := "a", "b", "c"
	type it struct {
		s      string
		frames int
		first  bool
		name   string
	}
	items := []it{{a, 30, false, "a1"}, {b, 10, true, "b0"}, {a, 30, false, "a2"}, {c, 10, true, "c0"}, {b, 50, false, "b1"}}
	take, rest := TakeBatch(items, 60, 0, map[string]bool(nil), func(x it) (int, bool, string) { return x.frames, x.first, x.s })
	names := func(xs []it) (n []string) {
		for _, x := range xs {
			n = append(n, x.name)
		}
		return n
	}
	// First chunks lead; a1 fits; a2 would overflow and waits; b1 waits too.
	if got := names(take); len(got) != 3 || got[0] != "b0" || got[1] != "c0" || got[2] != "a1" {
		t.Fatalf("take %v", got)
	}
	if got := names(rest); len(got) != 2 || got[0] != "a2" || got[1] != "b1" {
		t.Fatalf("rest %v", got)
	}
	// One item over the budget still runs alone.
	take, _ = TakeBatch([]it{{a, 500, false, "big"}}, 60, 0, map[string]bool(nil), func(x it) (int, bool, string) { return x.frames, x.first, x.s })
	if len(take) != 1 {
		t.Fatal("an item over the budget never runs")
	}
	// Grouped by length: the short first chunks run together, then the 30-frame chunks; b1
	// (50 frames) is in another band and waits, and so would anything of b's after it.
	spread := 1.5
	info := func(x it) (int, bool, string) { return x.frames, x.first, x.s }
	take, rest = TakeBatch(items, 1000, spread, nil, info)
	if got := names(take); len(got) != 2 || got[0] != "b0" || got[1] != "c0" {
		t.Fatalf("by length: take %v", got)
	}
	take, rest = TakeBatch(rest, 1000, spread, nil, info)
	exact, _ := TakeBatch([]it{{a, 30, false, "a1"}, {b, 31, false, "b1"}, {c, 30, false, "c1"}}, 1000, 1, map[string]bool(nil), info)
	if got := names(exact); len(got) != 2 || got[0] != "a1" || got[1] != "c1" {
		t.Fatalf("spread 1, equal lengths only: take %v", got)
	}
	if got := names(take); len(got) != 2 || got[0] != "a1" || got[1] != "a2" {
		t.Fatalf("by length, second batch: take %v", got)
	}
	if got := names(rest); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("by length, second batch: rest %v", got)
	}
}
