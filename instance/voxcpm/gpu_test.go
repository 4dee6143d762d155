package voxcpm

import (
	"cmp"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// On a GPU host (VOXMUX_GPU_VOXCPM: a float16 export, which CUDA's GroupQueryAttention needs;
// ORT_LIB: ONNX Runtime with the CUDA provider), the engine runs on CUDA with the plain step, with
// the step's and the VAE decoder's CUDA graphs, and with the decoder's alone: requests alone and
// batched give finite audio of whole patches, and the graphs' audio is the plain step's within
// float16 rounding, as is that of the VAE decoder run in every batch's own shape
// (vocoder_batches []).
func TestGPUSteps(t *testing.T) {
	gpuOptions := func(mode string, plainVAE bool, vaeGraphs string) Options {
		o := Options{LMCUDAGraph: StepGraph(mode), VocoderCUDAGraph: VAEGraph(vaeGraphs)}
		if plainVAE {
			o.VocoderBatches = []int{}
		}
		return o
	}
	path, lib := gpuExport(t)
	open := func(mode string, plainVAE bool, vaeGraphs string) *Engine {
		r, _, err := Family{}.Open(tts.LoadConfig{Manifest: path, Provider: "cuda", ORTLibrary: lib, MaxInflight: 16,
			Engine: section(t, gpuOptions(mode, plainVAE, vaeGraphs))})
		if err != nil {
			t.Fatalf("lm_cuda_graph %s, vocoder_cuda_graph %q: %v", mode, vaeGraphs, err)
		}
		t.Cleanup(func() { r.Close() })
		return r.(*Engine)
	}
	var reqs []tts.Request
	for i := range 12 {
		reqs = append(reqs, tts.Request{Text: texts[i%len(texts)], Seed: uint64(i)})
	}
	batched := func(e *Engine) ([]result, time.Duration) {
		out := make([]result, len(reqs))
		var wg sync.WaitGroup
		t0 := time.Now()
		for i, req := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = run(t, e, req)
			}()
		}
		wg.Wait()
		return out, time.Since(t0)
	}
	check := func(name string, rs []result) {
		for i, r := range rs {
			if r.err != nil {
				t.Fatalf("%s: request %d: %v", name, i, r.err)
			}
			for _, x := range r.pcm() {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("%s: request %d: %v in its audio", name, i, x)
				}
			}
		}
	}
	firstPatch := func(a, b result) float64 {
		if len(a.chunks) == 0 || len(b.chunks) == 0 {
			return math.Inf(1)
		}
		return maxDiff(a.chunks[0], b.chunks[0])
	}
	plain := open("off", false, "")
	alone := make([]result, len(reqs))
	for i, req := range reqs {
		alone[i] = run(t, plain, req)
	}
	check("plain alone", alone)
	pb, pt := batched(plain)
	check("plain batched", pb)
	vaeOnly := open("off", false, "on")
	vb, vt := batched(vaeOnly)
	check("VAE graphs batched", vb)
	ownShapes := open("off", true, "")
	ob, ot := batched(ownShapes)
	check("VAE in its own shapes, batched", ob)
	stat := func(e *Engine) string {
		st := e.Stats()[stageStep]
		if st.Batches == 0 {
			return "no steps"
		}
		return (st.Busy / time.Duration(st.Batches)).String() + " a step, " +
			time.Duration(int64(e.Stats()[stageVAE].Busy)/int64(e.Stats()[stageVAE].Batches)).String() + " a VAE run"
	}
	var dPlain, dVAE, dOwn float64
	for i := range reqs {
		dPlain = max(dPlain, firstPatch(pb[i], alone[i]))
		dVAE = max(dVAE, firstPatch(vb[i], pb[i]))
		dOwn = max(dOwn, firstPatch(ob[i], pb[i]))
	}
	t.Logf("first patch: batched %g from alone (plain step), VAE graphs %g from plain, VAE in its own shapes %g from its buckets", dPlain, dVAE, dOwn)
	t.Logf("%d requests at once: plain %v (%s), VAE graphs %v (%s), VAE in its own shapes %v (%s)", len(reqs), pt, stat(plain), vt, stat(vaeOnly),
		ot, stat(ownShapes))
	if dPlain > 0.05 || dVAE > 0.05 || dOwn > 0.05 {
		t.Fatalf("first patches differ by %g (batched), %g (VAE graphs) and %g (VAE in its own shapes), over float16 rounding", dPlain, dVAE, dOwn)
	}
	// Last: the step's graphs, which fail their load-time check on an H100 so far.
	graphs := open("on", false, "")
	gb, gt := batched(graphs)
	check("graphs batched", gb)
	var dGraph float64
	sameLen := 0
	for i := range reqs {
		dGraph = max(dGraph, firstPatch(gb[i], pb[i]))
		if len(gb[i].chunks) == len(pb[i].chunks) {
			sameLen++
		}
	}
	t.Logf("step and VAE graphs: first patch %g from plain, %d of %d requests as long; %d requests at once %v (%s)", dGraph, sameLen, len(reqs), len(reqs), gt, stat(graphs))
	if dGraph > 0.05 {
		t.Fatalf("first patches with the step's graphs differ by %g, over float16 rounding", dGraph)
	}
}

