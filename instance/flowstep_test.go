package instance

import (
	"slices"
	"strings"
	"testing"
)

// loadTinyStep loads models/tiny with its flow step graph (flow.step) in place of the estimator.
func loadTinyStep(t *testing.T, opts map[string]string) *Pipeline {
	t.Helper()
	m := tinyManifest(t)
	m.Flow.Step = "flow_step.onnx"
	p, err := loadPipeline(m, LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t), ProviderOptions: opts}, 0, 0)
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
	for _, mode := range []string{"off", "fixed"} {
		t.Run(mode, func(t *testing.T) {
			p := loadTinyStep(t, map[string]string{"flow_cuda_graph": mode})
			if p.flows[0].steps == nil || p.flows[0].estimator != nil {
				t.Fatal("the step graph is not what runs the flow")
			}
			if got := len(p.flows[0].steps.buckets) > 0; got != (mode == "fixed") {
				t.Fatalf("mode %s: buckets made: %v", mode, got)
			}
			sameAudio(t, est, testBatchedEqualsAlone(t, p, 0), "the step graph against the estimator")
		})
	}
}

// Several workers, small batches and buckets: the audio must not change.
func TestFlowStepWorkersEqualAlone(t *testing.T) {
	p := loadTinyStep(t, map[string]string{"flow_cuda_graph": "fixed", "flow_workers": "2"})
	if len(p.flows) != 2 || p.flows[0].steps == p.flows[1].steps {
		t.Fatalf("%d flow workers, want 2 with their own sessions", len(p.flows))
	}
	testBatchedEqualsAlone(t, p, 40)
}

func TestFlowStepOption(t *testing.T) {
	m := tinyManifest(t)
	m.Flow.Step = "flow_step.onnx"
	_, err := loadPipeline(m, LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t), ProviderOptions: map[string]string{"flow_cuda_graph": "yes"}}, 0, 0)
	if err == nil || !strings.Contains(err.Error(), "flow_cuda_graph") {
		t.Fatalf("flow_cuda_graph yes: err %v, want one naming the option", err)
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
	l := newFlowLanes(1, 1000, 1.3, 2, func(n, tokens int) int { return min(n, 2) })
	var items []*flowItem
	for range 3 {
		items = append(items, &flowItem{s: &stream{}, tokens: make([]int64, 20)})
	}
	take, rest, w := l.admit(items)
	if w != 0 || len(take) != 2 || take[0] != items[0] || take[1] != items[1] || len(rest) != 1 || rest[0] != items[2] {
		t.Fatalf("take %d, rest %d, worker %d", len(take), len(rest), w)
	}
}
