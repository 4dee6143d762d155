package ort

import (
	"maps"
	"testing"
)

// On CUDA the flow's sessions ask ONNX Runtime for its memory-efficient attention, and the
// vocoder's for channels-last convolutions, unless provider_options chose the attention kernels
// or the layout for every session; on the CPU there is nothing to choose.
func TestStageCUDAOptions(t *testing.T) {
	flow, vocoder := (*Runtime).FlowCUDAOptions, (*Runtime).VocoderCUDAOptions
	for _, c := range []struct {
		name    string
		r       Runtime
		options func(*Runtime) map[string]string
		want    map[string]string
	}{
		{"flow, cuda", Runtime{provider: "cuda"}, flow, map[string]string{"sdpa_kernel": "2"}},
		{"flow, cuda, sdpa_kernel given", Runtime{provider: "cuda", sdpaSet: true}, flow, nil},
		{"flow, cpu", Runtime{provider: "cpu"}, flow, nil},
		{"vocoder, cuda", Runtime{provider: "cuda"}, vocoder, map[string]string{"prefer_nhwc": "1"}},
		{"vocoder, cuda, prefer_nhwc given", Runtime{provider: "cuda", nhwcSet: true}, vocoder, nil},
		{"vocoder, cpu", Runtime{provider: "cpu"}, vocoder, nil},
	} {
		if got := c.options(&c.r); !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("%s: CUDA options %v, want %v", c.name, got, c.want)
		}
	}
}
