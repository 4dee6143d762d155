package piper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"

	onnxrt "github.com/yalue/onnxruntime_go"
)

// Chunked decoding (docs/piper.md, "First audio"). A sentence runs the front graph (split.go)
// once, which gives its latent frames, then the decoder over chunks of those frames: the first
// chunk small so its audio leaves early, later ones doubling up to piper_chunk for throughput.
// Each chunk is decoded with the decoder's receptive field of latent frames on each side (fewer at
// the sentence's ends, where a whole run sees the convolutions' zero padding too), and that
// context's audio is cut off, so the chunks joined equal one decoder run over the whole sentence
// to float rounding. The rows of a front batch are decoded together, chunk by chunk.

// calibrationText is synthesized once when a chunked voice loads: digits, which every espeak-ng
// language reads, so any voice says something typical of its speech.
const calibrationText = "1 2 3 4 5 6 7 8 9 10."

// piperChunker is a voice's graph split into a front and a decoder session.
type piperChunker struct {
	front, dec *onnxrt.DynamicAdvancedSession
	split      *piperSplit
	speed      bool // the front takes each row's speed (piperSpeedInput, speed.go)
	cpuFront   bool // front is a session of the CPU provider (piper_front cpu)
	// cpu is the front's session on the CPU provider beside front's on the group's provider
	// (piper_front auto; nil otherwise), which runs a batch of at most autoCPURows sentences
	// while cpuBusy is not set.
	cpu     *onnxrt.DynamicAdvancedSession
	cpuBusy *atomic.Bool
	// flow is the flow's session on the group's provider when it runs over chunks (piper_flow
	// chunks; nil: the front holds the flow, and its output is the latent).
	flow *onnxrt.DynamicAdvancedSession
	// frontWhole, with flow, is the front with the flow in it (on front's provider), which a
	// front batch with no request's first sentence runs: their flow gains nothing in chunks.
	frontWhole  *onnxrt.DynamicAdvancedSession
	first, most int // chunk frames: the first chunk's, and the most of a later one's
	// peak is the raw peak of the voice's calibration sentence: a sentence's gain is fixed before
	// its first chunk leaves, so it starts from this rather than from the sentence's own peak.
	peak float32
}

