package voxcpm

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// graphModes are how the step and the VAE decoder run (openGraphs).
type graphModes struct {
	step StepGraph
	// plainVAE runs every decode in its own shape (vocoder_batches: []), else in the buckets'.
	plainVAE bool
	// captureVAE captures the buckets' decodes as CUDA graphs (on CUDA only).
	captureVAE bool
	// float16VAE runs the VAE decoder converted to float16 (vocoder_precision: float16).
	float16VAE bool
	// perBatchVAE runs each bucket's decodes in a session of its own (vocoder_sessions: per_batch).
	perBatchVAE bool
}

// resolveModes resolves lm_cuda_graph, vocoder_batches, vocoder_cuda_graph, vocoder_sessions and
// vocoder_precision (checked by parseOptions) for a provider and a group of slots streams.
func resolveModes(o Options, cuda bool, slots int) graphModes {
	g := graphModes{step: stepGraphMode(o, cuda), plainVAE: o.plainVAE(), float16VAE: o.VocoderPrecision == engine.Float16}
	g.captureVAE = o.VocoderCUDAGraph == VAEGraphOn && cuda && !g.plainVAE
	perBatch := o.VocoderSessions == VAESessionsPerBatch ||
		o.VocoderSessions == "" && cuda && slots <= perBatchVAESlots
	g.perBatchVAE = perBatch && !g.plainVAE && !g.captureVAE
	return g
}

// perBatchVAESlots is the most streams for which vocoder_sessions defaults to per_batch on CUDA.
// On an H100 (80 GB) VoxCPM 1.5 served 128 streams per_batch at a 58 GiB peak, while at 256 a
// per-batch session failed to allocate at load; the shared session served 256 at 37.5 GiB
// (docs/benchmarks/2026-12-08-h100-voxcpm-vae-sessions/).
const perBatchVAESlots = 128

// stepGraphMode resolves lm_cuda_graph for the step graph on a provider: unset is on with CUDA
// and off on the CPU, and on runs as fixed on the CPU (the same shapes and bindings, with no
// graphs to capture).
func stepGraphMode(o Options, cuda bool) StepGraph {
	switch o.LMCUDAGraph {
	case StepGraphOn:
		if cuda {
			return StepGraphOn
		}
		return StepGraphFixed
	case StepGraphFixed:
		return StepGraphFixed
	case "":
		if cuda {
			return StepGraphOn
		}
	}
	return StepGraphOff
}

// stepGraphs run the step graph in fixed batch sizes. A CUDA graph replays the kernels ONNX
// Runtime launched for one shape at the addresses it saw, so each bucket has its own inputs and
// outputs on the device, bound once, and the caches are allocated once for the largest bucket and
// never move. A step of n streams runs the smallest bucket of at least n rows; its rows past n
// are free slots, which write a placeholder at their position 0. total_sequence_length is
// lm.max_positions at every step (read on the host when a graph is captured); the kernels take
// each row's length from seqlens_k. ONNX Runtime keeps a session's graphs per OS thread, so every
// call of the step session goes through one locked thread.
type stepGraphs struct {
	buckets []*stepBucket
	thread  *ort.Thread
}

// stepBucket is one batch size's tensors and bound run.
type stepBucket struct {
	B                              int
	mu, cond, noise, cfg, seqlens  *iobind.Tensor // device inputs
	patch, nextMu, nextStop        *iobind.Tensor // device outputs
	total                          *iobind.Tensor // host scalar
	cache                          []*iobind.Tensor
	run                            boundRun
	hMu, hCond, hNoise, hCfg, hSeq *iobind.Pinned
	hPatch, hNextMu, hNextStop     *iobind.Pinned
}

func (b *stepBucket) release() {
	b.run.run.Close()
	for _, p := range []*iobind.Pinned{b.hMu, b.hCond, b.hNoise, b.hCfg, b.hSeq, b.hPatch, b.hNextMu, b.hNextStop} {
		p.Free()
	}
	release([]*iobind.Tensor{b.mu, b.cond, b.noise, b.cfg, b.seqlens, b.patch, b.nextMu, b.nextStop, b.total})
	release(b.cache)
}

// newStepBucket makes bucket B's tensors over slots [0, B) and binds its run as graph id.
func (g *graphs) newStepBucket(id, B int) (_ *stepBucket, err error) {
	m, s := g.m, g.stepS
	b := &stepBucket{B: B}
	defer func() {
		if err != nil {
			b.release()
		}
	}()
	n, H, P, D := int64(B), int64(m.DiTHidden), int64(m.PatchSize), int64(m.FeatDim)
	for _, t := range []struct {
		dst   **iobind.Tensor
		host  **iobind.Pinned
		shape []int64
		elem  iobind.Elem
	}{
		{&b.mu, &b.hMu, []int64{n, H}, iobind.Float32},
		{&b.cond, &b.hCond, []int64{n, P, D}, iobind.Float32},
		{&b.noise, &b.hNoise, []int64{n, D, P}, iobind.Float32},
		{&b.cfg, &b.hCfg, []int64{n}, iobind.Float32},
		{&b.seqlens, &b.hSeq, []int64{n}, iobind.Int32},
		{&b.patch, &b.hPatch, []int64{n, P, D}, iobind.Float32},
		{&b.nextMu, &b.hNextMu, []int64{n, H}, iobind.Float32},
		{&b.nextStop, &b.hNextStop, []int64{n, 2}, iobind.Float32},
	} {
		if *t.dst, err = s.Alloc(t.shape, t.elem); err != nil {
			return nil, err
		}
		if *t.host, err = iobind.NewPinned(s.Placement(), (*t.dst).Bytes()); err != nil {
			return nil, err
		}
	}
	if b.total, err = iobind.Host([]int64{}, []int32{int32(m.LM.MaxPositions)}); err != nil {
		return nil, err
	}
	if b.cache, err = g.c.Views(0, B); err != nil {
		return nil, err
	}
	in := map[string]*iobind.Tensor{"mu": b.mu, "cond": b.cond, "noise": b.noise, "cfg_value": b.cfg,
		"seqlens_k": b.seqlens, "total_sequence_length": b.total}
	outs := g.bindCache(in, []iobind.Output{{Name: "patch", Into: b.patch}, {Name: "next_mu", Into: b.nextMu},
		{Name: "next_stop_logits", Into: b.nextStop}}, b.cache)
	if b.run, err = bind(s, in, outs, id); err != nil {
		return nil, err
	}
	return b, nil
}

