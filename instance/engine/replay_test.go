package engine

import (
	"math"
	"testing"
)

func TestRelRMS(t *testing.T) {
	if r := RelRMS([]float32{3, 4}, []float32{3, 4}); r != 0 {
		t.Errorf("equal: %g", r)
	}
	if r := RelRMS([]float32{3, 0}, []float32{3, 4}); math.Abs(r-0.8) > 1e-12 {
		t.Errorf("one value off by 4 of rms 5: %g, want 0.8", r)
	}
	if r := RelRMS([]float32{float32(math.NaN()), 4}, []float32{3, 4}); r <= ReplayTolerance {
		t.Errorf("a NaN passes the tolerance: %g", r)
	}
}
