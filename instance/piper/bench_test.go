package piper

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"

	onnxrt "github.com/yalue/onnxruntime_go"
)

// BenchmarkPiperConcurrency compares three ways for concurrent requests to share one voice, on
// the --bench variant of the tiny voice (a sample-rate convolution stack of about a real medium
// voice's compute per second of audio):
//
//	shared:     one session, every request calling Run at once (what Runner does)
//	serialized: one session, requests taking turns
//	sessions:   one session per concurrent request
//
// Each op is one sentence of 80 phonemes; 4 requests run at once. Run it with
//
//	go test -run '^$' -bench PiperConcurrency -benchtime 40x ./instance/
//
// (scripts/piper/make_tiny.py writes the bench voice to a temp dir first; needs python3-onnx).
func BenchmarkPiperConcurrency(b *testing.B) {
	dir := os.Getenv("VOXMUX_PIPER_BENCH_DIR") // a prebuilt bench voice, for machines without python3-onnx
	if dir == "" {
		dir = b.TempDir()
		gen := exec.Command("/usr/bin/python3", "-m", "scripts.piper.make_tiny", dir, "--bench")
		gen.Dir = "../.."
		if out, err := gen.CombinedOutput(); err != nil {
			b.Skipf("cannot build the bench voice: %v\n%s", err, out)
		}
	}
	f := tinyPiperFile(b, filepath.Join(dir, "en_US-tiny-x_low.onnx"))
	// A sentence of 80 phonemes in Piper's layout (^ _ p _ p _ ... $): about 1.9 s of audio.
	ids := []int64{1, 0}
	for i := 0; i < 80; i++ {
		ids = append(ids, int64(14+i%100), 0)
	}
	ids = append(ids, 2)
	const clients = 4
	for _, threads := range []int{0, 1} {
		rt, err := ort.New(tts.LoadConfig{Provider: "cpu", ORTLibrary: ortLibrary(b)}, 0, ort.Options{IntraOpThreads: threads})
		if err != nil {
			b.Fatal(err)
		}
		load := func() *onnxrt.DynamicAdvancedSession {
			s, err := rt.Session("piper", f.Path, []string{"input", "input_lengths", "scales"}, []string{"output"})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}
		shared := load()
		var turn sync.Mutex
		own := make([]*onnxrt.DynamicAdvancedSession, clients)
		for i := range own {
			own[i] = load()
		}
		v := piperVoice{File: f}
		for _, mode := range []string{"shared", "serialized", "sessions"} {
			name := fmt.Sprintf("%s/intra_op_threads=%d", mode, threads)
			b.Run(name, func(b *testing.B) {
				var wg sync.WaitGroup
				work := make(chan struct{}, b.N)
				for i := 0; i < b.N; i++ {
					work <- struct{}{}
				}
				close(work)
				samples := 0
				var mu sync.Mutex
				b.ResetTimer()
				for c := 0; c < clients; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sess := shared
						if mode == "sessions" {
							sess = own[c]
						}
						for range work {
							if mode == "serialized" {
								turn.Lock()
							}
							pcm, err := runPiper(sess, ids, f.scales, v)
							if mode == "serialized" {
								turn.Unlock()
							}
							if err != nil {
								b.Error(err)
								return
							}
							mu.Lock()
							samples += len(pcm)
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(samples)/22050/b.Elapsed().Seconds(), "audio-s/s")
			})
		}
		shared.Destroy()
		for _, s := range own {
			s.Destroy()
		}
		rt.Close()
	}
}