// newPiperChunker splits f's graph and loads its two sessions; a graph that cannot be split gives
// a reason and no chunker. The speed input goes into the front after the split: the split finds
// the row lengths by VITS's Ceil → ReduceSum chain, which the speed edit puts its nodes into, and
// the front holds the duration rounding and everything that reads it (the row lengths, the
// alignment), so its latent and lengths are the frames at each row's speed.
func (r *Runner) newPiperChunker(f *piperFile, in []string) (*piperChunker, string, error) {
	sp, reason, err := splitPiper(f.Path, r.opts.ChunkFlow)
	if err != nil || sp == nil {
		return nil, reason, err
	}
	if r.opts.ChunkFlow && sp.flowReason != "" {
		level := slog.LevelInfo // the provider's default, which such a voice simply does without
		if r.opts.FlowAsked {
			level = slog.LevelWarn
		}
		slog.Log(context.Background(), level, "piper voice's flow cannot run in chunks; it stays in the front", "voice", f.Stem, "reason", sp.flowReason)
	}
	g, err := piperWithSpeed(sp.front)
	if err != nil {
		return nil, "", fmt.Errorf("piper voice %s: front: %w", f.Path, err)
	}
	speed := g != nil
	if speed {
		sp.front = g
		in = append(slices.Clip(in), piperSpeedInput)
	}
	if sp.frontWhole != nil {
		// The same edit, which finds the same nodes in the front with the flow.
		if sp.frontWhole, err = piperWithSpeed(sp.frontWhole); err != nil || (sp.frontWhole != nil) != speed {
			return nil, "", fmt.Errorf("piper voice %s: front with the flow: speed edit %v: %w", f.Path, sp.frontWhole != nil, err)
		}
	}
	frontOut := []string{sp.latent, piperLengthOutput}
	if sp.flow != nil {
		frontOut[0] = sp.flowIn
	}
	var front, cpu, whole *onnxrt.DynamicAdvancedSession
	if r.opts.AutoFront {
		if cpu, err = r.rt.CPUSessionFromData(r.opts.FrontThreads, "piper-front-cpu", sp.front, in, frontOut); err != nil {
			return nil, "", fmt.Errorf("piper voice: load %s: %w", f.Path, err)
		}
	}
	// Host tensors in and out either way: the latent goes to the decoder's device as every
	// decoder input does.
	loadFront := func(name string, graph []byte, out []string) (*onnxrt.DynamicAdvancedSession, error) {
		if r.opts.CPUFront {
			return r.rt.CPUSessionFromData(r.opts.FrontThreads, name, graph, in, out)
		}
		return r.rt.SessionFromData(name, graph, in, out)
	}
	front, err = loadFront("piper-front", sp.front, frontOut)
	if err == nil && r.opts.CPUFront && r.rt.CUDA() {
		slog.Info("piper voice's front runs on the CPU provider, its decoder on CUDA", "voice", f.Stem, "intra_op_threads", r.opts.FrontThreads)
	}
	if err == nil && sp.frontWhole != nil {
		if whole, err = loadFront("piper-front-whole", sp.frontWhole, []string{sp.latent, piperLengthOutput}); err != nil {
			front.Destroy()
		}
	}
	if err != nil {
		if cpu != nil {
			cpu.Destroy()
		}
		return nil, "", fmt.Errorf("piper voice: load %s: %w", f.Path, err)
	}
	decIn := []string{sp.latent}
	if sp.decoderSID {
		decIn = append(decIn, "sid")
	}
	var decCUDA map[string]string
	if r.opts.Float16 {
		g, st, err := decoderFloat16(sp.decoder)
		if err != nil {
			destroyFronts(front, cpu, whole)
			return nil, "", fmt.Errorf("piper voice %s: piper_precision float16: %w", f.Path, err)
		}
		if st.Saturated > 0 {
			slog.Warn("piper voice's decoder has weights beyond float16's range; they are set to ±65504", "voice", f.Stem, "weights", st.Saturated, "of", st.Weights, "largest", st.Largest)
		}
		sp.decoder = g
		if !r.rt.CUDA() {
			slog.Warn("piper_precision float16 on the CPU provider: ONNX Runtime computes the decoder's float16 ops through casts to float32, slower than piper_precision float32", "voice", f.Stem)
		}
		// Channels-last convolutions: the layout of cuDNN's float16 tensor-core kernels
		// (ort.VocoderCUDAOptions).
		decCUDA = r.rt.VocoderCUDAOptions()
	}
	dec, err := r.rt.SessionFromDataWith(decCUDA, "piper-decoder", sp.decoder, decIn, []string{"output"})
	if err != nil {
		destroyFronts(front, cpu, whole)
		return nil, "", fmt.Errorf("piper voice: load %s: %w", f.Path, err)
	}
	var flow *onnxrt.DynamicAdvancedSession
	if sp.flow != nil {
		flowIn := []string{sp.flowIn, sp.flowMask}
		if sp.flowSID {
			flowIn = append(flowIn, "sid")
		}
		if flow, err = r.rt.SessionFromData("piper-flow", sp.flow, flowIn, []string{sp.latent}); err != nil {
			destroyFronts(front, cpu, whole)
			dec.Destroy()
			return nil, "", fmt.Errorf("piper voice: load %s: flow: %w", f.Path, err)
		}
	}
	sp.front, sp.decoder, sp.flow, sp.frontWhole = nil, nil, nil, nil // the sessions hold their own copies
	c := &piperChunker{front: front, cpu: cpu, cpuBusy: new(atomic.Bool), dec: dec, flow: flow, frontWhole: whole, split: sp, speed: speed, cpuFront: r.opts.CPUFront, first: r.opts.FirstChunk, most: r.opts.Chunk, peak: 1}
	sents, err := f.sentences(r.ph, calibrationText)
	if err == nil && len(sents) > 0 {
		var pcm []float32
		pcm, err = c.whole(f, sents[0].IDs, 0, 1, [3]float32{0, f.scales[1], 0})
		c.peak = rawPeak(pcm)
	}
	if err != nil {
		c.close()
		return nil, "", fmt.Errorf("piper voice %s: calibration: %w", f.Path, err)
	}
	return c, "", nil
}

