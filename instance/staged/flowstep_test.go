package staged

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// loadTinyStep loads models/tiny with its flow step graph (flow.step) in place of the estimator.
func loadTinyStep(t *testing.T, opts Options) *Pipeline {
	t.Helper()
	m := tinyManifest(t)
	m.Flow.Step = "flow_step.onnx"
	p, err := loadPipeline(m, tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, opts)}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The step graph does what the engine does on the host with the estimator (guidance, the Euler
// update), so requests must give the same audio either way, in every flow_cuda_graph mode: off
// (each batch its own shape) and fixed (the buckets' shapes, as the CUDA graphs run them).
// Tolerance 1e-4 per sample, as for batching.
func TestFlowStepGraphEqualsEstimator(t *testing.T) {
	est := NewEngine(tinyPipeline(t))
	defer est.Close()
	for _, mode := range []FlowGraph{FlowGraphOff, FlowGraphFixed} {
		t.Run(string(mode), func(t *testing.T) {
			p := loadTinyStep(t, Options{FlowCUDAGraph: mode})
			steps, ok := p.flows[0].(*flowSteps)
			if !ok {
				t.Fatal("the step graph is not what runs the flow")
			}
			if got := len(steps.buckets) > 0; got != (mode == "fixed") {
				t.Fatalf("mode %s: buckets made: %v", mode, got)
			}
			sameAudio(t, est, testBatchedEqualsAlone(t, p, 0), "the step graph against the estimator")
		})
	}
}

// Several workers, small batches and buckets: the audio must not change.
func TestFlowStepWorkersEqualAlone(t *testing.T) {
	p := loadTinyStep(t, Options{FlowCUDAGraph: "fixed", FlowWorkers: 2})
	if len(p.flows) != 2 || p.flows[0] == p.flows[1] {
		t.Fatalf("%d flow workers, want 2 with their own sessions", len(p.flows))
	}
	testBatchedEqualsAlone(t, p, 40)
}

func TestFlowStepOption(t *testing.T) {
	m := tinyManifest(t)
	m.Flow.Step = "flow_step.onnx"
	_, err := loadPipeline(m, tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, Options{FlowCUDAGraph: "yes"})}, 0, 0)
	if err == nil || !strings.Contains(err.Error(), "flow_cuda_graph") {
		t.Fatalf("flow_cuda_graph yes: err %v, want one naming the option", err)
	}
	_, err = loadPipeline(m, tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, Options{VocoderCUDAGraph: "on"})}, 0, 0)
	if err == nil || !strings.Contains(err.Error(), "engine.vocoder_cuda_graph") {
		t.Fatalf("vocoder_cuda_graph on: err %v, want a refusal naming the option", err)
	}
	m.Flow.Step = "missing.onnx"
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "flow.step") {
		t.Fatalf("a missing step graph: err %v, want one naming flow.step", err)
	}
	m.Flow.Step, m.Flow.Estimator = "", ""
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "flow.estimator") {
		t.Fatalf("neither estimator nor step: err %v, want one naming flow.estimator", err)
	}
}

// The buckets' lengths follow the chunk schedule: the benchmark model's [8, 25, 50, 100] with 15
// tokens of context gives batches of 8, 33, 65 and 115 tokens, which their own buckets hold with
// at most 3 tokens of padding.
func TestFlowTokenSizes(t *testing.T) {
	m := &Manifest{Flow: FlowSpec{FramesPerToken: 2}, Streaming: StreamingSpec{ChunkTokens: []int{8, 25, 50, 100}, ContextTokens: 15}}
	want := []int{8, 16, 32, 36, 48, 64, 68, 80, 96, 112, 116}
	if got := flowTokenSizes(m); !slices.Equal(got, want) {
		t.Fatalf("token buckets %v, want %v", got, want)
	}
}

// A batch takes what a bucket holds with little padding, else what the largest bucket below
// holds; lengths no bucket holds take everything (their batch runs in its own shape).
func TestFlowStepFit(t *testing.T) {
	s := &flowSteps{batches: []int{1, 2, 4, 6, 8, 16}, tokens: []int{8, 16}, buckets: map[[2]int]*flowBucket{}}
	for _, b := range s.batches {
		s.buckets[[2]int{b, 8}] = &flowBucket{}
		if b <= 8 {
			s.buckets[[2]int{b, 16}] = &flowBucket{}
		}
	}
	for _, c := range []struct{ n, tokens, want int }{
		{1, 8, 1}, {3, 8, 2}, {5, 8, 4}, {7, 8, 7}, {15, 8, 15}, {12, 8, 8}, {40, 8, 16},
		{12, 16, 8}, {7, 12, 7}, {30, 17, 30},
	} {
		if got := s.fit(c.n, c.tokens); got != c.want {
			t.Errorf("fit(%d items, %d tokens) = %d, want %d", c.n, c.tokens, got, c.want)
		}
	}
}

