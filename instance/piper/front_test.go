package piper

import (
	"runtime"
	"slices"
	"testing"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// piper_front: gpu or cpu, cpu refused with piper_decode sentences (which has no front to move).
// On CUDA the CPU front gets intra_op_num_threads, else half the host's cores, at most 8; on the
// CPU provider the group's intra_op_num_threads, as its other sessions.
func TestPiperFrontOption(t *testing.T) {
	got, err := Family{}.ParseOptions(tts.EngineSection(`{"piper_front": "cpu", "piper_precision": "float16"}`))
	if want := (Options{Front: FrontCPU, Precision: Float16}); err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	if _, err := (Family{}).ParseOptions(tts.EngineSection(`{"piper_front": "gpu", "piper_decode": "sentences"}`)); err != nil {
		t.Errorf("piper_front gpu with whole sentences: %v", err)
	}
	for section, want := range map[string]string{
		`{"piper_front": "host"}`:                             `engine.piper_front: "host" is not one of [gpu cpu]`,
		`{"piper_front": "cpu", "piper_decode": "sentences"}`: "engine.piper_front: cpu moves the front graph, which piper_decode chunks splits off the voice's graph, to the CPU; it cannot be used with piper_decode sentences, which runs the graph whole",
	} {
		if _, err := (Family{}).ParseOptions(tts.EngineSection(section)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", section, err, want)
		}
	}

	for _, c := range []struct {
		provider string
		o        Options
		cpu      bool
		threads  int
	}{
		{"cuda", Options{}, false, 0},
		{"cuda", Options{Front: FrontGPU}, false, 0},
		{"cuda", Options{Front: FrontCPU}, true, cpuFrontThreads(runtime.NumCPU())},
		{"cuda", Options{Options: ort.Options{IntraOpThreads: 3}, Front: FrontCPU}, true, 3},
		{"cpu", Options{Front: FrontCPU}, true, 0},
		{"cpu", Options{Options: ort.Options{IntraOpThreads: 1}, Front: FrontCPU}, true, 1},
	} {
		o := piperOptionsFrom(tts.LoadConfig{Provider: c.provider}, c.o)
		if o.CPUFront != c.cpu || o.FrontThreads != c.threads {
			t.Errorf("%s, %+v: CPU front %v with %d threads, want %v with %d", c.provider, c.o, o.CPUFront, o.FrontThreads, c.cpu, c.threads)
		}
	}
	for cpus, want := range map[int]int{1: 1, 2: 1, 6: 3, 16: 8, 128: 8} {
		if got := cpuFrontThreads(cpus); got != want {
			t.Errorf("%d cores: %d front threads, want %d", cpus, got, want)
		}
	}
}

// With piper_front cpu on the CPU provider the front's session is built apart from the decoder's,
// as on CUDA, and a request's audio is the default's sample for sample (the same provider and
// threads compute the same graph).
func TestPiperFrontOnCPUEqualsDefault(t *testing.T) {
	text := "The weather is nice today, so we will walk to the park. What? No!"
	for _, path := range []string{jennyVoice, tinyVITSMulti} {
		var audio [2][]float32
		var chunks [2]int
		for i, front := range []Front{"", FrontCPU} {
			r, s := chunkRunner(t, path, Options{Front: front})
			if s.chunks.cpuFront != (front == FrontCPU) {
				t.Fatalf("%s, piper_front %q: front on the CPU provider %v", path, front, s.chunks.cpuFront)
			}
			err := r.Synthesize(t.Context(), tts.Request{Text: text}, func(c tts.Chunk) error {
				audio[i] = append(audio[i], c.PCM...)
				chunks[i]++
				return nil
			})
			if err != nil {
				t.Fatalf("%s, piper_front %q: %v", path, front, err)
			}
		}
		n := min(len(audio[0]), len(audio[1]))
		if chunks[0] < 2 || chunks[0] != chunks[1] || !slices.Equal(audio[0], audio[1]) {
			t.Errorf("%s: piper_front cpu gave %d samples in %d chunks, the default %d in %d, max difference %g",
				path, len(audio[1]), chunks[1], len(audio[0]), chunks[0], piperMaxDiff(audio[0][:n], audio[1][:n]))
		}
	}
}