func (c *piperChunker) close() error {
	err := errors.Join(c.front.Destroy(), c.dec.Destroy())
	if c.cpu != nil {
		err = errors.Join(err, c.cpu.Destroy())
	}
	if c.flow != nil {
		err = errors.Join(err, c.flow.Destroy(), c.frontWhole.Destroy())
	}
	return err
}

func destroyFronts(front *onnxrt.DynamicAdvancedSession, others ...*onnxrt.DynamicAdvancedSession) {
	front.Destroy()
	for _, s := range others {
		if s != nil {
			s.Destroy()
		}
	}
}

// autoCPURows is the largest front batch piper_front auto runs on the CPU. On one H100 host, one
// stream's first audio came after 79 ms with the front on the CPU against 273 ms on CUDA, while at
// 256 streams the CPU fronts bound the server at 35x real time where CUDA's gave 271x
// (docs/benchmarks/2026-12-07-h100-piper-front-cpu/): one or two sentences are a voice agent's
// batches; the bound between is not measured.
const autoCPURows = 2

// frontFor is the session a front batch of rows sentences runs in, and the function to call when
// it is done.
func (c *piperChunker) frontFor(rows int) (*onnxrt.DynamicAdvancedSession, func()) {
	if c.cpu != nil && rows <= autoCPURows && c.cpuBusy.CompareAndSwap(false, true) {
		return c.cpu, func() { c.cpuBusy.Store(false) }
	}
	return c.front, func() {}
}

// latent is one sentence's front output: channels × frames, frame-minor; the latent itself, or
// with the flow in chunks its input z_p, whose latent lat holds frames [0, done) of so far. With
// first set (a request's first sentence), the flow runs for the first chunk's frames before the
// rest (runFlow).
type latent struct {
	z        []float32
	channels int
	frames   int
	lat      []float32
	done     int
	first    bool
}

// decoderInput is the latent's frames [lo, hi) of channel k, which runFlow has computed when the
// flow runs in chunks.
func (l *latent) decoderInput(k, lo, hi int) []float32 {
	if l.lat != nil {
		return l.lat[k*l.frames+lo : k*l.frames+hi]
	}
	return l.z[k*l.frames+lo : k*l.frames+hi]
}

// runFront runs rows of ids through the front graph, at speeds (nil where the front does not take
// piperSpeedInput), and returns each row's latent (z_p with the flow in chunks), cut to its own
// frames.
func (c *piperChunker) runFront(f *piperFile, rows [][]int64, sids []int64, speeds []float32, scales [3]float32) ([]latent, error) {
	return c.runFrontIn(nil, f, rows, sids, speeds, scales)
}

// runBatchFront is runFront for a batch of which first (a request's first sentence) may be
// true of no row: then, with the flow in chunks, the front with the flow runs, and the latents
// come complete.
func (c *piperChunker) runBatchFront(f *piperFile, rows [][]int64, sids []int64, speeds []float32, scales [3]float32, first []bool) ([]latent, error) {
	if c.frontWhole == nil || slices.Contains(first, true) {
		ls, err := c.runFrontIn(nil, f, rows, sids, speeds, scales)
		for i := range ls {
			ls[i].first = first[i]
		}
		return ls, err
	}
	ls, err := c.runFrontIn(c.frontWhole, f, rows, sids, speeds, scales)
	for i := range ls {
		ls[i].lat, ls[i].done = ls[i].z, ls[i].frames
	}
	return ls, err
}

