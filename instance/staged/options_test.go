package staged

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// section writes o as a group's engine section, as the config carries it to Open.
func section(t testing.TB, o Options) tts.EngineSection {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Engine options resolve to the provider's defaults where unset, and keep what is set.
func TestResolveOptions(t *testing.T) {
	shared, concat := &Manifest{}, &Manifest{}
	shared.LM.Cache, concat.LM.Cache = "shared", "concat"
	for _, c := range []struct {
		name string
		o    Options
		cuda bool
		m    *Manifest
		want options
	}{
		{"cpu defaults", Options{}, false, shared,
			options{lmHighPriority: true, lmGraph: "off", flowGraph: "off", flowWorkers: 1, vocoderWindow: NeverSplit}},
		{"cuda defaults, shared cache", Options{}, true, shared,
			options{lmHighPriority: true, lmGraph: "on", flowGraph: "on", flowWorkers: 2, vocoderBatches: []int{1, 4, 16}}},
		{"cuda, concat cache: no LM graphs", Options{}, true, concat,
			options{lmHighPriority: true, lmGraph: "off", flowGraph: "on", flowWorkers: 2, vocoderBatches: []int{1, 4, 16}}},
		{"cuda, all set", Options{LMStreamPriority: "normal", LMCUDAGraph: "decode", FlowCUDAGraph: "fixed", FlowWorkers: 3,
			FlowFirstWorker: "share", VocoderBatches: []int{2, 8}, VocoderWindow: 100}, true, shared,
			options{lmGraph: "decode", flowGraph: "fixed", flowWorkers: 3, flowShare: true, vocoderBatches: []int{2, 8}, vocoderWindow: 100}},
		{"cuda, vocoder batches off, never split", Options{VocoderBatches: []int{}, VocoderWindow: NeverSplit}, true, shared,
			options{lmHighPriority: true, lmGraph: "on", flowGraph: "on", flowWorkers: 2, vocoderWindow: NeverSplit}},
	} {
		got := resolveOptions(c.o, c.cuda, c.m)
		if got.lmHighPriority != c.want.lmHighPriority || got.lmGraph != c.want.lmGraph || got.flowGraph != c.want.flowGraph ||
			got.flowWorkers != c.want.flowWorkers || got.flowShare != c.want.flowShare ||
			!slices.Equal(got.vocoderBatches, c.want.vocoderBatches) || got.vocoderWindow != c.want.vocoderWindow {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// flow_chunk_cuda_graph: off by default on both providers, on is fixed on the CPU (nothing to
// capture), and flow_chunk_graph_rows defaults to 4.
func TestChunkGraphOptions(t *testing.T) {
	m := &Manifest{}
	for _, c := range []struct {
		o    Options
		cuda bool
		want FlowGraph
		rows int
	}{
		{Options{}, false, FlowGraphOff, 4},
		{Options{}, true, chunkGraphOnCUDA, 4},
		{Options{FlowChunkCUDAGraph: FlowGraphOn}, false, FlowGraphFixed, 4},
		{Options{FlowChunkCUDAGraph: FlowGraphOn, FlowChunkGraphRows: 2}, true, FlowGraphOn, 2},
		{Options{FlowChunkCUDAGraph: FlowGraphFixed}, true, FlowGraphFixed, 4},
	} {
		if got := resolveOptions(c.o, c.cuda, m); got.chunkGraph != c.want || got.chunkGraphRows != c.rows {
			t.Errorf("%+v on cuda %v: %s of %d rows, want %s of %d", c.o, c.cuda, got.chunkGraph, got.chunkGraphRows, c.want, c.rows)
		}
	}
}

// lm_cuda_graph needs the LM's shared cache contract: the tiny model's default LM concatenates
// its cache, so asking for graphs fails its load with the reason; a bad value fails with the key.
func TestLMCUDAGraphOption(t *testing.T) {
	if _, err := loadTiny(t, Options{LMCUDAGraph: "yes"}); err == nil || !strings.Contains(err.Error(), `engine.lm_cuda_graph: "yes" is not one of`) {
		t.Errorf("lm_cuda_graph yes: %v", err)
	}
	if _, err := loadTiny(t, Options{LMCUDAGraph: "on"}); err == nil || !strings.Contains(err.Error(), "lm_cuda_graph needs an LM with lm.cache: shared") {
		t.Errorf("lm_cuda_graph on with the concat cache: %v", err)
	}
	p, err := loadTiny(t, Options{LMCUDAGraph: "off"})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
}

// The engine section parses into typed options; a value outside an enum, a value of the wrong
// type, a range and another family's key are each refused naming the key.
func TestParseOptions(t *testing.T) {
	o, err := parseOptions(tts.EngineSection(`{"lm_cuda_graph": "decode", "flow_first_worker": "share", "vocoder_batches": [], "vocoder_window": -1, "intra_op_num_threads": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	if o.LMCUDAGraph != LMGraphDecode || o.FlowFirstWorker != FirstWorkerShare || o.VocoderBatches == nil || len(o.VocoderBatches) != 0 ||
		o.VocoderWindow != NeverSplit || o.IntraOpThreads != 2 {
		t.Fatalf("parsed %+v", o)
	}
	if o, err := parseOptions(nil); err != nil || o.VocoderBatches != nil || o.LMCUDAGraph != "" {
		t.Fatalf("no section: %+v, %v", o, err)
	}
	for section, want := range map[string]string{
		`{"flow_first_worker": "both"}`:    `engine.flow_first_worker: "both" is not one of [keep share]`,
		`{"lm_stream_priority": "low"}`:    `engine.lm_stream_priority: "low" is not one of [high normal]`,
		`{"flow_cuda_graph": true}`:        "engine.flow_cuda_graph: true is not a string",
		`{"flow_workers": 9}`:              "engine.flow_workers: 9 is not a number of workers from 1 to 8",
		`{"flow_chunk_cuda_graph": "yes"}`: `engine.flow_chunk_cuda_graph: "yes" is not one of [on fixed off]`,
		`{"flow_chunk_graph_rows": 17}`:    "engine.flow_chunk_graph_rows: 17 is not a number of rows from 1 to 16",
		`{"flow_chunk_graph_rows": -1}`:    "engine.flow_chunk_graph_rows: -1 is not a number of rows from 1 to 16",
		`{"vocoder_batches": [4, "x"]}`:    `engine.vocoder_batches: [4, "x"] is not a list of whole numbers`,
		`{"vocoder_cuda_graph": "on"}`:     "engine.vocoder_cuda_graph: the staged family's vocoder runs uncaptured; only voxcpm models capture theirs",
		`{"piper_batch": 8}`:               "engine.piper_batch: unknown key; the staged family's keys are " + strings.Join(Family{}.OptionKeys(), ", "),
	} {
		if _, err := parseOptions(tts.EngineSection(section)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", section, err, want)
		}
	}
}

// flow_kv_memory_mb: the option's, else 40% of the GPU (or its gpu_memory_limit), 24 GiB where
// its size is unknown, 2 GiB on the CPU; the prompt cache's default stays within a quarter of it.
func TestFlowKVMemory(t *testing.T) {
	for _, c := range []struct {
		o      Options
		cuda   bool
		device uint64
		want   int64
	}{
		{Options{}, false, 0, 2048 << 20},
		{Options{}, true, 0, 24 << 30},
		{Options{}, true, 80e9, 32e9},
		{Options{FlowKVMemoryMB: 100}, true, 80e9, 100 << 20},
	} {
		var r options
		r.promptCacheBytes = 8192 << 20
		r.setFlowKV(c.o, c.cuda, c.device)
		if r.flowKVBytes != c.want || r.promptCacheBytes != min(8192<<20, c.want/4) {
			t.Errorf("%+v cuda %v device %d: %d bytes, cache %d; want %d", c.o, c.cuda, c.device, r.flowKVBytes, r.promptCacheBytes, c.want)
		}
	}
	if err := (Options{FlowKVMemoryMB: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "engine.flow_kv_memory_mb") {
		t.Errorf("flow_kv_memory_mb -1: %v", err)
	}
}

// The flow's default bound, once loaded, leaves a quarter of the GPU beside it: on an 80 GB GPU
// with 43 GB free and 1.3 GB already the flow's, 24.3 GB; never more than the default it had, and
// never under 1 GiB.
func TestFlowKVFit(t *testing.T) {
	const G = int64(1) << 30
	for _, c := range []struct {
		limit, used int64
		free, total uint64
		want        int64
	}{
		{32 * G, 13 * G / 10, 43 << 30, 80 << 30, 13*G/10 + 43*G - 20*G},
		{8 * G, 0, 60 << 30, 80 << 30, 8 * G},
		{32 * G, 0, 10 << 30, 80 << 30, G},
	} {
		if got := flowKVFit(c.limit, c.used, c.free, c.total); got != c.want {
			t.Errorf("flowKVFit(%d, %d, %d, %d) = %d, want %d", c.limit, c.used, c.free, c.total, got, c.want)
		}
	}
}
