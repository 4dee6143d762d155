package staged

import (
	"errors"
	"fmt"
	"slices"

	"github.com/voxmux/voxmux/instance/ort"
	onnxrt "github.com/yalue/onnxruntime_go"
)

type vocoderStage struct {
	m    *Manifest
	sess *onnxrt.DynamicAdvancedSession // any shape
	// fixed[i][j] only ever runs batches of batches[i] items of frames[j] frames: ONNX Runtime
	// plans its cuDNN convolutions again whenever a session's input shape changes, which costs the
	// benchmark vocoder 5× its run time (docs/benchmarks). Items are padded on the right with
	// zeros, which a causal vocoder ignores (docs/pipeline.md). Empty: sess runs every batch.
	batches []int
	frames  []int // rising: the lengths of the items the engine makes (vocoderFrames), up to the window
	fixed   [][]*onnxrt.DynamicAdvancedSession
	// window > 0: an item longer than window frames runs as overlapping windows of at most
	// window frames, each after ctx frames of the one before (vocoderWindows), which a causal
	// vocoder turns into the same samples. 0: every item runs whole.
	window, ctx int
}

// maxDefaultWindow bounds the default vocoder window: on an H100 the benchmark vocoder's cost
// per frame at 232 frames was twice that at 66–132 frames, at every batch size (cuDNN's
// convolutions over long rows; H100, voxmux e92050a).
const maxDefaultWindow = 160

// defaultVocoderWindow is the longest of the engine's chunk lengths (vocoderFrames) that is at
// most maxDefaultWindow frames, so that windows run in a fixed-shape session of their own
// length; 0 if there is none.
func defaultVocoderWindow(frames []int) int {
	w := 0
	for _, f := range frames {
		if f <= maxDefaultWindow {
			w = f
		}
	}
	return w
}

// vocoderWindows splits an item of n frames into windows of at most w frames: the first from
// frame 0, each later one starting ctx frames before the end of the one before. keep is where
// each window's own frames begin (0 for the first), so the kept parts tile [0, n) exactly.
func vocoderWindows(n, w, ctx int) (windows [][2]int, keep []int) {
	if w <= ctx || n <= w {
		return [][2]int{{0, n}}, []int{0}
	}
	windows, keep = append(windows, [2]int{0, w}), append(keep, 0)
	for end := w; end < n; {
		start := end - ctx
		next := min(n, start+w)
		windows, keep = append(windows, [2]int{start, next}), append(keep, ctx)
		end = next
	}
	return windows, keep
}