// runFrontIn runs the front in session s (nil: frontFor's).
func (c *piperChunker) runFrontIn(s *onnxrt.DynamicAdvancedSession, f *piperFile, rows [][]int64, sids []int64, speeds []float32, scales [3]float32) ([]latent, error) {
	vals, err := piperInputs(f, rows, sids, speeds, scales)
	defer func() { ort.Destroy(vals) }()
	if err != nil {
		return nil, err
	}
	outs := []onnxrt.Value{nil, nil}
	done := func() {}
	if s == nil {
		s, done = c.frontFor(len(rows))
	}
	err = s.Run(vals, outs)
	done()
	defer ort.Destroy(outs)
	if err != nil {
		return nil, piperRunError(f, len(rows), err)
	}
	zt, ok := outs[0].(*onnxrt.Tensor[float32])
	ft, ok2 := outs[1].(*onnxrt.Tensor[int64])
	if !ok || !ok2 {
		return nil, fmt.Errorf("piper voice %s: front outputs are %T and %T", f.Stem, outs[0], outs[1])
	}
	shape, frames := zt.GetShape(), ft.GetData()
	b := len(rows)
	if len(shape) != 3 || int(shape[0]) != b || len(frames) != b {
		return nil, fmt.Errorf("piper voice %s: latent of shape %v and row lengths %v for %d rows", f.Stem, shape, frames, b)
	}
	ch, longest := int(shape[1]), int(shape[2])
	z := zt.GetData()
	out := make([]latent, b)
	for i := range out {
		n := int(frames[i])
		if n < 1 || n > longest {
			return nil, fmt.Errorf("piper voice %s: row %d has %d frames of %d", f.Stem, i, n, longest)
		}
		l := latent{z: make([]float32, ch*n), channels: ch, frames: n}
		for k := range ch {
			copy(l.z[k*n:(k+1)*n], z[(i*ch+k)*longest:])
		}
		out[i] = l
	}
	return out, nil
}

// window is a part of a row's latent to decode: frames [lo, hi), of which [from, to) are kept.
type window struct {
	l              *latent
	sid            int64
	lo, hi         int
	from, to       int
	leftCtx, right int
}

// decode runs the decoder over windows as one batch (shorter ones padded with zero frames at the
// end) and returns each window's kept audio.
func (c *piperChunker) decode(f *piperFile, ws []window) ([][]float32, error) {
	b, ch := len(ws), ws[0].l.channels
	w := 0
	for _, x := range ws {
		w = max(w, x.hi-x.lo)
	}
	in := make([]float32, b*ch*w)
	sids := make([]int64, b)
	if c.flow != nil {
		if err := c.runFlow(f, ws); err != nil {
			return nil, err
		}
	}
	for r, x := range ws {
		for k := range ch {
			copy(in[(r*ch+k)*w:], x.l.decoderInput(k, x.lo, x.hi))
		}
		sids[r] = x.sid
	}
	var vals runInputs
	defer func() { ort.Destroy(vals.vals) }()
	vals.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b), int64(ch), int64(w)), in))
	if c.split.decoderSID {
		vals.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b)), sids))
	}
	if err := vals.err(); err != nil {
		return nil, fmt.Errorf("piper decoder input: %w", err)
	}
	outs := []onnxrt.Value{nil}
	err := c.dec.Run(vals.vals, outs)
	defer ort.Destroy(outs)
	if err != nil {
		return nil, piperRunError(f, b, err)
	}
	audio, err := ort.Floats(outs[0])
	if err != nil {
		return nil, fmt.Errorf("piper voice %s: %w", f.Stem, err)
	}
	hop := c.split.hop
	if len(audio) != b*w*hop {
		return nil, fmt.Errorf("piper voice %s: the decoder gave %d samples for %d rows of %d frames, want %d a frame", f.Stem, len(audio), b, w, hop)
	}
	out := make([][]float32, b)
	for r, x := range ws {
		row := audio[r*w*hop : (r+1)*w*hop]
		out[r] = append([]float32(nil), row[(x.from-x.lo)*hop:(x.to-x.lo)*hop]...)
	}
	return out, nil
}

