package instance

import (
	"maps"
	"strings"
	"testing"
)

// On CUDA the flow's sessions ask ONNX Runtime for its memory-efficient attention, and the
// vocoder's for channels-last convolutions, unless provider_options chose the attention kernels
// or the layout for every session; on the CPU there is nothing to choose.
func TestStageCUDAOptions(t *testing.T) {
	flow, vocoder := (*runtime).flowCUDAOptions, (*runtime).vocoderCUDAOptions
	for _, c := range []struct {
		name    string
		r       runtime
		options func(*runtime) map[string]string
		want    map[string]string
	}{
		{"flow, cuda", runtime{provider: "cuda"}, flow, map[string]string{"sdpa_kernel": "2"}},
		{"flow, cuda, sdpa_kernel given", runtime{provider: "cuda", sdpaSet: true}, flow, nil},
		{"flow, cpu", runtime{provider: "cpu"}, flow, nil},
		{"vocoder, cuda", runtime{provider: "cuda"}, vocoder, map[string]string{"prefer_nhwc": "1"}},
		{"vocoder, cuda, prefer_nhwc given", runtime{provider: "cuda", nhwcSet: true}, vocoder, nil},
		{"vocoder, cpu", runtime{provider: "cpu"}, vocoder, nil},
	} {
		if got := c.options(&c.r); !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("%s: CUDA options %v, want %v", c.name, got, c.want)
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

// lm_cuda_graph takes on or off, and needs the LM's shared cache contract: the tiny model's
// default LM concatenates its cache, so asking for graphs fails its load with the reason.
func TestLMCUDAGraphOption(t *testing.T) {
	if _, err := loadTiny(t, map[string]string{"lm_cuda_graph": "yes"}); err == nil || !strings.Contains(err.Error(), `provider option lm_cuda_graph: "yes" is not on, decode, off or fixed`) {
		t.Errorf("lm_cuda_graph yes: %v", err)
	}
	if _, err := loadTiny(t, map[string]string{"lm_cuda_graph": "on"}); err == nil || !strings.Contains(err.Error(), "lm_cuda_graph needs an LM with lm.cache: shared") {
		t.Errorf("lm_cuda_graph on with the concat cache: %v", err)
	}
	p, err := loadTiny(t, map[string]string{"lm_cuda_graph": "off"})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	// Unset, the graphs run wherever they can: CUDA and the shared cache.
	shared, concat := &Manifest{}, &Manifest{}
	shared.LM.Cache, concat.LM.Cache = "shared", "concat"
	for _, c := range []struct {
		r    runtime
		m    *Manifest
		want string
	}{
		{runtime{provider: "cuda"}, shared, "on"},
		{runtime{provider: "cuda", lmGraph: "decode"}, shared, "decode"},
		{runtime{provider: "cuda"}, concat, "off"},
		{runtime{provider: "cpu"}, shared, "off"},
		{runtime{provider: "cuda", lmGraph: "off"}, shared, "off"},
		{runtime{provider: "cuda", lmGraph: "fixed"}, shared, "fixed"},
	} {
		if got := c.r.lmGraphMode(c.m); got != c.want {
			t.Errorf("provider %s, option %q, cache %s: lm_cuda_graph %s, want %s", c.r.provider, c.r.lmGraph, c.m.LM.Cache, got, c.want)
		}
	}
}
