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

// vocoderFrames are the lengths in mel frames of the windows the engine hands the vocoder for
// whole chunks (vocHistory.window): the first chunk alone, each later one after the frames held
// back from the chunks before it (vocoder.lookahead_frames) and the left context. A stream's last
// chunk may be shorter and runs padded to the next length. One length for all would pad a first
// chunk of the benchmark model (16 frames) to 232.
func vocoderFrames(m *Manifest) []int {
	R, la := m.Flow.FramesPerToken, m.Vocoder.LookaheadFrames
	var out []int
	sum := 0
	// One index past the schedule: the last size repeats, after a chunk of its own size.
	for i := 0; i <= len(m.Streaming.ChunkTokens); i++ {
		f := m.ChunkSize(i) * R
		if i > 0 {
			f += min(windowContext(m, m.ChunkSize(i-1)*R)+la, sum)
		}
		sum += m.ChunkSize(i) * R
		out = append(out, f)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func newVocoderStage(rt *ort.Runtime, m *Manifest, opt options) (*vocoderStage, error) {
	in, out := []string{m.Tensor("mel")}, []string{m.Tensor("audio")}
	if m.Vocoder.SourcePhase > 0 {
		in = append(in, m.Tensor("phase"), m.Tensor("phase_at"), m.Tensor("sample_offset"))
		out = append(out, m.Tensor("phase_out"))
	}
	s, err := rt.SessionWith(rt.VocoderCUDAOptions(), "vocoder", m.Path(m.Vocoder.File), in, out)
	if err != nil {
		return nil, fmt.Errorf("vocoder: %w", err)
	}
	v := &vocoderStage{m: m, sess: s, ctx: vocoderContext(m)}
	frames := vocoderFrames(m)
	// Without left context a window's first samples would differ from the whole item's.
	switch w := opt.vocoderWindow; {
	case w > 0 && m.Vocoder.SourcePhase > 0:
		// The engine's windows carry the phase from one to the next (vocwindow.go); a split
		// item's windows would each need the one before's.
		s.Destroy()
		return nil, fmt.Errorf("engine.vocoder_window: does not apply to a vocoder that carries a source phase (vocoder.source_phase)")
	case m.Vocoder.SourcePhase > 0:
	case w > 0 && v.ctx == 0:
		s.Destroy()
		return nil, fmt.Errorf("engine.vocoder_window: the manifest gives the vocoder no left context (streaming.context_tokens is 0), so windows would change its audio")
	case w > 0 && w <= v.ctx:
		s.Destroy()
		return nil, fmt.Errorf("engine.vocoder_window: %d frames must be more than the manifest's vocoder context (vocoder.context_frames, else streaming.context_tokens × flow.frames_per_token: %d frames)", w, v.ctx)
	case w > 0:
		v.window = w
	case w == 0 && v.ctx > 0:
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
				_, _, err = v.runJobsOn(f, make([]vocJob, b), F)
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

// vocJob is one item of a vocoder run: a channel-major mel [mel_bins][frames] and, for a graph
// that carries a source phase (vocoder.source_phase), the phase of each harmonic before frame
// phaseAt and the absolute sample index of the item's first sample.
type vocJob struct {
	mel             []float32
	phase           []float32
	phaseAt, offset int64
}

// run turns each channel-major mel [mel_bins][frames] into frames·hop samples, items longer
// than the window in windows; a phase-carrying graph starts each at phase 0.
func (s *vocoderStage) run(mels [][]float32) ([][]float32, error) {
	jobs := make([]vocJob, len(mels))
	for i, m := range mels {
		jobs[i] = vocJob{mel: m}
	}
	audio, _, err := s.runJobs(jobs)
	return audio, err
}

// runJobs runs jobs and returns each one's frames·hop samples and, with vocoder.source_phase,
// its phase_out [frames][source_phase]. Windows (s.window) never split phase-carrying items
// (newVocoderStage).
func (s *vocoderStage) runJobs(jobs []vocJob) (audio, phase [][]float32, err error) {
	if s.window == 0 {
		return s.runBatch(jobs)
	}
	C, hop := s.m.Flow.MelBins, s.m.Vocoder.Hop
	var pieces []vocJob
	var keeps, counts []int
	for _, j := range jobs {
		m := j.mel
		n := len(m) / C
		windows, keep := vocoderWindows(n, s.window, s.ctx)
		counts = append(counts, len(windows))
		keeps = append(keeps, keep...)
		if len(windows) == 1 {
			pieces = append(pieces, j)
			continue
		}
		for _, w := range windows {
			l := w[1] - w[0]
			p := make([]float32, C*l)
			for c := 0; c < C; c++ {
				copy(p[c*l:(c+1)*l], m[c*n+w[0]:c*n+w[1]])
			}
			pieces = append(pieces, vocJob{mel: p})
		}
	}
	pa, _, err := s.runBatch(pieces)
	if err != nil {
		return nil, nil, err
	}
	out := make([][]float32, len(jobs))
	k := 0
	for i, n := range counts {
		if n == 1 {
			out[i] = pa[k]
			k++
			continue
		}
		a := make([]float32, 0, len(jobs[i].mel)/C*hop)
		for j := 0; j < n; j, k = j+1, k+1 {
			a = append(a, pa[k][keeps[k]*hop:]...)
		}
		out[i] = a
	}
	return out, nil, nil
}

// runBatch runs items of any length, in the fixed-shape sessions where they fit.
func (s *vocoderStage) runBatch(jobs []vocJob) (audio, phase [][]float32, err error) {
	C := s.m.Flow.MelBins
	longest := 0
	for _, j := range jobs {
		longest = max(longest, len(j.mel)/C)
	}
	// The shortest fixed length that takes every item; none: longer than any chunk the engine
	// makes (bench stages asks for such shapes).
	j, _ := slices.BinarySearch(s.frames, longest)
	if len(s.fixed) == 0 || j == len(s.frames) {
		return s.runJobsOn(s.sess, jobs, 0)
	}
	for len(jobs) > 0 {
		// The smallest fixed batch that takes every item left, else the largest, repeatedly.
		i := len(s.batches) - 1
		for k, b := range s.batches {
			if b >= len(jobs) {
				i = k
				break
			}
		}
		n := min(len(jobs), s.batches[i])
		// Padded to the session's batch with silent items.
		padded := make([]vocJob, s.batches[i])
		copy(padded, jobs[:n])
		a, p, err := s.runJobsOn(s.fixed[i][j], padded, s.frames[j])
		if err != nil {
			return nil, nil, err
		}
		audio = append(audio, a[:n]...)
		if p != nil {
			phase = append(phase, p[:n]...)
		}
		jobs = jobs[n:]
	}
	return audio, phase, nil
}

// runOn runs mels as one batch on sess, every item padded to the longest or to frames if that
// is more.
func (s *vocoderStage) runOn(sess *onnxrt.DynamicAdvancedSession, mels [][]float32, frames int) ([][]float32, error) {
	jobs := make([]vocJob, len(mels))
	for i, m := range mels {
		jobs[i] = vocJob{mel: m}
	}
	audio, _, err := s.runJobsOn(sess, jobs, frames)
	return audio, err
}

// runJobsOn runs one batch on sess, every item padded to the longest or to frames if that is
// more; with vocoder.source_phase it also feeds phase, phase_at and sample_offset and returns
// each item's phase_out rows.
func (s *vocoderStage) runJobsOn(sess *onnxrt.DynamicAdvancedSession, jobs []vocJob, frames int) (audio, phase [][]float32, err error) {
	B, C, hop, H := len(jobs), s.m.Flow.MelBins, s.m.Vocoder.Hop, s.m.Vocoder.SourcePhase
	F := frames
	for _, j := range jobs {
		F = max(F, len(j.mel)/C)
	}
	in := make([]float32, B*C*F)
	for b, j := range jobs {
		fb := len(j.mel) / C
		for c := 0; c < C; c++ {
			copy(in[(b*C+c)*F:], j.mel[c*fb:(c+1)*fb])
		}
	}
	var vals []onnxrt.Value
	defer func() { ort.Destroy(vals) }()
	t, err := onnxrt.NewTensor(onnxrt.NewShape(int64(B), int64(C), int64(F)), in)
	if err != nil {
		return nil, nil, fmt.Errorf("vocoder input: %w", err)
	}
	vals = append(vals, t)
	outs := []onnxrt.Value{nil}
	if H > 0 {
		ph, at, off := make([]float32, B*H), make([]int64, B), make([]int64, B)
		for b, j := range jobs {
			copy(ph[b*H:(b+1)*H], j.phase)
			at[b], off[b] = j.phaseAt, j.offset
		}
		var v onnxrt.Value
		if v, err = onnxrt.NewTensor(onnxrt.NewShape(int64(B), int64(H)), ph); err == nil {
			vals = append(vals, v)
			if v, err = onnxrt.NewTensor(onnxrt.NewShape(int64(B)), at); err == nil {
				vals = append(vals, v)
				if v, err = onnxrt.NewTensor(onnxrt.NewShape(int64(B)), off); err == nil {
					vals = append(vals, v)
				}
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("vocoder input: %w", err)
		}
		outs = append(outs, nil)
	}
	if err := sess.Run(vals, outs); err != nil {
		return nil, nil, fmt.Errorf("vocoder: %w", err)
	}
	defer ort.Destroy(outs)
	all, err := ort.Floats(outs[0])
	if err != nil {
		return nil, nil, fmt.Errorf("vocoder output: %w", err)
	}
	if len(all) != B*F*hop {
		return nil, nil, fmt.Errorf("vocoder: audio has %d samples, want B·F·hop = %d", len(all), B*F*hop)
	}
	var phs []float32
	if H > 0 {
		if phs, err = ort.Floats(outs[1]); err != nil {
			return nil, nil, fmt.Errorf("vocoder output: %w", err)
		}
		if len(phs) != B*F*H {
			return nil, nil, fmt.Errorf("vocoder: phase_out has %d values, want B·F·source_phase = %d", len(phs), B*F*H)
		}
		phase = make([][]float32, B)
	}
	audio = make([][]float32, B)
	for b, j := range jobs {
		fb := len(j.mel) / C
		audio[b] = append([]float32(nil), all[b*F*hop:b*F*hop+fb*hop]...)
		if H > 0 {
			phase[b] = append([]float32(nil), phs[b*F*H:(b*F+fb)*H]...)
		}
	}
	return audio, phase, nil
}
