package staged

import (
	"slices"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// Engine options resolve to the provider's defaults where unset, and keep what is set.
func TestResolveOptions(t *testing.T) {
	shared, concat := &Manifest{}, &Manifest{}
	shared.LM.Cache, concat.LM.Cache = "shared", "concat"
	for _, c := range []struct {
		name string
		o    tts.EngineOptions
		cuda bool
		m    *Manifest
		want options
	}{
		{"cpu defaults", tts.EngineOptions{}, false, shared,
			options{lmHighPriority: true, lmGraph: "off", flowGraph: "off", flowWorkers: 1}},
		{"cuda defaults, shared cache", tts.EngineOptions{}, true, shared,
			options{lmHighPriority: true, lmGraph: "on", flowGraph: "on", flowWorkers: 2, vocoderBatches: []int{1, 4, 16}, vocoderWindow: -1}},
		{"cuda, concat cache: no LM graphs", tts.EngineOptions{}, true, concat,
			options{lmHighPriority: true, lmGraph: "off", flowGraph: "on", flowWorkers: 2, vocoderBatches: []int{1, 4, 16}, vocoderWindow: -1}},
		{"cuda, all set", tts.EngineOptions{LMStreamPriority: "normal", LMCUDAGraph: "decode", FlowCUDAGraph: "fixed", FlowWorkers: 3,
			FlowFirstWorker: "share", VocoderBatches: []int{2, 8}, VocoderWindow: 100}, true, shared,
			options{lmGraph: "decode", flowGraph: "fixed", flowWorkers: 3, flowShare: true, vocoderBatches: []int{2, 8}, vocoderWindow: 100}},
		{"cuda, vocoder batches off, never split", tts.EngineOptions{VocoderBatchesSet: true, VocoderWindow: -1}, true, shared,
			options{lmHighPriority: true, lmGraph: "on", flowGraph: "on", flowWorkers: 2}},
	} {
		got := resolveOptions(c.o, c.cuda, c.m)
		if got.lmHighPriority != c.want.lmHighPriority || got.lmGraph != c.want.lmGraph || got.flowGraph != c.want.flowGraph ||
			got.flowWorkers != c.want.flowWorkers || got.flowShare != c.want.flowShare ||
			!slices.Equal(got.vocoderBatches, c.want.vocoderBatches) || got.vocoderWindow != c.want.vocoderWindow {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// lm_cuda_graph needs the LM's shared cache contract: the tiny model's default LM concatenates
// its cache, so asking for graphs fails its load with the reason; a bad value fails with the key.
func TestLMCUDAGraphOption(t *testing.T) {
	if _, err := loadTiny(t, tts.EngineOptions{LMCUDAGraph: "yes"}); err == nil || !strings.Contains(err.Error(), `engine.lm_cuda_graph: "yes" is not one of`) {
		t.Errorf("lm_cuda_graph yes: %v", err)
	}
	if _, err := loadTiny(t, tts.EngineOptions{LMCUDAGraph: "on"}); err == nil || !strings.Contains(err.Error(), "lm_cuda_graph needs an LM with lm.cache: shared") {
		t.Errorf("lm_cuda_graph on with the concat cache: %v", err)
	}
	p, err := loadTiny(t, tts.EngineOptions{LMCUDAGraph: "off"})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
}
