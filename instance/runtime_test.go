package instance

import (
	"maps"
	"testing"
)

// On CUDA the flow's sessions ask ONNX Runtime for its memory-efficient attention unless
// provider_options chose the attention kernels itself; on the CPU there is nothing to choose.
func TestFlowCUDAOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		r    runtime
		want map[string]string
	}{
		{"cuda", runtime{provider: "cuda"}, map[string]string{"sdpa_kernel": "2"}},
		{"cuda, sdpa_kernel given", runtime{provider: "cuda", sdpaSet: true}, nil},
		{"cpu", runtime{provider: "cpu"}, nil},
	} {
		if got := c.r.flowCUDAOptions(); !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("%s: flow CUDA options %v, want %v", c.name, got, c.want)
		}
	}
}
