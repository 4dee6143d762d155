package voxcpm

import (
	"math"
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

func TestTrimSilence(t *testing.T) {
	rate := 1000
	pcm := make([]float32, 3*rate)
	for i := rate; i < 2*rate; i++ {
		pcm[i] = float32(0.5 * math.Sin(float64(i)))
	}
	got := trimSilence(pcm, rate)
	// 20 ms kept each side of the loud second.
	if len(got) < rate || len(got) > rate+4*rate/100+rate/100 {
		t.Fatalf("trimmed to %d samples, want about %d", len(got), rate+4*rate/100)
	}
	if trimSilence(make([]float32, 100), rate) != nil {
		t.Fatal("a silent clip trims to nothing")
	}
}