// vocoderFrames are the lengths in mel frames of the items the engine hands the vocoder for whole
// chunks (Engine.flowDone): the first chunk alone, each later one after up to the context's frames
// of the chunk before it. A stream's last chunk may be shorter and runs padded to the next length.
// One length for all would pad a first chunk of the benchmark model (16 frames) to 232.
func vocoderFrames(m *Manifest) []int {
	R, ctx := m.Flow.FramesPerToken, m.Streaming.ContextTokens*m.Flow.FramesPerToken
	var out []int
	// One index past the schedule: the last size repeats, after a chunk of its own size.
	for i := 0; i <= len(m.Streaming.ChunkTokens); i++ {
		f := m.ChunkSize(i) * R
		if i > 0 {
			f += min(ctx, m.ChunkSize(i-1)*R)
		}
		out = append(out, f)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func newVocoderStage(rt *ort.Runtime, m *Manifest, opt options) (*vocoderStage, error) {
	in, out := []string{m.Tensor("mel")}, []string{m.Tensor("audio")}
	s, err := rt.SessionWith(rt.VocoderCUDAOptions(), "vocoder", m.Path(m.Vocoder.File), in, out)
	if err != nil {
		return nil, fmt.Errorf("vocoder: %w", err)
	}
	v := &vocoderStage{m: m, sess: s, ctx: m.Streaming.ContextTokens * m.Flow.FramesPerToken}
	frames := vocoderFrames(m)
	// Without left context a window's first samples would differ from the whole item's.
	switch w := opt.vocoderWindow; {
	case w > 0 && v.ctx == 0:
		s.Destroy()
		return nil, fmt.Errorf("engine.vocoder_window: the manifest gives the vocoder no left context (streaming.context_tokens is 0), so windows would change its audio")
	case w > 0 && w <= v.ctx:
		s.Destroy()
		return nil, fmt.Errorf("engine.vocoder_window: %d frames must be more than the manifest's vocoder context (streaming.context_tokens × flow.frames_per_token = %d frames)", w, v.ctx)
	case w > 0:
		v.window = w
	case w < 0 && v.ctx > 0:
		v.window = defaultVocoderWindow(frames)
	}
	if v.window > 0 {
		// Items never run longer than the window: the fixed lengths stop there.
		frames = slices.DeleteFunc(frames, func(f int) bool { return f >= v.window })
		frames = append(frames, v.window)
	}
	if len(opt.vocoderBatches) == 0 {
		return v, nil
	}
	v.frames = frames
	for i, b := range opt.vocoderBatches {
		v.batches = append(v.batches, b)
		v.fixed = append(v.fixed, nil)
		for _, F := range v.frames {
			f, err := rt.FixedShapeSession(rt.VocoderCUDAOptions(), fmt.Sprintf("vocoder_%dx%d", b, F), m.Path(m.Vocoder.File), in, out)
			if err == nil {
				v.fixed[i] = append(v.fixed[i], f)
				// Warm up: the session plans its convolutions for its one shape now, not on a request.
				_, err = v.runOn(f, make([][]float32, b), F)
			}
			if err != nil {
				v.close()
				return nil, fmt.Errorf("vocoder, batch %d × %d frames: %w", b, F, err)
			}
		}
	}
	return v, nil
}

func (s *vocoderStage) close() error {
	var errs []error
	for _, row := range s.fixed {
		for _, f := range row {
			errs = append(errs, f.Destroy())
		}
	}
	s.fixed = nil
	return errors.Join(append(errs, s.sess.Destroy())...)
}

// run turns each channel-major mel [mel_bins][frames] into frames·hop samples, items longer
// than the window in windows.
func (s *vocoderStage) run(mels [][]float32) ([][]float32, error) {
	if s.window == 0 {
		return s.runBatch(mels)
	}
	C, hop := s.m.Flow.MelBins, s.m.Vocoder.Hop
	var pieces [][]float32
	var keeps, counts []int
	for _, m := range mels {
		n := len(m) / C
		windows, keep := vocoderWindows(n, s.window, s.ctx)
		counts = append(counts, len(windows))
		keeps = append(keeps, keep...)
		if len(windows) == 1 {
			pieces = append(pieces, m)
			continue
		}
		for _, w := range windows {
			l := w[1] - w[0]
			p := make([]float32, C*l)
			for c := 0; c < C; c++ {
				copy(p[c*l:(c+1)*l], m[c*n+w[0]:c*n+w[1]])
			}
			pieces = append(pieces, p)
		}
	}
	audio, err := s.runBatch(pieces)
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(mels))
	k := 0
	for i, n := range counts {
		if n == 1 {
			out[i] = audio[k]
			k++
			continue
		}
		a := make([]float32, 0, len(mels[i])/C*hop)
		for j := 0; j < n; j, k = j+1, k+1 {
			a = append(a, audio[k][keeps[k]*hop:]...)
		}
		out[i] = a
	}
	return out, nil
}

// runBatch runs items of any length, in the fixed-shape sessions where they fit.
func (s *vocoderStage) runBatch(mels [][]float32) ([][]float32, error) {
	C := s.m.Flow.MelBins
	longest := 0
	for _, m := range mels {
		longest = max(longest, len(m)/C)
	}
	// The shortest fixed length that takes every item; none: longer than any chunk the engine
	// makes (bench stages asks for such shapes).
	j, _ := slices.BinarySearch(s.frames, longest)
	if len(s.fixed) == 0 || j == len(s.frames) {
		return s.runOn(s.sess, mels, 0)
	}
	out := make([][]float32, 0, len(mels))
	for len(mels) > 0 {
		// The smallest fixed batch that takes every item left, else the largest, repeatedly.
		i := len(s.batches) - 1
		for k, b := range s.batches {
			if b >= len(mels) {
				i = k
				break
			}
		}
		n := min(len(mels), s.batches[i])
		// Padded to the session's batch with silent items.
		padded := make([][]float32, s.batches[i])
		copy(padded, mels[:n])
		audio, err := s.runOn(s.fixed[i][j], padded, s.frames[j])
		if err != nil {
			return nil, err
		}
		out = append(out, audio[:n]...)
		mels = mels[n:]
	}
	return out, nil
}

// runOn runs one batch on sess, every item padded to the longest or to frames if that is more.
func (s *vocoderStage) runOn(sess *onnxrt.DynamicAdvancedSession, mels [][]float32, frames int) ([][]float32, error) {
	B, C, hop := len(mels), s.m.Flow.MelBins, s.m.Vocoder.Hop
	F := frames
	for _, m := range mels {
		F = max(F, len(m)/C)
	}
	in := make([]float32, B*C*F)
	for b, m := range mels {
		fb := len(m) / C
		for c := 0; c < C; c++ {
			copy(in[(b*C+c)*F:], m[c*fb:(c+1)*fb])
		}
	}
	t, err := onnxrt.NewTensor(onnxrt.NewShape(int64(B), int64(C), int64(F)), in)
	if err != nil {
		return nil, fmt.Errorf("vocoder input: %w", err)
	}
	defer t.Destroy()
	outs := []onnxrt.Value{nil}
	if err := sess.Run([]onnxrt.Value{t}, outs); err != nil {
		return nil, fmt.Errorf("vocoder: %w", err)
	}
	defer ort.Destroy(outs)
	audio, err := ort.Floats(outs[0])
	if err != nil {
		return nil, fmt.Errorf("vocoder output: %w", err)
	}
	if len(audio) != B*F*hop {
		return nil, fmt.Errorf("vocoder: audio has %d samples, want B·F·hop = %d", len(audio), B*F*hop)
	}
	out := make([][]float32, B)
	for b, m := range mels {
		fb := len(m) / C
		out[b] = append([]float32(nil), audio[b*F*hop:b*F*hop+fb*hop]...)
	}
	return out, nil
}
