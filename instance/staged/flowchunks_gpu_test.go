package staged

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// On a GPU host (VOXMUX_GPU_MANIFEST: an export with flow.chunk_step, such as
// models/tiny-cosyvoice3/pipeline.yaml or a float16 CosyVoice3 export; ORT_LIB: ONNX Runtime with
// the CUDA provider), the chunk-causal flow on the CUDA provider (its Euler steps queued on the
// session's stream, the context samples on the device) gives every chunk of a batch of streams in
// two voices the mel of the host runner chunkFlow on the CPU provider over the whole utterance,
// within float32 rounding (TF32 matmuls included), for a float32 export (the host runner computes
// in float32 only); its runs copy between host and device and wait as often as on the CPU. The test logs
// the nodes of flow_chunk.onnx that ONNX Runtime placed on the CPU provider and the copies it
// inserted between host and device memory (from the session's profile).
func TestChunkFlowOnGPU(t *testing.T) {
	m := gpuManifest(t)
	if m.Flow.ChunkStep == "" {
		t.Skipf("%s has no flow.chunk_step", m.File)
	}
	const tol = 1e-3 // relative rms of a chunk's mel, float32
	prof := t.TempDir() + "/"
	load := func(provider, extra string) *Engine {
		p, err := LoadPipeline(tts.LoadConfig{Manifest: m.File, Provider: provider, ORTLibrary: ortLibrary(t),
			Engine: tts.EngineSection(`{"flow_chunk_emit": "cosyvoice"` + extra + `}`)})
		if err != nil {
			t.Fatalf("%s: %v", provider, err)
		}
		return NewEngine(p)
	}
	// VOXMUX_GPU_PROVIDER=cpu runs the test's own logic without a GPU (both engines on the CPU).
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	gpu := load(provider, `, "profile": "`+prof+`"`)
	closeGPU := sync.OnceFunc(func() { gpu.Close() })
	t.Cleanup(closeGPU)
	cpu := load("cpu", "")
	t.Cleanup(func() { cpu.Close() })

	// The per-run copies and waits, the same two chunks of one stream on each provider.
	onGPU := chunkRunIO(t, gpu.p.flows[0].(*flowChunks), m.Flow.Steps)
	onCPU := chunkRunIO(t, cpu.p.flows[0].(*flowChunks), m.Flow.Steps)
	t.Logf("per run, copies between host and device and waits: %s %+v, cpu %+v", provider, onGPU, onCPU)
	if !slices.Equal(onGPU, onCPU) {
		t.Errorf("per run on %s %+v, on the CPU %+v", provider, onGPU, onCPU)
	}

	// A batch of streams in two voices with prompts: the export's first voice with one, and the
	// same prompt at half the level (another voice to the prompt cache).
	v := promptVoice(t, m)
	M := m.Flow.MelBins
	half := frameMajor(v.Mel, M, len(v.Mel)/M)
	for i := range half {
		half[i] *= 0.5
	}
	other := &tts.VoicePrompt{Text: v.Text, SpeechTokens: v.SpeechTokens, Mel: half, MelBins: M, Embedding: v.Embedding}
	texts := []string{chunkText, "Another sentence, in the same voice.", "A third one, somewhat longer than the second, to keep more chunks.",
		"The fourth request speaks of memory, and of waiting for it.", "Five streams at once, in two voices.", "Short."}
	type got struct {
		chunks [][]float32
		tokens []int64
		voice  *Voice
	}
	var mu sync.Mutex
	res := map[uint64]*got{}
	gpu.onMel = func(s *stream, mel []float32, last bool) {
		mu.Lock()
		defer mu.Unlock()
		g := res[s.req.Seed]
		if g == nil {
			g = &got{}
			res[s.req.Seed] = g
		}
		g.chunks = append(g.chunks, mel)
		if last {
			g.tokens, g.voice = slices.Clone(s.tokens), s.voice
		}
	}
	// Twice: the second round reads both voices' kept frames from the prompt cache.
	for round := range 2 {
		var wg sync.WaitGroup
		errs := make([]error, len(texts))
		for i, text := range texts {
			req := tts.Request{Text: text, Voice: v.Name, Seed: uint64(100*round + i + 1)}
			if i%2 == 1 {
				req.Voice, req.Prompt = "", other
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = gpu.Synthesize(context.Background(), req, func(tts.Chunk) error { return nil })
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, request %d: %v", round, i, err)
			}
		}
	}
	pc := gpu.Report().PromptCache
	t.Logf("prompt cache on %s: %+v", provider, pc)
	if pc.Misses != 2 || pc.Hits < uint64(2*len(texts)-2) {
		t.Errorf("prompt cache after two rounds in two voices: %+v, want 2 misses and every other request a hit", pc)
	}
	if m.DType == "float16" {
		// chunkFlow, the host runner, computes in float32 only; TestChunkFlowGraphsOnGPU compares
		// a float16 export's captured runs with its uncaptured ones.
		t.Logf("%s is float16: its chunks are not compared with the host runner, which needs a float32 export", m.File)
		return
	}
	seeds := make([]uint64, 0, len(res))
	for s := range res {
		seeds = append(seeds, s)
	}
	slices.Sort(seeds)
	var worst, worstAbs float64
	for _, seed := range seeds {
		g := res[seed]
		if g.tokens == nil {
			t.Fatalf("request %d: no last chunk", seed)
		}
		whole, P := wholeChunkRun(t, cpu, g.voice, g.tokens)
		Fr := len(whole) / M
		at := P
		for i, c := range g.chunks {
			n := len(c) / M
			want := make([]float32, 0, M*n)
			for ch := range M {
				want = append(want, whole[ch*Fr+at:ch*Fr+at+n]...)
			}
			if len(want) != len(c) {
				t.Fatalf("request %d, chunk %d: %d values, the whole run has %d there", seed, i, len(c), len(want))
			}
			r := chunkRelRMS(c, want)
			worst, worstAbs = max(worst, r), max(worstAbs, float64(maxDiff(c, want)))
			if r > tol {
				t.Errorf("request %d, chunk %d of %d (frames %d..%d): relative rms difference %.3g from the CPU's whole run (tolerance %.g)", seed, i, len(g.chunks), at, at+n, r, tol)
			}
			at += n
		}
		if at != Fr {
			t.Errorf("request %d: the chunks hold frames %d..%d, the utterance %d..%d", seed, P, at, P, Fr)
		}
	}
	t.Logf("%s (%s), %d requests: every chunk on %s within relative rms %.3g (largest |diff| %.3g) of the host chunkFlow on the CPU",
		m.File, m.DType, len(seeds), provider, worst, worstAbs)

	closeGPU() // writes the profiles
	placement(t, prof)
}