// On a GPU host (VOXMUX_GPU_VOXCPM as TestGPUSteps), the VAE decoder converted to float16
// (vocoder_precision float16) decodes random latents as the float32 decoder does, on CUDA, in the
// buckets of 64 streams, uncaptured and captured as CUDA graphs: 8 patches of 64 rows, their states
// carried, within gpuVAEFloat16RMS (a first guess: 4× the CPU's bound, where ONNX Runtime computes
// through float32). It logs the milliseconds a decode takes at 1 and 64 rows, each precision.
func TestGPUVAEFloat16(t *testing.T) {
	const gpuVAEFloat16RMS = 4 * vaeFloat16AudioRMS
	path, _ := gpuExport(t)
	m, rt := runtimeFor(t, path, "cuda")
	const rows = 64
	for _, captured := range []bool{false, true} {
		v := openVAEPair(t, m, rt, rows, graphModes{captureVAE: captured})
		audio, state := compareVAEFloat16(t, v, rows, 8, gpuVAEFloat16RMS, gpuVAEFloat16RMS)
		var ms [2][2]float64 // [precision][1 row, 64 rows]
		for i := range v {
			for j, n := range []int{1, rows} {
				patch := make([]float32, n*m.patchFloats())
				const runs = 20
				var t0 time.Time
				for k := range runs + 3 { // 3 to warm up
					if k == 3 {
						t0 = time.Now()
					}
					if _, err := v[i].decode(n, patch); err != nil {
						t.Fatal(err)
					}
				}
				ms[i][j] = float64(time.Since(t0).Microseconds()) / 1000 / runs
			}
		}
		t.Logf("VAE decoder on CUDA, captured %v: float16 rel rms from float32 audio %.3g, state %.3g over 8 patches of %d rows; "+
			"ms a decode: 1 row float32 %.2f float16 %.2f; %d rows float32 %.2f float16 %.2f",
			captured, audio, state, rows, ms[0][0], ms[1][0], rows, ms[0][1], ms[1][1])
	}
}

