package engine

import "math"

// ReplayTolerance is the most a CUDA graph's replay may differ from an uncaptured run of the same
// inputs (RelRMS) before the graph is taken to hold a kernel that cannot be captured: the same
// kernels on the same inputs differ by rounding at most, and an uncapturable one (a Split or
// Concat of unequal pieces, whose sizes ONNX Runtime stages in host memory) computes garbage.
const ReplayTolerance = 1e-3

// RelRMS is the rms of got - want over the rms of want; NaN if either holds a NaN.
func RelRMS(got, want []float32) float64 {
	var d, n float64
	for i, v := range want {
		d += float64(got[i]-v) * float64(got[i]-v)
		n += float64(v) * float64(v)
	}
	return math.Sqrt(d / max(n, 1e-30))
}
