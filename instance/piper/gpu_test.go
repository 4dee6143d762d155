package piper

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/tts"
)

// jennyVoice is the published voice the GPU test reads without fetching (a GPU host has no
// network): VOXMUX_PIPER_JENNY or models/voices.
var jennyVoice = cmp.Or(os.Getenv("VOXMUX_PIPER_JENNY"), "../../models/voices/en_GB-jenny_dioco-medium.onnx")

// gpuRunner opens voice path on provider with options o, noise off, and returns its session.
func gpuRunner(t *testing.T, path, provider string, o Options) *piperSession {
	t.Helper()
	_, s := openRunner(t, path, provider, o)
	return s
}

// On a GPU host (VOXMUX_GPU_PIPER=1; ORT_LIB: ONNX Runtime with the CUDA provider), Piper on the
// CUDA provider gives the CPU provider's audio within chunkTolerance for the jenny voice and the
// tiny VITS voices: decoded in chunks (front, then the decoder over windows with the receptive
// field as context) and run whole, at speeds 1, 2 and 0.5; and rows at different speeds batched
// in one front run give each row's audio alone, within TestPiperSpeedsShareABatch's bounds.
// VOXMUX_GPU_PROVIDER=cpu runs the test's own logic without a GPU.
func TestPiperOnGPU(t *testing.T) {
	if os.Getenv("VOXMUX_GPU_PIPER") == "" {
		t.Skip("VOXMUX_GPU_PIPER not set: this test needs a GPU")
	}
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	ph := testPhonemizer(t)
	speeds := []float32{1, 2, 0.5}
	for _, c := range []struct {
		path string
		sid  int64
	}{{jennyVoice, 0}, {tinyVITSEN, 0}, {tinyVITSMulti, 1}} {
		if _, err := os.Stat(c.path); err != nil {
			t.Fatal(err)
		}
		gc, cc := gpuRunner(t, c.path, provider, Options{}), gpuRunner(t, c.path, "cpu", Options{})
		gw, cw := gpuRunner(t, c.path, provider, Options{Decode: DecodeSentences}), gpuRunner(t, c.path, "cpu", Options{Decode: DecodeSentences})
		if gc.chunks == nil || cc.chunks == nil {
			t.Fatalf("%s: not decoded in chunks", c.path)
		}
		f := gc.file
		sents, err := f.sentences(ph, "The weather is nice today, so we will walk to the park. What? No!")
		if err != nil {
			t.Fatal(err)
		}
		var worstChunks, worstWhole float64
		for _, sent := range sents {
			for _, sp := range speeds {
				// Chunked: each provider's front, then its decoder in the runner's chunk sizes.
				var chunked [2][]float32
				for i, s := range []*piperSession{gc, cc} {
					ls, err := s.chunks.runFront(s.file, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s, 1, sp), s.file.scales)
					if err != nil {
						t.Fatal(err)
					}
					chunked[i] = decodeChunks(t, s.chunks, s.file, &ls[0], c.sid, s.chunks.split.left, s.chunks.split.right)
				}
				// Whole: the voice's graph in one run.
				var whole [2][]float32
				for i, s := range []*piperSession{gw, cw} {
					out, err := runPiperBatch(s.sess, s.file, s.lengths, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s, 1, sp), s.file.scales)
					if err != nil {
						t.Fatal(err)
					}
					whole[i] = out[0]
				}
				for _, p := range []struct {
					what  string
					a, b  []float32
					worst *float64
				}{{"chunked", chunked[0], chunked[1], &worstChunks}, {"whole", whole[0], whole[1], &worstWhole}} {
					if len(p.a) != len(p.b) {
						t.Errorf("%s, %s at speed %g: %d samples on %s, %d on the CPU", f.Stem, p.what, sp, len(p.a), provider, len(p.b))
						continue
					}
					d := piperMaxDiff(p.a, p.b)
					*p.worst = max(*p.worst, d)
					if d > chunkTolerance {
						t.Errorf("%s, %s at speed %g: %s differs from the CPU by %g", f.Stem, p.what, sp, provider, d)
					}
				}
			}
		}
		t.Logf("%s on %s against the CPU: chunked within %.2g, whole within %.2g (speeds %v)", f.Stem, provider, worstChunks, worstWhole, speeds)

		// Rows at different speeds in one front run against each alone, on the provider.
		bs := []float32{1, 2, 0.5, 4}
		rows, sids := make([][]int64, len(bs)), make([]int64, len(bs))
		for i := range rows {
			rows[i], sids[i] = sents[0].IDs, c.sid
		}
		run := func(rows [][]int64, sids []int64, speeds []float32) [][]float32 {
			ls, err := gc.chunks.runFront(f, rows, sids, speeds, f.scales)
			if err != nil {
				t.Fatal(err)
			}
			out := make([][]float32, len(ls))
			for i := range ls {
				pcm, err := gc.chunks.decode(f, []window{{l: &ls[i], sid: c.sid, hi: ls[i].frames, to: ls[i].frames}})
				if err != nil {
					t.Fatal(err)
				}
				out[i] = pcm[0]
			}
			return out
		}
		if !gc.speed {
			bs = bs[:1] // a graph without the speed input: the batch's one speed
		}
		speedsOf := func(n int, v []float32) []float32 {
			if !gc.speed {
				return nil
			}
			return v[:n]
		}
		batched := run(rows[:len(bs)], sids[:len(bs)], speedsOf(len(bs), bs))
		for i, sp := range bs {
			alone := run(rows[i:i+1], sids[i:i+1], speedsOf(1, bs[i:]))
			if len(batched[i]) != len(alone[0]) {
				t.Errorf("%s, speed %g: %d samples batched, %d alone", f.Stem, sp, len(batched[i]), len(alone[0]))
				continue
			}
			d, inner := piperDiffs(batched[i], alone[0])
			t.Logf("%s on %s, speed %g: %d samples, batched against alone %.6f, %.6f away from the edges", f.Stem, provider, sp, len(alone[0]), d, inner)
			if inner > batchInnerTolerance || d > batchTolerance {
				t.Errorf("%s, speed %g: batched differs from alone by %.6f (%.6f away from the edges)", f.Stem, sp, d, inner)
			}
		}
	}
}