// On a GPU host (VOXMUX_GPU_VOXCPM as TestGPUSteps), the uncaptured VAE decoder in one session
// (vocoder_sessions shared) and in a session per bucket (per_batch, planned by cuDNN's exhaustive
// search at load), each in float32 and float16, for the buckets of VOXMUX_GPU_VAE_ROWS slots
// (default 128): it logs each way's load time and the milliseconds a decode takes at 1, 16, 64
// and 128 rows, each size decoded 20 times after 3 to warm up, the sizes in turn and then
// interleaved (a change of bucket every decode, which a shared session plans again), and checks
// that per_batch decodes as shared does (within 5e-3 relative rms: the two may pick other
// convolution algorithms). VOXMUX_GPU_PROVIDER=cpu runs it on the CPU.
func TestGPUVAESessions(t *testing.T) {
	path, _ := gpuExport(t)
	m, rt := runtimeFor(t, path, cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda"))
	rows := vaeRows(t, 128)
	sizes := []int{}
	for _, n := range []int{1, 16, 64, 128} {
		if n <= rows {
			sizes = append(sizes, n)
		}
	}
	patch := randomFloats(rows*m.patchFloats(), 1, 7)
	var first [][]float32 // per precision: shared's audio of the first decode at the largest size
	for _, f16 := range []bool{false, true} {
		for _, perBatch := range []bool{false, true} {
			t0 := time.Now()
			v, err := openVAE(m, rt, rows, engine.Buckets(rows), graphModes{float16VAE: f16, perBatchVAE: perBatch})
			if err != nil {
				t.Fatalf("float16 %v, per_batch %v: %v", f16, perBatch, err)
			}
			load := time.Since(t0)
			decode := func(n int) time.Duration {
				t0 := time.Now()
				if _, err := v.decode(n, patch[:n*m.patchFloats()]); err != nil {
					t.Fatal(err)
				}
				return time.Since(t0)
			}
			// The same states in both sessions' ways: zeros, then the first decode compared.
			for s := range rows {
				if err := v.prime(s, nil); err != nil {
					t.Fatal(err)
				}
			}
			big := sizes[len(sizes)-1]
			a, err := v.decode(big, patch[:big*m.patchFloats()])
			if err != nil {
				t.Fatal(err)
			}
			if !perBatch {
				first = append(first, append([]float32(nil), a...))
			} else if d := engine.RelRMS(a, first[len(first)-1]); !(d <= 5e-3) {
				t.Errorf("float16 %v: per_batch decodes %g (relative rms) from shared", f16, d)
			}
			ms := make([]float64, len(sizes))
			for i, n := range sizes {
				for range 3 {
					decode(n)
				}
				var sum time.Duration
				for range 20 {
					sum += decode(n)
				}
				ms[i] = float64(sum.Microseconds()) / 1000 / 20
			}
			var mixed time.Duration
			for k := range 20 {
				mixed += decode(sizes[k%len(sizes)])
			}
			t.Logf("VAE decoder, float16 %v, per_batch %v: load %.1f s; ms a decode at %v rows: %.2f; sizes interleaved: %.2f ms a decode",
				f16, perBatch, load.Seconds(), sizes, ms, float64(mixed.Microseconds())/1000/20)
			v.close()
		}
	}
}

// On a GPU host (VOXMUX_GPU_VOXCPM as TestGPUSteps), the step's CUDA graphs are captured and
// checked against plain runs (the engine's load-time check) once per variant in VOXMUX_GPU_SDPA:
// variants separated by ";", each a space-separated list of KEY=VALUE, where a KEY starting with
// ORT_ is an environment variable ONNX Runtime reads when it builds its kernels (ORT_ENABLE_XQA,
// ORT_DISABLE_FLASH_DECODE), lm_cuda_graph and vocoder_cuda_graph are engine options, and any other
// is a CUDA provider option (sdpa_kernel, prefer_nhwc); an empty variant
// is ONNX Runtime's own choice. A request then runs alone with each variant that passes: which
// kernels the step's and the decoder's graphs can replay. It fails when ONNX Runtime's own choice
// (the empty variant, when listed) does not pass. A replay that faults leaves the process's CUDA
// context unusable for the variants after it: give such variants one process each.
func TestGPUStepCaptureKernels(t *testing.T) {
	path, lib := gpuExport(t)
	variants := ";ORT_ENABLE_XQA=0;sdpa_kernel=2;prefer_nhwc=0"
	if v, ok := os.LookupEnv("VOXMUX_GPU_SDPA"); ok {
		variants = v
	}
	ownListed, ownPassed := false, false
	for _, v := range strings.Split(variants, ";") {
		ownListed = ownListed || v == ""
		po := map[string]string{}
		opts := Options{LMCUDAGraph: StepGraphOn}
		var env []string
		for _, kv := range strings.Fields(v) {
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("VOXMUX_GPU_SDPA: %q is not KEY=VALUE", kv)
			}
			switch {
			case strings.HasPrefix(k, "ORT_"):
				t.Setenv(k, val)
				env = append(env, k)
			case k == "lm_cuda_graph":
				opts.LMCUDAGraph = StepGraph(val)
			case k == "vocoder_cuda_graph":
				opts.VocoderCUDAGraph = VAEGraph(val)
			default:
				po[k] = val
			}
		}
		name := v
		if name == "" {
			name = "ONNX Runtime's choices"
		}
		t0 := time.Now()
		r, _, err := Family{}.Open(tts.LoadConfig{Manifest: path, Provider: "cuda", ORTLibrary: lib, MaxInflight: 2,
			ProviderOptions: po, Engine: section(t, opts)})
		for _, k := range env {
			os.Unsetenv(k)
		}
		if err != nil {
			t.Logf("capture with %s: refused after %v: %v", name, time.Since(t0).Round(time.Millisecond), err)
			continue
		}
		e := r.(*Engine)
		res := run(t, e, tts.Request{Text: texts[0], Seed: 1})
		st := e.Stats()[stageStep]
		per := time.Duration(0)
		if st.Batches > 0 {
			per = st.Busy / time.Duration(st.Batches)
		}
		t.Logf("capture with %s: passed its check (load %v); one request: %d patches, %v a step, err %v",
			name, time.Since(t0).Round(time.Millisecond), len(res.chunks), per, res.err)
		ownPassed = ownPassed || (res.err == nil && v == "")
		r.Close()
	}
	if ownListed && !ownPassed {
		t.Fatal("ONNX Runtime's own choice of kernels gave graphs that do not replay as plain runs")
	}
}