func chunkRelRMS(a, b []float32) float64 {
	var d, s float64
	for i := range a {
		d += float64(a[i]-b[i]) * float64(a[i]-b[i])
		s += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / max(s, 1e-30))
}

// placement logs, from the CUDA engine's profiles under prefix, the chunk step's nodes that ran on
// the CPU provider and the host-device copies ONNX Runtime inserted (Memcpy nodes): a device input
// such as start feeding a CPU node costs a copy to the host and a wait inside every step.
func placement(t *testing.T, prefix string) {
	t.Helper()
	files, _ := filepath.Glob(prefix + "flow_chunk*.json")
	if len(files) == 0 {
		t.Errorf("no profile of the chunk step under %s", prefix)
		return
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var events []struct {
			Cat  string `json:"cat"`
			Name string `json:"name"`
			Args struct {
				Op       string `json:"op_name"`
				Provider string `json:"provider"`
			} `json:"args"`
		}
		if err := json.Unmarshal(data, &events); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		cpuNodes, copies := map[string]int{}, map[string]int{}
		for _, e := range events {
			if e.Cat != "Node" || e.Args.Op == "" {
				continue
			}
			if e.Args.Provider == "CPUExecutionProvider" {
				cpuNodes[fmt.Sprintf("%s (%s)", e.Name, e.Args.Op)]++
			}
			if e.Args.Op == "MemcpyToHost" || e.Args.Op == "MemcpyFromHost" {
				copies[e.Name]++
			}
		}
		t.Logf("%s: %d node kinds on the CPU provider, %d host-device copy nodes", filepath.Base(f), len(cpuNodes), len(copies))
		for _, set := range []struct {
			what string
			m    map[string]int
		}{{"on the CPU provider", cpuNodes}, {"copy between host and device", copies}} {
			keys := make([]string, 0, len(set.m))
			for k := range set.m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			if len(keys) > 40 {
				keys = keys[:40] // every node, on the CPU provider's dry run
			}
			for _, k := range keys {
				t.Logf("  %s: %s, %d profile events", set.what, k, set.m[k])
			}
		}
	}
}