// runFlow computes, with the flow in chunks, the latent frames the windows need that their
// sentences do not have yet: for the first window of a request's first sentence its frames alone,
// so that the request's first audio waits only for them, and then every frame left; for any
// other sentence all its frames at once, since its audio is not the first to leave. So the flow's
// context (flowLeft + flowRight frames computed twice) is paid once a request. One flow run
// covers the rows that need frames, each over its frames widened by the flow's receptive field as
// far as its sentence reaches, rows padded at the end with zero frames that the mask marks as past
// the row (the flow masks every layer, so they act as the whole run's zero padding at the
// sentence's end).
func (c *piperChunker) runFlow(f *piperFile, ws []window) error {
	var rows []window
	var los, tos []int
	fw := 0
	for _, x := range ws {
		l := x.l
		if x.hi <= l.done {
			continue
		}
		to := l.frames
		if l.done == 0 && l.first {
			to = x.hi
		}
		lo := max(0, l.done-c.split.flowLeft)
		fw = max(fw, min(l.frames, to+c.split.flowRight)-lo)
		rows, los, tos = append(rows, x), append(los, lo), append(tos, to)
	}
	if len(rows) == 0 {
		return nil
	}
	b, ch := len(rows), rows[0].l.channels
	zp := make([]float32, b*ch*fw)
	mask := make([]float32, b*fw)
	for r, x := range rows {
		l := x.l
		hi := min(l.frames, tos[r]+c.split.flowRight)
		for k := range ch {
			copy(zp[(r*ch+k)*fw:], l.z[k*l.frames+los[r]:k*l.frames+hi])
		}
		for t := range hi - los[r] {
			mask[r*fw+t] = 1
		}
	}
	var in runInputs
	defer func() { ort.Destroy(in.vals) }()
	in.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b), int64(ch), int64(fw)), zp))
	in.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b), 1, int64(fw)), mask))
	if c.split.flowSID {
		sids := make([]int64, b)
		for r, x := range rows {
			sids[r] = x.sid
		}
		in.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b)), sids))
	}
	if err := in.err(); err != nil {
		return fmt.Errorf("piper flow input: %w", err)
	}
	outs := []onnxrt.Value{nil}
	err := c.flow.Run(in.vals, outs)
	defer ort.Destroy(outs)
	if err != nil {
		return piperRunError(f, b, err)
	}
	z, err := ort.Floats(outs[0])
	if err != nil {
		return fmt.Errorf("piper voice %s: flow: %w", f.Stem, err)
	}
	if len(z) != b*ch*fw {
		return fmt.Errorf("piper voice %s: the flow gave %d values for %d rows of %d channels and %d frames", f.Stem, len(z), b, ch, fw)
	}
	for r, x := range rows {
		l := x.l
		if l.lat == nil {
			l.lat = make([]float32, ch*l.frames)
		}
		at := l.done - los[r]
		for k := range ch {
			copy(l.lat[k*l.frames+l.done:k*l.frames+tos[r]], z[(r*ch+k)*fw+at:])
		}
		l.done = tos[r]
	}
	return nil
}

// chunkWindow is the window that decodes frames [from, to) of l with the receptive field's
// context on each side, as far as the sentence reaches.
func (c *piperChunker) chunkWindow(l *latent, sid int64, from, to int) window {
	return window{l: l, sid: sid, lo: max(0, from-c.split.left), hi: min(l.frames, to+c.split.right), from: from, to: to}
}

