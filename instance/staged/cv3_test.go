package staged

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// cv3Graphs makes the graphs of testdata/gen_cv3_graphs.py in dir, or skips without Python's onnx
// (fails under VOXMUX_REQUIRE_TINY_COSYVOICE3, which `make test` sets once it has installed it).
func cv3Graphs(t *testing.T, dir string) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import onnx").Run(); err != nil {
		if requireTinyCV3() {
			t.Fatalf("no /usr/bin/python3 with onnx to make the test graphs (%v), and VOXMUX_REQUIRE_TINY_COSYVOICE3 is set", err)
		}
		t.Skip("no /usr/bin/python3 with onnx to make the test graphs")
	}
	if out, err := exec.Command("/usr/bin/python3", "testdata/gen_cv3_graphs.py", dir).CombinedOutput(); err != nil {
		t.Fatalf("gen_cv3_graphs.py: %v\n%s", err, out)
	}
}

// cv3Manifest is models/tiny with a voice prompt (alice), the flow's cond, embedding, look-ahead
// and cosine schedule, and a vocoder that carries a source phase with look-ahead frames.
func cv3Manifest(t *testing.T) string {
	dir := t.TempDir()
	cv3Graphs(t, dir)
	path := writeManifest(t, dir, func(s string) string {
		s = strings.Replace(s, "voices: [default]", "voices: [default, alice]\nvoice_dir: voices", 1)
		s = strings.Replace(s, "  mel_bins: 80", "  step: flow_step_cond.onnx\n  embedding_dim: 4\n  lookahead_tokens: 3\n  schedule: cosine\n  mel_bins: 80", 1)
		s = strings.Replace(s, "  hop: 480", "  hop: 480\n  context_frames: 12\n  lookahead_frames: 5\n  source_phase: 2\n  phase_frames: 8", 1)
		return strings.Replace(s, "file: "+absTiny(t, "vocoder.onnx"), "file: vocoder_phase.onnx", 1)
	})
	alice := filepath.Join(dir, "voices", "alice")
	if err := os.MkdirAll(alice, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFloats(t, filepath.Join(alice, "mel.f32"), seq(6*80, 0))
	writeFloats(t, filepath.Join(alice, "embedding.f32"), []float32{1, 2, 3, 4})
	if err := os.WriteFile(filepath.Join(alice, "voice.yaml"), []byte("text: \"Hi.\"\nspeech_tokens: [5, 0, 63]\nmel: mel.f32\nembedding: embedding.f32\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func absTiny(t *testing.T, f string) string {
	p, err := filepath.Abs(filepath.Join("../../models/tiny", f))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The step graph reads cond and embedding in every flow_cuda_graph mode: its x_next is
// x + dt·(mu + cond + Σ embedding) on real frames, so two jobs that differ only in them differ
// by cond + Σ embedding once the cosine steps sum to 1.
func TestFlowStepCondAndEmbedding(t *testing.T) {
	m, err := LoadManifest(cv3Manifest(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []FlowGraph{FlowGraphOff, FlowGraphFixed} {
		t.Run(string(mode), func(t *testing.T) {
			p, err := loadPipeline(m, tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, Options{FlowCUDAGraph: mode})}, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			C, P := 80, 6
			toks := []int64{5, 0, 63, 1, 2, 3, 4}
			base := flowJob{tokens: toks, noise: make([]float32, C*14), prompt: 3, lookahead: 1, embedding: make([]float32, 4), cond: make([]float32, C*P)}
			voiced := base
			voiced.cond, voiced.embedding = seq(C*P, 1), []float32{1, 2, 3, 4}
			mels, err := p.flows[0].run([]flowJob{base, voiced}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(mels[0]) != C*12 || len(mels[1]) != C*12 {
				t.Fatalf("mels of %d and %d values, want %d (look-ahead frames dropped)", len(mels[0]), len(mels[1]), C*12)
			}
			for c := range C {
				for f := range 12 {
					want := float32(10) // Σ embedding
					if f < P {
						want += voiced.cond[c*P+f]
					}
					if d := mels[1][c*12+f] - mels[0][c*12+f]; math.Abs(float64(d-want)) > 1e-3*max(1, float64(want)) {
						t.Fatalf("bin %d frame %d: differs by %v, want %v", c, f, d, want)
					}
				}
			}
		})
	}
}

// A whole request in a voice with a prompt, in every flow_cuda_graph mode: the test vocoder's
// sample i is sample_offset + i + 0.5·frac(phase through its frame), so the stream's samples
// count up from 0 only if every window's kept audio follows the last one's, and the phase
// grows by 0.1 cycle per stream frame only if each window got the one before's.
func TestEngineVoicePromptAndCarriedPhase(t *testing.T) {
	path := cv3Manifest(t)
	for _, mode := range []FlowGraph{FlowGraphOff, FlowGraphFixed} {
		t.Run(string(mode), func(t *testing.T) {
			p, err := LoadPipeline(tts.LoadConfig{Manifest: path, Provider: "cpu", ORTLibrary: ortLibrary(t), Engine: section(t, Options{FlowCUDAGraph: mode})})
			if err != nil {
				t.Fatal(err)
			}
			e := NewEngine(p)
			defer e.Close()
			for _, voice := range []string{"alice", "default"} {
				pcm := synth(t, e, tts.Request{Text: "Hello there, how are you today?", Voice: voice, Seed: 3})
				if len(pcm) == 0 || len(pcm)%960 != 0 {
					t.Fatalf("%s: %d samples, not whole tokens", voice, len(pcm))
				}
				for i, v := range pcm {
					if n := math.Floor(float64(v)); n != float64(i) {
						t.Fatalf("%s: sample %d is %v: the windows' kept audio does not tile the stream", voice, i, v)
					}
					got := 2 * (float64(v) - float64(i))
					g := i / 480
					want := 0.1 * float64(g+1)
					want -= math.Floor(want)
					if d := math.Abs(got - want); d > 0.03 && d < 0.97 {
						t.Fatalf("%s: frame %d's phase is %.3f, want %.3f", voice, g, got, want)
					}
				}
			}
		})
	}
}
