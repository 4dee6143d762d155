package piper

import (
	"runtime"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
	onnxrt "github.com/yalue/onnxruntime_go"
)

// piper_front: gpu, cpu or auto, cpu and auto refused with piper_decode sentences (which has no
// front to move). On CUDA the CPU front gets intra_op_num_threads, else half the host's cores, at most 8; on the
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
		`{"piper_front": "host"}`:                              `engine.piper_front: "host" is not one of [gpu cpu auto]`,
		`{"piper_front": "cpu", "piper_decode": "sentences"}`:  "engine.piper_front: cpu moves the front graph, which piper_decode chunks splits off the voice's graph, to the CPU; it cannot be used with piper_decode sentences, which runs the graph whole",
		`{"piper_front": "auto", "piper_decode": "sentences"}`: "engine.piper_front: auto moves the front graph, which piper_decode chunks splits off the voice's graph, to the CPU; it cannot be used with piper_decode sentences, which runs the graph whole",
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
		auto     bool
	}{
		{"cuda", Options{}, false, 0, false},
		{"cuda", Options{Front: FrontGPU}, false, 0, false},
		{"cuda", Options{Front: FrontCPU}, true, cpuFrontThreads(runtime.NumCPU()), false},
		{"cuda", Options{Options: ort.Options{IntraOpThreads: 3}, Front: FrontCPU}, true, 3, false},
		{"cpu", Options{Front: FrontCPU}, true, 0, false},
		{"cpu", Options{Options: ort.Options{IntraOpThreads: 1}, Front: FrontCPU}, true, 1, false},
		{"cuda", Options{Front: FrontAuto}, false, cpuFrontThreads(runtime.NumCPU()), true},
		{"cpu", Options{Front: FrontAuto}, false, 0, true},
	} {
		o := piperOptionsFrom(tts.LoadConfig{Provider: c.provider}, c.o)
		if o.CPUFront != c.cpu || o.FrontThreads != c.threads || o.AutoFront != c.auto {
			t.Errorf("%s, %+v: CPU front %v (auto %v) with %d threads, want %v (auto %v) with %d", c.provider, c.o, o.CPUFront, o.AutoFront, o.FrontThreads, c.cpu, c.auto, c.threads)
		}
	}
	for cpus, want := range map[int]int{1: 1, 2: 1, 6: 3, 16: 8, 128: 8} {
		if got := cpuFrontThreads(cpus); got != want {
			t.Errorf("%d cores: %d front threads, want %d", cpus, got, want)
		}
	}
}

// With piper_front cpu on the CPU provider the front's session is built apart from the decoder's,
// as on CUDA, and with auto both front sessions are built; a request's audio is the default's
// sample for sample either way (the same provider and threads compute the same graph).
func TestPiperFrontOnCPUEqualsDefault(t *testing.T) {
	text := "The weather is nice today, so we will walk to the park. What? No!"
	for _, path := range []string{jennyVoice, tinyVITSMulti} {
		var audio [3][]float32
		var chunks [3]int
		for i, front := range []Front{"", FrontCPU, FrontAuto} {
			r, s := chunkRunner(t, path, Options{Front: front})
			if s.chunks.cpuFront != (front == FrontCPU) || (s.chunks.cpu != nil) != (front == FrontAuto) {
				t.Fatalf("%s, piper_front %q: front on the CPU provider %v, a CPU front beside it %v", path, front, s.chunks.cpuFront, s.chunks.cpu != nil)
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
		for i, front := range []Front{FrontCPU, FrontAuto} {
			i++
			n := min(len(audio[0]), len(audio[i]))
			if chunks[0] < 2 || chunks[0] != chunks[i] || !slices.Equal(audio[0], audio[i]) {
				t.Errorf("%s: piper_front %s gave %d samples in %d chunks, the default %d in %d, max difference %g",
					path, front, len(audio[i]), chunks[i], len(audio[0]), chunks[0], piperMaxDiff(audio[0][:n], audio[i][:n]))
			}
		}
	}
}

// piper_front auto runs a front batch of at most autoCPURows sentences in the CPU session while no
// other front runs there, and any other in the group provider's session.
func TestPiperAutoFrontChoice(t *testing.T) {
	gpu, cpu := &onnxrt.DynamicAdvancedSession{}, &onnxrt.DynamicAdvancedSession{}
	c := &piperChunker{front: gpu, cpu: cpu, cpuBusy: new(atomic.Bool)}
	s1, done1 := c.frontFor(1)
	s2, done2 := c.frontFor(1)
	s3, done3 := c.frontFor(autoCPURows + 1)
	if s1 != cpu || s2 != gpu || s3 != gpu {
		t.Fatalf("one row, one row while the first runs, %d rows: %v %v %v, want the CPU session, then the GPU's twice", autoCPURows+1, s1 == cpu, s2 == cpu, s3 == cpu)
	}
	done2()
	done3()
	if s, done := c.frontFor(autoCPURows); s != gpu {
		t.Fatal("the CPU session was given again while its first batch ran")
	} else {
		done()
	}
	done1()
	if s, done := c.frontFor(autoCPURows); s != cpu {
		t.Fatal("the CPU session was not given again once its batch was done")
	} else {
		done()
	}
	plain := &piperChunker{front: gpu}
	if s, done := plain.frontFor(1); s != gpu {
		t.Fatal("without piper_front auto a batch ran outside the front session")
	} else {
		done()
	}
}