// gpuExport is the float16 export named by VOXMUX_GPU_VOXCPM and ONNX Runtime's library; the test
// is skipped without the export.
func gpuExport(t *testing.T) (path, lib string) {
	t.Helper()
	path = os.Getenv("VOXMUX_GPU_VOXCPM")
	if path == "" {
		t.Skip("VOXMUX_GPU_VOXCPM is not set")
	}
	lib, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	return path, lib
}

// On a GPU host (VOXMUX_GPU_VOXCPM as TestGPUSteps), prefills of one row at 16, 64 and 256
// positions after the load's warm-up, 20 runs of each, timed three ways: all on one locked OS
// thread, each from a new goroutine (which Go may put on any of its threads), and each on an OS
// thread of its own that ends with it. The log gives each way's median, least and most
// milliseconds. With VOXMUX_GPU_PROFILE=DIR (absolute) ONNX Runtime profiles the sessions into DIR
// and the log adds the prefill's nodes of the largest median time.
func TestGPUPrefillTimes(t *testing.T) {
	path, _ := gpuExport(t)
	dir := os.Getenv("VOXMUX_GPU_PROFILE")
	var o ort.Options
	if dir != "" {
		o.Profile = filepath.Join(dir, "p")
	}
	m, rt := runtimeWith(t, path, tts.LoadConfig{Provider: cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")}, o)
	t0 := time.Now()
	g, err := openGraphs(m, rt, 8, graphModes{step: StepGraphOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("graphs opened and prefills warmed in %v", time.Since(t0).Round(time.Millisecond))
	if err := g.reserve(1); err != nil {
		t.Fatal(err)
	}
	prefill := func(T int) time.Duration {
		ids, textMask, feat, featMask, seqlens := m.prefillBatch(nil, 1, T)
		t0 := time.Now()
		if _, _, err := g.runPrefill(0, 1, T, ids, textMask, feat, featMask, seqlens); err != nil {
			t.Error(err)
		}
		return time.Since(t0)
	}
	locked := ort.NewThread()
	defer locked.Close()
	ways := []struct {
		name string
		run  func(T int) time.Duration
	}{
		{"one locked thread", func(T int) (d time.Duration) {
			locked.Do(func() error { d = prefill(T); return nil })
			return d
		}},
		{"a new goroutine each", func(T int) (d time.Duration) {
			done := make(chan struct{})
			go func() { d = prefill(T); close(done) }()
			<-done
			return d
		}},
		{"a new OS thread each", func(T int) (d time.Duration) {
			done := make(chan struct{})
			go func() {
				goruntime.LockOSThread() // not unlocked: the thread ends with the goroutine
				d = prefill(T)
				close(done)
			}()
			<-done
			return d
		}},
	}
	for _, T := range []int{16, 64, 256} {
		for _, w := range ways {
			ms := make([]float64, 20)
			for i := range ms {
				ms[i] = float64(w.run(T).Microseconds()) / 1000
			}
			slices.Sort(ms)
			t.Logf("prefill 1 × %d positions, %s: median %.1f ms, least %.1f, most %.1f", T, w.name, ms[len(ms)/2], ms[0], ms[len(ms)-1])
		}
	}
	if err := g.close(); err != nil {
		t.Fatal(err)
	}
	if dir != "" {
		logSlowNodes(t, dir, "voxcpm_prefill")
	}
}

// logSlowNodes logs the nodes of the largest median time in the ONNX Runtime profiles in dir
// whose names contain session.
func logSlowNodes(t *testing.T, dir, session string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*"+session+"*.json"))
	durs := map[string][]float64{}
	ops := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var events []struct {
			Cat  string  `json:"cat"`
			Name string  `json:"name"`
			Dur  float64 `json:"dur"`
			Args struct {
				Op string `json:"op_name"`
			} `json:"args"`
		}
		if err := json.Unmarshal(b, &events); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, e := range events {
			if e.Cat == "Node" && strings.HasSuffix(e.Name, "_kernel_time") {
				durs[e.Name] = append(durs[e.Name], e.Dur/1000)
				ops[e.Name] = e.Args.Op
			}
		}
	}
	type node struct {
		name         string
		median, most float64
		n            int
	}
	var nodes []node
	for k, v := range durs {
		slices.Sort(v)
		nodes = append(nodes, node{k, v[len(v)/2], v[len(v)-1], len(v)})
	}
	slices.SortFunc(nodes, func(a, b node) int { return cmp.Compare(b.median, a.median) })
	t.Logf("%d profiles of %s, %d nodes", len(files), session, len(nodes))
	for _, n := range nodes[:min(8, len(nodes))] {
		t.Logf("  %s (%s): median %.2f ms, most %.2f, %d runs", n.name, ops[n.name], n.median, n.most, n.n)
	}
}

// vaeRows is VOXMUX_GPU_VAE_ROWS, the slots of the GPU tests' VAE decoders; def when unset.
func vaeRows(t *testing.T, def int) int {
	v := os.Getenv("VOXMUX_GPU_VAE_ROWS")
	if v == "" {
		return def
	}
	rows, err := strconv.Atoi(v)
	if err != nil || rows < 1 {
		t.Fatalf("VOXMUX_GPU_VAE_ROWS=%q: want a positive number", v)
	}
	return rows
}

// On a GPU host (VOXMUX_GPU_VOXCPM as TestGPUSteps), the VAE decoder's buckets for
// VOXMUX_GPU_VAE_ROWS streams (default 8) captured as CUDA graphs (vocoder_cuda_graph on) and
// checked against plain runs as the engine's load does, then each bucket decoded once.
// VOXMUX_GPU_PROVIDER_OPTIONS ("key=value;key=value") sets CUDA provider options, as a group's
// provider_options do (cudnn_conv_algo_search DEFAULT plans in milliseconds, which a run under
// compute-sanitizer needs).
func TestGPUVAECapture(t *testing.T) {
	path, _ := gpuExport(t)
	rows := vaeRows(t, 8)
	po := map[string]string{}
	for _, kv := range strings.Split(os.Getenv("VOXMUX_GPU_PROVIDER_OPTIONS"), ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			po[k] = v
		}
	}
	m, rt := runtimeWith(t, path, tts.LoadConfig{Provider: "cuda", ProviderOptions: po}, ort.Options{})
	t0 := time.Now()
	v, err := openVAE(m, rt, rows, engine.Buckets(rows), graphModes{captureVAE: true})
	if err != nil {
		t.Fatalf("%d rows, provider options %v: %v", rows, po, err)
	}
	defer v.close()
	t.Logf("%d rows, provider options %v: buckets %v captured and checked in %v", rows, po, engine.Buckets(rows), time.Since(t0).Round(time.Millisecond))
	for _, n := range engine.Buckets(rows) {
		a, err := v.decode(n, randomFloats(n*m.patchFloats(), 1, 3))
		if err != nil {
			t.Fatalf("decode of %d rows: %v", n, err)
		}
		for _, x := range a {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("decode of %d rows: %v in its audio", n, x)
			}
		}
	}
}