// openStepGraphs makes every bucket up to the caches' slots and runs each three times: ONNX
// Runtime captures a graph on the third run with its ID. No stream is in the caches yet, so what
// the runs write there is never read.
func (g *graphs) openStepGraphs(buckets []int) error {
	for i, B := range buckets {
		b, err := g.newStepBucket(i+1, B)
		if err != nil {
			return fmt.Errorf("step graph of %d rows: %w", B, err)
		}
		g.sg.buckets = append(g.sg.buckets, b)
		for range 3 {
			if err := g.sg.thread.Do(b.run.run.Run); err != nil {
				return fmt.Errorf("step graph of %d rows: %w", B, err)
			}
		}
	}
	if g.stepS.Placement().CUDAGraph {
		// The first graph captured and the last, as the VAE decoder's (openVAE).
		for _, b := range []*stepBucket{g.sg.buckets[0], g.sg.buckets[len(g.sg.buckets)-1]} {
			if err := g.checkStepCapture(b); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStepCapture compares bucket b's captured step with an uncaptured one (checkCapture),
// every row attending to a few cache positions. What the runs write into the caches is never
// read: no stream is in them yet.
func (g *graphs) checkStepCapture(b *stepBucket) error {
	m, n := g.m, b.B
	mu := randomFloats(n*m.DiTHidden, 1, uint64(n))
	cond := randomFloats(n*m.patchFloats(), 1, uint64(n)+1)
	noise := randomFloats(n*m.patchFloats(), 1, uint64(n)+2)
	cfg, seqlens := make([]float32, n), make([]int32, n)
	for i := range n {
		cfg[i], seqlens[i] = 2, int32(min(1+i%8, m.LM.MaxPositions-1))
	}
	set := func() error {
		for _, u := range []struct {
			t *iobind.Tensor
			v any
		}{{b.mu, mu}, {b.cond, cond}, {b.noise, noise}, {b.cfg, cfg}, {b.seqlens, seqlens}} {
			if err := iobind.Upload(u.t, u.v); err != nil {
				return err
			}
		}
		return nil
	}
	return checkCapture(fmt.Sprintf("step, %d rows", n), g.sg.thread, g.stepS, b.run, set,
		compared{"patch", b.patch}, compared{"next_mu", b.nextMu}, compared{"next_stop_logits", b.nextStop})
}

// stepFixed is step run as the smallest bucket of at least in.n rows.
func (g *graphs) stepFixed(in *stepIn) (*stepOut, error) {
	m, s := g.m, g.stepS
	i := 0
	for i < len(g.sg.buckets) && g.sg.buckets[i].B < in.n {
		i++
	}
	if i == len(g.sg.buckets) {
		return nil, fmt.Errorf("step: %d streams are over the %d rows the step graphs were made for", in.n, g.sg.buckets[len(g.sg.buckets)-1].B)
	}
	b := g.sg.buckets[i]
	for _, c := range []struct {
		host *iobind.Pinned
		dev  *iobind.Tensor
		f32  []float32
		i32  []int32
	}{
		{b.hMu, b.mu, in.mu, nil}, {b.hCond, b.cond, in.cond, nil}, {b.hNoise, b.noise, in.noise, nil},
		{b.hCfg, b.cfg, in.cfg, nil}, {b.hSeq, b.seqlens, nil, in.seqlens},
	} {
		if c.i32 != nil {
			h := c.host.Int32s()
			clear(h[copy(h, c.i32):])
		} else {
			h := c.host.Float32s()
			clear(h[copy(h, c.f32):])
		}
		if err := s.Send(c.dev, c.host); err != nil {
			return nil, fmt.Errorf("step: %w", err)
		}
	}
	// On the step's stream after the copies, which the run waits for with its kernels.
	if err := g.sg.thread.Do(b.run.run.Run); err != nil {
		return nil, fmt.Errorf("step: %w", err)
	}
	for _, c := range []struct {
		host *iobind.Pinned
		dev  *iobind.Tensor
	}{{b.hPatch, b.patch}, {b.hNextMu, b.nextMu}, {b.hNextStop, b.nextStop}} {
		if err := s.Receive(c.host, c.dev); err != nil {
			return nil, fmt.Errorf("step: %w", err)
		}
	}
	if err := s.Wait(); err != nil {
		return nil, fmt.Errorf("step: %w", err)
	}
	n, PD, H := in.n, m.patchFloats(), m.DiTHidden
	out := &stepOut{
		patch:    append([]float32(nil), b.hPatch.Float32s()[:n*PD]...),
		nextMu:   append([]float32(nil), b.hNextMu.Float32s()[:n*H]...),
		nextStop: append([]float32(nil), b.hNextStop.Float32s()[:2*n]...),
	}
	return out, nil
}

func (sg *stepGraphs) close() {
	if sg == nil {
		return
	}
	for _, b := range sg.buckets {
		b.release()
	}
	sg.buckets = nil
}