// whole synthesizes one sentence at speed with the decoder run once over all its frames.
func (c *piperChunker) whole(f *piperFile, ids []int64, sid int64, speed float32, scales [3]float32) ([]float32, error) {
	var speeds []float32
	if c.speed {
		speeds = []float32{speed}
	}
	ls, err := c.runFront(f, [][]int64{ids}, []int64{sid}, speeds, scales)
	if err != nil {
		return nil, err
	}
	out, err := c.decode(f, []window{{l: &ls[0], sid: sid, hi: ls[0].frames, to: ls[0].frames}})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// runChunks synthesizes a batch of sentences: one front run, then decoder runs of one chunk of
// every sentence still going, each chunk's audio handed to its request as soon as it is done.
func (s *piperSession) runChunks(live []*piperJob) {
	c := s.chunks
	t0 := time.Now()
	rows, sids, speeds := s.rows(live, t0)
	first := make([]bool, len(live))
	for i, j := range live {
		first[i] = j.first
	}
	ls, err := c.runBatchFront(s.file, rows, sids, speeds, live[0].scales, first)
	if err != nil {
		s.r.stats.Count(stageGraph, len(live), t0)
		for _, j := range live {
			s.answer(j, piperResult{err: err})
		}
		return
	}
	at := make([]int, len(live)) // each row's next frame
	for size := c.first; ; size = min(2*size, c.most) {
		var ws []window
		var js []*piperJob
		for i, j := range live {
			if j == nil {
				continue
			}
			if err := j.ctx.Err(); err != nil {
				s.answer(j, piperResult{err: err})
				live[i] = nil
				continue
			}
			to := min(at[i]+size, ls[i].frames)
			ws = append(ws, c.chunkWindow(&ls[i], sids[i], at[i], to))
			js = append(js, j)
			at[i] = to
		}
		if len(ws) == 0 {
			s.r.stats.Count(stageGraph, len(rows), t0)
			return
		}
		pcm, err := c.decode(s.file, ws)
		// The batch is counted before its last parts are handed over, so a request that has all
		// its audio finds its run counted.
		ends := true
		for _, j := range js {
			i := indexOf(live, j)
			ends = ends && (err != nil || at[i] == ls[i].frames)
		}
		if ends {
			s.r.stats.Count(stageGraph, len(rows), t0)
		}
		for r, j := range js {
			i := indexOf(live, j)
			if err != nil {
				s.answer(j, piperResult{err: err})
				live[i] = nil
				continue
			}
			last := at[i] == ls[i].frames
			j.parts.push(piperPart{pcm: pcm[r], from: ws[r].from, to: ws[r].to, total: ls[i].frames, last: last})
			if last {
				s.r.release(j.req)
				live[i] = nil
			}
		}
		if ends {
			return
		}
	}
}

func indexOf(js []*piperJob, j *piperJob) int {
	for i, x := range js {
		if x == j {
			return i
		}
	}
	return -1
}

// piperRunError is a failed run's error: out of device memory is the caller's to retry (busy).
func piperRunError(f *piperFile, rows int, err error) error {
	if strings.Contains(strings.ToLower(err.Error()), "out of memory") {
		return &tts.Error{Kind: tts.ErrBusy, Msg: fmt.Sprintf("piper voice %s: the device ran out of memory for a batch of %d sentences; retry later", f.Stem, rows)}
	}
	return fmt.Errorf("piper voice %s: %w", f.Stem, err)
}

// piperInputs are the graph's inputs for rows of ids: padded with 0 to the longest row,
// input_lengths each row's own, sid each row's speaker, and where speeds is not nil
// piperSpeedInput, each row's speed.
func piperInputs(f *piperFile, rows [][]int64, sids []int64, speeds []float32, scales [3]float32) ([]onnxrt.Value, error) {
	b, t := len(rows), 0
	for _, r := range rows {
		t = max(t, len(r))
	}
	ids := make([]int64, b*t)
	lens := make([]int64, b)
	for i, r := range rows {
		copy(ids[i*t:], r)
		lens[i] = int64(len(r))
	}
	var in runInputs
	in.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b), int64(t)), ids))
	in.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b)), lens))
	in.add(onnxrt.NewTensor(onnxrt.NewShape(3), scales[:]))
	if f.HasSID {
		in.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b)), sids))
	}
	if speeds != nil {
		in.add(onnxrt.NewTensor(onnxrt.NewShape(int64(b), 1, 1), speeds))
	}
	if err := in.err(); err != nil {
		return in.vals, fmt.Errorf("piper inputs: %w", err)
	}
	return in.vals, nil
}

// runInputs collects a run's input tensors as they are made, and the errors of those that could
// not be; vals are the caller's to destroy either way.
type runInputs struct {
	vals []onnxrt.Value
	errs []error
}

func (in *runInputs) add(v onnxrt.Value, err error) {
	if err != nil {
		in.errs = append(in.errs, err)
		return
	}
	in.vals = append(in.vals, v)
}

func (in *runInputs) err() error { return errors.Join(in.errs...) }

// piperPart is a part of a sentence's audio: latent frames [from, to) of total (for a sentence run
// whole: 0, 1, 1), or the error that ended it.
type piperPart struct {
	pcm             []float32
	from, to, total int
	last            bool
	err             error
}