// The lanes cut a batch to what fit allows; the items cut off wait first, in order.
func TestFlowLanesTrim(t *testing.T) {
	l := newFlowLanes(1, 1000, 1.3, 2, func(n, tokens int) int { return min(n, 2) }, nil)
	var items []*flowItem
	for range 3 {
		items = append(items, &flowItem{s: &stream{}, tokens: make([]int64, 20)})
	}
	take, rest, w := l.admit(items)
	if w != 0 || len(take) != 2 || take[0] != items[0] || take[1] != items[1] || len(rest) != 1 || rest[0] != items[2] {
		t.Fatalf("take %d, rest %d, worker %d", len(take), len(rest), w)
	}
}

// The lanes also cut a batch whose padded frames would pass the manifest's flow.max_batch_frames.
func TestFlowLanesTrimToMaxFrames(t *testing.T) {
	fits := func(n, tokens int) bool { return n*tokens*2 <= 100 }
	l := newFlowLanes(1, 1000, 1.3, 2, nil, fits)
	var items []*flowItem
	for range 3 {
		items = append(items, &flowItem{s: &stream{}, tokens: make([]int64, 20)})
	}
	take, rest, _ := l.admit(items)
	if len(take) != 2 || len(rest) != 1 || rest[0] != items[2] {
		t.Fatalf("take %d, rest %d; want 2 items (80 frames), 1 waiting", len(take), len(rest))
	}
}

// flow.max_batch_frames: a manifest must let the longest chunk run alone; a flow run over the
// limit is refused with an error naming the key (on CUDA it would be an illegal memory access);
// bench stages skips that shape; and the engine's batches stay within it, batched still equal
// to alone.
func TestFlowMaxBatchFrames(t *testing.T) {
	m := tinyManifest(t)
	// The longest chunk: 50 tokens and 4 of context, padded to 56 tokens, 112 frames.
	m.Flow.MaxBatchFrames = 111
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "flow.max_batch_frames") || !strings.Contains(err.Error(), "112 frames") {
		t.Fatalf("max_batch_frames 111: err %v, want one naming the key and 112 frames", err)
	}
	m.Flow.MaxBatchFrames = 120
	if err := m.validate(); err != nil {
		t.Fatal(err)
	}
	p, err := loadPipeline(m, tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t)}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	jobs := func(n, tokens int) []flowJob {
		out := make([]flowJob, n)
		for i := range out {
			out[i] = flowJob{tokens: make([]int64, tokens), noise: p.noise(uint64(i), 0, tokens*2)}
		}
		return out
	}
	if _, err := p.flows[0].run(jobs(3, 20), nil); err != nil { // 120 frames
		t.Fatalf("3 × 20 tokens: %v", err)
	}
	if _, err := p.flows[0].run(jobs(4, 20), nil); err == nil || !strings.Contains(err.Error(), "flow.max_batch_frames (120)") {
		t.Fatalf("4 × 20 tokens: err %v, want one naming flow.max_batch_frames (120)", err)
	}
	res, err := p.ProfileStages(StageProfile{Batches: []int{3, 4}, Tokens: []int{20}, Runs: 1, Together: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res {
		s := fmt.Sprintf("%s %d", r.Stage, r.Batch)
		if r.Together {
			s += " together"
		}
		if r.Skipped != "" {
			s += " skipped"
			if r.Mean != 0 || !strings.Contains(r.Skipped, "flow.max_batch_frames") {
				t.Errorf("skipped timing %+v: want no time and the reason", r)
			}
		}
		got = append(got, s)
	}
	want := "lm_decode 3,flow 3,vocoder 3,lm_decode 3 together,flow 3 together,vocoder 3 together," +
		"lm_decode 4,flow 4 skipped,vocoder 4,lm_decode 4 together,vocoder 4 together"
	if strings.Join(got, ",") != want {
		t.Fatalf("timings %s\nwant %s", strings.Join(got, ","), want)
	}
	testBatchedEqualsAlone(t, p, 0)
}