// On a GPU host (VOXMUX_GPU_MANIFEST, ORT_LIB as TestChunkFlowOnGPU), the chunk-causal flow's
// batches of 1, 2 and 3 rows run as replays of CUDA graphs captured at load
// (flow_chunk_cuda_graph: on) give the mel of the same batches run uncaptured in their own
// shapes on the GPU, within float32 rounding (1e-3 relative rms) for a float32 export and
// float16 rounding (2e-2) for a float16 one. It logs the milliseconds of one flow run of one row
// (a 50-frame chunk over the voice's kept frames and two of its own), captured and uncaptured.
func TestChunkFlowGraphsOnGPU(t *testing.T) {
	m := gpuManifest(t)
	if m.Flow.ChunkStep == "" {
		t.Skipf("%s has no flow.chunk_step", m.File)
	}
	tol := 1e-3
	if m.DType == "float16" {
		tol = 2e-2
	}
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	open := func(opts string) *flowChunks {
		p, err := LoadPipeline(tts.LoadConfig{Manifest: m.File, Provider: provider, ORTLibrary: ortLibrary(t),
			Engine: tts.EngineSection("{" + opts + "}")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p.flows[0].(*flowChunks)
	}
	// The LM does not run here: no graphs of its own to capture.
	plain := open(`"flow_chunk_cuda_graph": "off", "flow_workers": 1, "lm_cuda_graph": "off"`)
	t0 := time.Now()
	graphs := open(`"flow_chunk_cuda_graph": "on", "flow_workers": 1, "lm_cuda_graph": "off"`)
	g := graphs.graphs
	if g == nil {
		t.Fatal("flow_chunk_cuda_graph on made no buckets")
	}
	plainBuckets := 0
	for _, b := range g.buckets {
		if b.plain {
			plainBuckets++
		}
	}
	t.Logf("%s: %d buckets (rows %v, new frames %v, past frames up to %d), %d of them uncaptured after their check, %d MiB of buffers; the pipeline loaded in %v",
		provider, len(g.buckets), g.rows, g.news, g.pasts[1][len(g.pasts[1])-1], plainBuckets, g.bytes>>20, time.Since(t0).Round(time.Millisecond))
	if plainBuckets > 0 {
		t.Errorf("%d buckets' replays differ from their uncaptured runs", plainBuckets)
	}
	v := promptVoice(t, m)
	rounds := chunkGraphRounds(m, v)[:4]
	CF := m.Flow.ChunkFrames
	want, _ := runChunkRounds(t, plain, v, rounds)
	got, used := runChunkRounds(t, graphs, v, rounds)
	worst := 0.0
	for r := range rounds {
		if used[r] == nil {
			t.Errorf("round %d of %d rows ran in its own shape", r, len(rounds[r]))
		}
		for j := range rounds[r] {
			d := chunkRelRMS(got[r][j], want[r][j])
			worst = max(worst, d)
			if !(d <= tol) {
				t.Errorf("round %d row %d: relative rms %.3g against the uncaptured run", r, j, d)
			}
		}
	}
	t.Logf("captured against uncaptured: every row within %.3g relative rms", worst)

	// One row's flow run over the voice's kept frames and two chunks of its own, keeping nothing
	// (so every run is the same), captured and uncaptured.
	for _, fc := range []*flowChunks{plain, graphs} {
		st := &chunkKV{}
		t.Cleanup(st.close)
		if err := fc.attachVoice(st, v, v.Embedding, nil); err != nil {
			t.Fatal(err)
		}
		toks := slices.Concat(v.SpeechTokens, make([]int64, 200))
		for i := len(v.SpeechTokens); i < len(toks); i++ {
			toks[i] = int64(1 + i%40)
		}
		run := func(end, keep int) {
			from := m.chunkTokFrom(st.done())
			row := &chunkRow{st: st, end: end, keep: keep, tokens: toks[from:], tokFrom: from, cond: v.Mel, emb: v.Embedding}
			if err := fc.graphs.do(func() error { _, err := fc.compute([]*chunkRow{row}, nil, nil); return err }); err != nil {
				t.Fatal(err)
			}
		}
		for _, end := range []int{st.done() + CF, st.done() + 2*CF} {
			run(end, end-st.done())
		}
		end := st.done() + CF
		run(end, 0) // warm-up
		const n = 20
		t1 := time.Now()
		for range n {
			run(end, 0)
		}
		what := "uncaptured"
		if fc.lastBucket != nil {
			what = fmt.Sprintf("captured (bucket of %d rows, %d past, %d new frames)", fc.lastBucket.B, fc.lastBucket.P, fc.lastBucket.N)
		}
		t.Logf("one row, %d past frames, %d new: %.1f ms per flow run (%d Euler steps), %s",
			st.done(), CF, float64(time.Since(t1).Microseconds())/1000/n, m.Flow.Steps, what)
	}
}

// promptVoice is the manifest's first voice with a prompt.
func promptVoice(t *testing.T, m *Manifest) *Voice {
	t.Helper()
	for _, name := range m.Voices {
		if w := m.voice(name); w != nil && len(w.SpeechTokens) > 0 {
			return w
		}
	}
	t.Fatalf("%s: no voice with a prompt", m.File)
	return nil
}