// piperParts hands a sentence's parts from a worker to its request; the worker never waits.
type piperParts struct {
	mu    sync.Mutex
	parts []piperPart
	wake  chan struct{}
}

func newPiperParts() *piperParts { return &piperParts{wake: make(chan struct{}, 1)} }

func (p *piperParts) push(x piperPart) {
	p.mu.Lock()
	p.parts = append(p.parts, x)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *piperParts) take() []piperPart {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.parts
	p.parts = nil
	return out
}

// stream queues one sentence of request q and calls each with its audio part by part, as the
// parts are done: one part for a session that runs whole sentences.
func (s *piperSession) stream(ctx context.Context, q *request, ids []int64, scales [3]float32, speed float32, sid int64, first bool, each func(piperPart) error) error {
	if s.chunks == nil {
		pcm, err := s.synthesize(ctx, q, ids, scales, speed, sid)
		if err != nil {
			return err
		}
		return each(piperPart{pcm: pcm, to: 1, total: 1, last: true})
	}
	j := &piperJob{ctx: ctx, req: q, queued: time.Now(), ids: ids, sid: sid, scales: scales, speed: speed, first: first, parts: newPiperParts()}
	s.r.hold(q)
	select {
	case s.jobs <- j:
	default:
		s.r.release(q)
		return &tts.Error{Kind: tts.ErrBusy, Msg: fmt.Sprintf("voice %s: %d sentences are already waiting for synthesis (engine option piper_queue); retry later", s.file.Stem, s.opts.Queue)}
	}
	for {
		select {
		case <-j.parts.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, p := range j.parts.take() {
			if p.err != nil {
				return p.err
			}
			if err := each(p); err != nil {
				return err
			}
			if p.last {
				return nil
			}
		}
	}
}

// sentenceOut turns a request's sentences' parts into chunks: gain, the silence between
// sentences, the text each chunk speaks, and the chunks' index.
type sentenceOut struct {
	text    string
	from    int // where the next sentence's text starts
	index   int
	rate    int
	silence int // samples after every sentence but the last (already divided by the speed)
	emit    func(tts.Chunk) error
}

// speak synthesizes sentence i of n (whose text ends at end) and emits its audio. A sentence run
// whole is scaled to its peak, as Piper does. A chunked sentence's gain must be chosen before its
// first chunk leaves: it is 1 over the larger of the voice's calibration peak and the peak of the
// sentence's audio so far, so it falls (never clipping) only where the sentence is louder than
// the calibration.
func (o *sentenceOut) speak(ctx context.Context, q *request, sess *piperSession, s piperSentence, i, n int, scales [3]float32, speed float32, sid int64) error {
	end := max(o.from, min(s.End, len(o.text)))
	if i == n-1 {
		end = len(o.text)
	}
	start := o.from
	var peak float32 = 0.01
	if sess.chunks != nil {
		peak = max(peak, sess.chunks.peak)
	}
	return sess.stream(ctx, q, s.IDs, scales, speed, sid, i == 0, func(p piperPart) error {
		pcm := p.pcm
		if sess.chunks == nil {
			normalizePeak(pcm)
		} else {
			peak = max(peak, rawPeak(pcm))
			g := 1 / peak
			for k, x := range pcm {
				pcm[k] = min(1, max(-1, x*g))
			}
		}
		span := tts.TextSpan{Start: o.from, End: end}
		if !p.last {
			text := o.text[start:end]
			runes := utf8.RuneCountInString(text)
			span.End = max(o.from, start+runeOffset(text, runes*p.to/p.total))
		} else if i < n-1 && o.silence > 0 {
			pcm = append(pcm, make([]float32, o.silence)...)
		}
		o.from = span.End
		c := tts.Chunk{PCM: pcm, SampleRate: o.rate, Index: o.index, Text: &span}
		o.index++
		return o.emit(c)
	})
}

func rawPeak(pcm []float32) float32 {
	var p float32
	for _, x := range pcm {
		p = max(p, float32(math.Abs(float64(x))))
	}
	return p
}

// runeOffset is where character n of text starts (len(text) past its end).
func runeOffset(text string, n int) int {
	for i := range text {
		if n == 0 {
			return i
		}
		n--
	}
	return len(text)
}
