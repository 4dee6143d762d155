package voxcpm

import (
	"testing"
)

func TestCleanText(t *testing.T) {
	for in, want := range map[string]string{"  a  b\n\nc\t": "a b c", "": "", "\n": "", "你好 世界": "你好 世界"} {
		if got := cleanText(in); got != want {
			t.Errorf("cleanText(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPadPatches(t *testing.T) {
	a := []float32{1, 2, 3}
	if got := padPatches(a, 4); len(got) != 4 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("padPatches(%v, 4) = %v, want zeros on the left", a, got)
	}
	if got := padPatches(a, 3); len(got) != 3 {
		t.Fatalf("a whole patch was padded: %v", got)
	}
}
