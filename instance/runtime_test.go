package instance

import (
	"maps"
	"strings"
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

// flow_workers is voxmux's own provider option: a count from 1 to 8, one on the CPU unless set.
func TestFlowWorkersOption(t *testing.T) {
	lib := ortLibrary(t)
	for _, c := range []struct {
		value string
		want  int
		err   string
	}{
		{"", 1, ""},
		{"3", 3, ""},
		{"0", 0, "provider option flow_workers: \"0\" is not a number of workers from 1 to 8"},
		{"two", 0, "provider option flow_workers: \"two\""},
	} {
		opts := map[string]string{}
		if c.value != "" {
			opts["flow_workers"] = c.value
		}
		r, err := newRuntime(LoadConfig{Provider: "cpu", ORTLibrary: lib, ProviderOptions: opts}, 0)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("flow_workers %q: error %v, want %q", c.value, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("flow_workers %q: %v", c.value, err)
		}
		if r.flowWorkers != c.want {
			t.Errorf("flow_workers %q: %d workers, want %d", c.value, r.flowWorkers, c.want)
		}
		r.close()
	}
}