// On a GPU host (VOXMUX_GPU_PIPER=1), jenny served with piper_front cpu (the front on ONNX
// Runtime's CPU provider, the decoder on CUDA) against piper_front gpu (both on CUDA): one request
// at a time, each of piperASRSentences both ways, in turns (after a request each to warm up), it
// logs each request's time to its first chunk and each way's median,
//
//	piper_front cpu on cuda (intra-op threads T; ...): first chunk MS ms (P50 of N), each: [...]
//
// and each sentence's raw audio, the front then the decoder in the runner's chunks with no noise,
// has the same length both ways and agrees within frontProviderRMS. VOXMUX_GPU_PROVIDER=cpu runs
// it on the CPU.
func TestPiperFrontOnGPU(t *testing.T) {
	if os.Getenv("VOXMUX_GPU_PIPER") == "" {
		t.Skip("VOXMUX_GPU_PIPER not set: this test needs a GPU")
	}
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	if _, err := os.Stat(jennyVoice); err != nil {
		t.Fatal(err)
	}
	fronts := []Front{FrontGPU, FrontCPU}
	var ss [2]*piperSession
	for i, fr := range fronts {
		ss[i] = gpuRunner(t, jennyVoice, provider, Options{Front: fr})
		if ss[i].chunks == nil || ss[i].chunks.cpuFront != (fr == FrontCPU) {
			t.Fatalf("piper_front %s: not decoded in chunks with its front where asked", fr)
		}
	}
	// First audio, one request at a time: the served path (queue, worker, front, first chunk).
	first := func(i int, text string) time.Duration {
		t0 := time.Now()
		var d time.Duration
		err := ss[i].r.Synthesize(t.Context(), tts.Request{Text: text}, func(tts.Chunk) error {
			if d == 0 {
				d = time.Since(t0)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("piper_front %s: %v", fronts[i], err)
		}
		return d
	}
	for i := range fronts {
		first(i, "Warming up.")
	}
	var ms [2][]float64
	for k, text := range piperASRSentences {
		for n := range fronts {
			i := (n + k) % 2 // each way goes first in turn
			ms[i] = append(ms[i], float64(first(i, text).Microseconds())/1000)
		}
	}
	for i, fr := range fronts {
		sorted := slices.Sorted(slices.Values(ms[i]))
		threads := ""
		if fr == FrontCPU {
			threads = fmt.Sprintf(" (intra-op threads %d; 0: ONNX Runtime's default)", ss[i].opts.FrontThreads)
		}
		t.Logf("piper_front %s on %s%s: first chunk %.1f ms (P50 of %d), each: %.1f",
			fr, provider, threads, sorted[len(sorted)/2], len(sorted), ms[i])
	}

	// The same audio: each sentence's front and chunked decoder, raw, both ways.
	ph := testPhonemizer(t)
	f := ss[0].file
	worst, worstAbs, n := 0.0, 0.0, 0
	for _, text := range piperASRSentences {
		sents, err := f.sentences(ph, text)
		if err != nil {
			t.Fatal(err)
		}
		for _, sent := range sents {
			var audio [2][]float32
			for i, s := range ss {
				ls, err := s.chunks.runFront(s.file, [][]int64{sent.IDs}, []int64{0}, atSpeed(s, 1, 1), s.file.scales)
				if err != nil {
					t.Fatal(err)
				}
				audio[i] = decodeChunks(t, s.chunks, s.file, &ls[0], 0, s.chunks.split.left, s.chunks.split.right)
			}
			if len(audio[0]) != len(audio[1]) {
				t.Errorf("%q: %d samples with piper_front gpu, %d with cpu", text, len(audio[0]), len(audio[1]))
				continue
			}
			rel, d := engine.RelRMS(audio[0], audio[1]), piperMaxDiff(audio[0], audio[1])
			worst, worstAbs, n = max(worst, rel), max(worstAbs, d), n+1
			if !(rel <= frontProviderRMS) {
				t.Errorf("%q: piper_front cpu's audio differs from gpu's by %.3g relative rms (largest sample difference %.3g), over %g", text, rel, d, frontProviderRMS)
			}
		}
	}
	t.Logf("%s piper_front cpu against gpu on %s: chunked within %.2g relative rms, largest sample difference %.2g (%d sentences)", f.Stem, provider, worst, worstAbs, n)
}

// frontProviderRMS bounds the relative rms between a sentence's audio with the front on the CPU
// and on CUDA. The two providers' float32 kernels differ (CUDA's matrix products and convolutions
// round through TF32 by default), and the flow and decoder carry the front's differences into the
// audio: on an H100 the largest sample differed by 0.005 to 0.022 over the four sentences, far
// over chunkTolerance (1e-4, which holds chunks against whole runs on one provider), with every
// length equal. Their relative rms was not logged then; 0.02 is a first bound.
const frontProviderRMS = 0.02

// piperASRSentences are the sentences cmd/voxmux's ASR test has pocketsphinx transcribe
// (asrSentences there): everyday sentences its general English model recognizes from a real voice.
var piperASRSentences = []string{
	"The weather is nice today, so we will walk to the park.",
	"Please call me back when you get home tonight.",
	"I would like a cup of coffee and a glass of water.",
	"The children are playing in the garden after school.",
}

// float16GPURMS bounds the float16 decoder's audio against float32's on the GPU, as relative rms
// of the raw audio. float16 keeps 11 significant bits (unit roundoff 4.9e-4), and HiFi-GAN runs
// about 30 convolutions in series, each rounding its output to float16: the rounding errors add
// up to between √30 and 30 roundoffs, 2.7e-3 to 1.5e-2 (cuDNN accumulates float16 convolutions in
// float32, so the sums themselves add little). On the CPU the weights' rounding alone gives
// 4e-4 (TestPiperFloat16OnCPU). 2e-2 is −34 dB under the speech, below what a listener or
// pocketsphinx tells apart, and a conversion that breaks (an overflow, a wrong cast) gives 1 or
// NaN.
const float16GPURMS = 2e-2

// On a GPU host (VOXMUX_GPU_PIPER=1), piper_precision float16's decoder gives float32's audio
// within float16GPURMS for jenny and the tiny VITS voices, decoded whole and in chunks from the
// same latent (the front runs once, in float32, with the voice's noise as served). It logs, per
// voice,
//
//	float16 VOICE on PROVIDER: whole rel rms R max abs M; chunked rel rms R max abs M; N sentences
//
// with the worst sentence's figures. With VOXMUX_GPU_WAVS=DIR it writes each ASR sentence's jenny
// chunked audio there as VOICE-I.float32.wav and VOICE-I.float16.wav (16-bit, peak-normalized as
// the server does for a whole sentence) beside VOICE-I.txt, its text, for
// scripts/piper-fp16-wer.sh. VOXMUX_GPU_PROVIDER=cpu runs it on the CPU.
func TestPiperFloat16OnGPU(t *testing.T) {
	if os.Getenv("VOXMUX_GPU_PIPER") == "" {
		t.Skip("VOXMUX_GPU_PIPER not set: this test needs a GPU")
	}
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	wavs := os.Getenv("VOXMUX_GPU_WAVS")
	if wavs != "" {
		if err := os.MkdirAll(wavs, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ph := testPhonemizer(t)
	for _, c := range []struct {
		path   string
		sid    int64
		speech bool // a real voice: its WAV files are written (the tiny ones speak tones)
	}{{jennyVoice, 0, true}, {tinyVITSEN, 0, false}, {tinyVITSMulti, 1, false}} {
		if _, err := os.Stat(c.path); err != nil {
			t.Fatal(err)
		}
		s32 := gpuRunner(t, c.path, provider, Options{})
		s16 := gpuRunner(t, c.path, provider, Options{Precision: Float16})
		if s32.chunks == nil || s16.chunks == nil || !s16.opts.Float16 {
			t.Fatalf("%s: not decoded in chunks in float16", c.path)
		}
		f := s32.file
		// The front samples noise as served, once: both decoders decode the same latent.
		inf := f.Config.Inference
		served := [3]float32{deref(inf.NoiseScale, piperNoiseScale), deref(inf.LengthScale, piperLengthScale), deref(inf.NoiseW, piperNoiseW)}
		var worst [4]float64 // whole rel rms, max abs; chunked rel rms, max abs
		n := 0
		for i, text := range piperASRSentences {
			sents, err := f.sentences(ph, text)
			if err != nil {
				t.Fatal(err)
			}
			var audio [2][]float32
			for _, sent := range sents {
				ls, err := s32.chunks.runFront(f, [][]int64{sent.IDs}, []int64{c.sid}, atSpeed(s32, 1, 1), served)
				if err != nil {
					t.Fatal(err)
				}
				l := &ls[0]
				var whole, chunked [2][]float32
				for k, s := range []*piperSession{s32, s16} {
					out, err := s.chunks.decode(f, []window{{l: l, sid: c.sid, hi: l.frames, to: l.frames}})
					if err != nil {
						t.Fatal(err)
					}
					whole[k] = out[0]
					chunked[k] = decodeChunks(t, s.chunks, f, l, c.sid, s.chunks.split.left, s.chunks.split.right)
					audio[k] = append(audio[k], chunked[k]...)
				}
				for j, p := range [][2][]float32{whole, chunked} {
					if len(p[0]) != len(p[1]) {
						t.Fatalf("%s: %d samples in float32, %d in float16", f.Stem, len(p[0]), len(p[1]))
					}
					rel, mx := float16Diff(p[0], p[1])
					if math.IsNaN(rel) || math.IsNaN(mx) {
						worst[2*j], worst[2*j+1] = math.NaN(), math.NaN()
					} else if !math.IsNaN(worst[2*j]) {
						worst[2*j], worst[2*j+1] = max(worst[2*j], rel), max(worst[2*j+1], mx)
					}
				}
				n++
			}
			if wavs != "" && c.speech {
				name := filepath.Join(wavs, fmt.Sprintf("%s-%d", f.Stem, i))
				for k, prec := range []Precision{Float32, Float16} {
					writeWAV16(t, name+"."+string(prec)+".wav", f.Config.Audio.SampleRate, audio[k])
				}
				if err := os.WriteFile(name+".txt", []byte(text+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Logf("float16 %s on %s: whole rel rms %.3g max abs %.3g; chunked rel rms %.3g max abs %.3g; %d sentences",
			f.Stem, provider, worst[0], worst[1], worst[2], worst[3], n)
		if !(worst[0] <= float16GPURMS && worst[2] <= float16GPURMS) {
			t.Errorf("%s on %s: float16's audio is rel rms %.3g (whole), %.3g (chunked) from float32's, over %g", f.Stem, provider, worst[0], worst[2], float16GPURMS)
		}
	}
}

// writeWAV16 writes pcm, scaled to its peak as a whole sentence is (normalizePeak), as a mono
// 16-bit WAV file.
func writeWAV16(t *testing.T, path string, rate int, pcm []float32) {
	t.Helper()
	pcm = slices.Clone(pcm)
	normalizePeak(pcm)
	b := make([]byte, 0, 44+2*len(pcm))
	b = append(b, "RIFF"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(36+2*len(pcm)))
	b = append(b, "WAVEfmt "...)
	for _, v := range []uint32{16, 1 | 1<<16, uint32(rate), uint32(2 * rate), 2 | 16<<16} { // PCM, mono, 16-bit
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	b = append(b, "data"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(2*len(pcm)))
	for _, x := range pcm {
		b = binary.LittleEndian.AppendUint16(b, uint16(int16(math.Round(float64(x)*32767))))
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPiperDecoderPrecision runs jenny's decoder over batches of chunks, float32 against
// float16, on VOXMUX_GPU_PROVIDER (default cuda; VOXMUX_GPU_PIPER=1 needed): each op is one
// decoder run of `rows` windows of 256 frames with the receptive field's context on each side
// (a later chunk at piper_chunk's default), the first sentence's latent repeated. It reports
// audio seconds decoded per second. Run it with
//
//	VOXMUX_GPU_PIPER=1 go test -run '^$' -bench PiperDecoderPrecision -benchtime 20x ./instance/piper/
func BenchmarkPiperDecoderPrecision(b *testing.B) {
	if os.Getenv("VOXMUX_GPU_PIPER") == "" {
		b.Skip("VOXMUX_GPU_PIPER not set")
	}
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	ph := testPhonemizer(b)
	text := strings.Join(piperASRSentences, " ")
	for _, prec := range []Precision{Float32, Float16} {
		r, _, err := openPiper(tts.LoadConfig{Manifest: jennyVoice, Provider: provider, ORTLibrary: ortLibrary(b), Engine: section(b, Options{Precision: prec})})
		if err != nil {
			b.Fatal(err)
		}
		s, release, err := r.cache.acquire(r.m.Files[0])
		if err != nil {
			b.Fatal(err)
		}
		f := s.file
		// One long latent: the ASR sentences as one row (no sentence split: ids joined).
		sents, err := f.sentences(ph, text)
		if err != nil {
			b.Fatal(err)
		}
		var ids []int64
		for _, st := range sents {
			ids = append(ids, st.IDs...)
		}
		ls, err := s.chunks.runFront(f, [][]int64{ids}, []int64{0}, atSpeed(s, 1, 1), f.scales)
		if err != nil {
			b.Fatal(err)
		}
		l := &ls[0]
		c := s.chunks
		from := min(c.split.left, l.frames-1)
		w := c.chunkWindow(l, 0, from, min(from+piperChunk, l.frames))
		for _, rows := range []int{1, 16, 64} {
			ws := make([]window, rows)
			for i := range ws {
				ws[i] = w
			}
			b.Run(fmt.Sprintf("%s/rows=%d", prec, rows), func(b *testing.B) {
				if _, err := c.decode(f, ws); err != nil { // planned outside the timing
					b.Fatal(err)
				}
				b.ResetTimer()
				for range b.N {
					if _, err := c.decode(f, ws); err != nil {
						b.Fatal(err)
					}
				}
				audio := float64(rows*(w.to-w.from)*c.split.hop) / float64(f.Config.Audio.SampleRate)
				b.ReportMetric(audio*float64(b.N)/b.Elapsed().Seconds(), "audio-s/s")
			})
		}
		release()
		r.Close()
	}
}

// On a GPU host (VOXMUX_GPU_PIPER=1), where jenny's first audio goes: for piper_front gpu and
// cpu, each with piper_flow front and chunks, every ASR sentence as a request's first sentence,
// alone, its phonemes (espeak-ng), its front run, the flow over its first chunk's frames (the flow
// in chunks only) and the decoder's first chunk, each timed on its own, 5 rounds after one to
// warm up. It logs each way's medians,
//
//	jenny, piper_front F, piper_flow L on P: phonemes X ms, front X ms, flow X ms, first chunk X ms (medians of N)
//
// VOXMUX_GPU_PROVIDER=cpu runs it on the CPU.
func TestPiperFirstAudioPhases(t *testing.T) {
	if os.Getenv("VOXMUX_GPU_PIPER") == "" {
		t.Skip("VOXMUX_GPU_PIPER not set: this test needs a GPU")
	}
	provider := cmp.Or(os.Getenv("VOXMUX_GPU_PROVIDER"), "cuda")
	if _, err := os.Stat(jennyVoice); err != nil {
		t.Fatal(err)
	}
	ph := testPhonemizer(t)
	for _, fr := range []Front{FrontGPU, FrontCPU} {
		for _, fl := range []Flow{FlowFront, FlowChunks} {
			s := gpuRunner(t, jennyVoice, provider, Options{Front: fr, Flow: fl})
			c, f := s.chunks, s.file
			if c == nil || (c.flow != nil) != (fl == FlowChunks) {
				t.Fatalf("piper_front %s, piper_flow %s: not chunked as asked", fr, fl)
			}
			var ms [4][]float64 // phonemes, front, flow, first chunk
			for round := range 6 {
				for _, text := range piperASRSentences {
					var at [5]time.Time
					at[0] = time.Now()
					sents, err := f.sentences(ph, text)
					if err != nil {
						t.Fatal(err)
					}
					at[1] = time.Now()
					ls, err := c.runBatchFront(f, [][]int64{sents[0].IDs}, []int64{0}, atSpeed(s, 1, 1), f.scales, []bool{true})
					if err != nil {
						t.Fatal(err)
					}
					at[2] = time.Now()
					w := c.chunkWindow(&ls[0], 0, 0, min(c.first, ls[0].frames))
					if c.flow != nil {
						if err := c.runFlow(f, []window{w}); err != nil {
							t.Fatal(err)
						}
					}
					at[3] = time.Now()
					if _, err := c.decode(f, []window{w}); err != nil {
						t.Fatal(err)
					}
					at[4] = time.Now()
					if round == 0 { // the warm-up round is not counted
						continue
					}
					for i := range ms {
						ms[i] = append(ms[i], float64(at[i+1].Sub(at[i]).Microseconds())/1000)
					}
				}
			}
			med := func(v []float64) float64 { return slices.Sorted(slices.Values(v))[len(v)/2] }
			t.Logf("%s, piper_front %s, piper_flow %s on %s: phonemes %.1f ms, front %.1f ms, flow %.1f ms, first chunk %.1f ms (medians of %d)",
				f.Stem, fr, fl, provider, med(ms[0]), med(ms[1]), med(ms[2]), med(ms[3]), len(ms[0]))
		}
	}
}
