package voxcpm

import (
	"fmt"
	"log/slog"
	"maps"
	"os"

	"github.com/voxmux/voxmux/instance/onnxedit"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// vaeGraphs run the streaming VAE decoder (vae_decoder.onnx) over the slots' states.
//
// A decode runs in the step's bucket batch sizes (engine.Buckets): the smallest bucket of at least
// the n rows a step ran, its rows past n free slots fed zero latents, their state rows scratch
// (a stream that joins a slot primes its row first). Each bucket has its own latent and audio
// tensors and two runs bound once, one per direction of the state buffers, each warmed at load
// and, with vocoder_cuda_graph on, captured as a CUDA graph (the first and last bucket's replays
// checked against uncaptured runs: checkCapture). Why fixed shapes: ONNX Runtime 1.29 plans
// a session's cuDNN convolutions again whenever its input shape changes (docs/operations.md), and
// a decode of exactly n rows changed shape nearly every step as streams joined and left. Without
// graphs, a change of bucket in one session still plans again, cheaply with cuDNN's DEFAULT
// search; replays of captured graphs never do, nor does a bucket in a session of its own
// (vocoder_sessions per_batch), which can then afford the exhaustive search.
//
// The states are two buffers of [rows, state_size], states[cur] holding every slot's state now:
// a decode reads rows [0, B) of states[cur] and writes rows [0, B) of the other, which then
// becomes cur. A graph's output may not overwrite its input in place (a convolution's state_out
// is written while its state is still read), hence the two; a graph alternates between them as
// two captured graphs, each of fixed addresses. The buffers are allocated once, for every slot,
// and never move.
type vaeGraphs struct {
	m      *Manifest
	s      *iobind.Session
	states [2]*iobind.Tensor
	cur    int
	rows   int
	// buckets are the fixed shapes, rising; nil: every decode runs its own shape
	// (engine.vocoder_batches: []), the way to compare the two.
	buckets []*vaeBucket
	// thread runs every call of the session when its runs are captured: ONNX Runtime keeps a
	// session's graphs per OS thread. nil: the caller's thread.
	thread *ort.Thread
}

// vaeBucket is one batch size's tensors and bound runs.
type vaeBucket struct {
	B int
	// s is the session its runs are bound to: the decoder's own, or with vocoder_sessions
	// per_batch one of the bucket's own (own), which sees only this bucket's shape.
	s               *iobind.Session
	own             bool
	latent, audio   *iobind.Tensor // on the device
	hLatent, hAudio *iobind.Pinned
	views           [2]*iobind.Tensor // rows [0, B) of each state buffer
	// run[c] reads states[c] and writes states[1-c].
	run [2]boundRun
}

func (b *vaeBucket) release() {
	for _, r := range b.run {
		r.run.Close()
	}
	b.hLatent.Free()
	b.hAudio.Free()
	release([]*iobind.Tensor{b.latent, b.audio, b.views[0], b.views[1]})
	if b.own && b.s != nil {
		b.s.Close()
	}
}

// vaeFloat16Ops are the ops of the VAE decoder (the export's residual units of padded, dilated
// convolutions with snake activations: x + 1/a·sin²(a·x), through Pow and Reciprocal), each with
// a float16 kernel in ONNX Runtime's CUDA provider. A decoder with another op is refused at load,
// naming it, rather than converted untried.
var vaeFloat16Ops = map[string]bool{
	"Pad": true, "Mul": true, "Add": true, "Sin": true, "Pow": true, "Reciprocal": true,
	"Conv": true, "ConvTranspose": true, "Slice": true, "Gather": true, "Reshape": true,
	"Flatten": true, "Transpose": true, "Tanh": true, "Identity": true, "Constant": true,
}

// vaeFloat16 is the VAE decoder at path converted to float16 (vocoder_precision: float16): its
// latent, state, audio and state_out stay float32, so the engine binds them as in float32.
func vaeFloat16(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	g, st, err := onnxedit.Float16(data, func(op string) bool { return vaeFloat16Ops[op] })
	if err != nil {
		return nil, fmt.Errorf("%s: vocoder_precision float16: %w", path, err)
	}
	if st.Saturated > 0 {
		slog.Warn("voxcpm's VAE decoder has weights beyond float16's range; they are set to ±65504", "path", path, "weights", st.Saturated, "of", st.Weights, "largest", st.Largest)
	}
	return g, nil
}

// openVAE opens the decoder on rt's device with states for rows slots and, unless modes.plainVAE,
// a bucket for each of buckets (rising, the last at most rows); modes.captureVAE: the buckets'
// runs are captured; modes.perBatchVAE: each bucket after the first (one row, which priming
// shares) runs in a session of its own, every session planned by cuDNN's exhaustive search at
// load; modes.float16VAE: the decoder computes in float16.
func openVAE(m *Manifest, rt *ort.Runtime, rows int, buckets []int, modes graphModes) (_ *vaeGraphs, err error) {
	plain, graphs := modes.plainVAE, modes.captureVAE
	v := &vaeGraphs{m: m, rows: rows}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	// Uncaptured, the decoder takes the vocoder's CUDA options (prefer_nhwc: channels-last
	// convolutions, which ran the staged family's vocoder 14-19% faster), and
	// cudnn_conv_algo_search stays the runtime's (DEFAULT unless provider_options say otherwise): EXHAUSTIVE plans for about a
	// second and a half per shape, paid again by every change of bucket outside graphs, and
	// HEURISTIC failed to initialise for a dilated convolution (cuDNN 9.14), which the VAE's
	// residual units are.
	p := rt.Placement()
	p.CUDAGraph = p.CUDA && graphs && !plain
	p.ProviderOptions = maps.Clone(p.ProviderOptions)
	perBatch := modes.perBatchVAE // never with plainVAE or captureVAE (resolveModes)
	if perBatch {
		// Each session sees one shape, so the exhaustive search (about 1.5 s a shape) runs once
		// per session, at load, with channels-last convolutions as uncaptured.
		maps.Copy(p.ProviderOptions, rt.VocoderCUDAOptions())
		maps.Copy(p.ProviderOptions, rt.FixedShapeCUDAOptions())
	} else if p.CUDAGraph {
		// Captured, each bucket's convolutions are planned once, at load: the exhaustive search
		// halved the decoder's runs on an H100 (docs/benchmarks/2026-11-27-h100-voxcpm/), and
		// uncaptured it would search again at every change of bucket. Channels-last is left out:
		// with it the one-row bucket's replay differed from a plain run (relative rms 0.82, H100,
		// ONNX Runtime 1.29), without it the replays equal plain runs.
		maps.Copy(p.ProviderOptions, rt.FixedShapeCUDAOptions())
	} else {
		maps.Copy(p.ProviderOptions, rt.VocoderCUDAOptions())
	}
	p.Profile = rt.ProfilePrefix("voxcpm_vae_decoder")
	if p.CUDAGraph {
		v.thread = ort.NewThread()
	}
	path := m.Path(m.Graphs.VAEDecoder)
	var f16 []byte
	if modes.float16VAE {
		if f16, err = vaeFloat16(path); err != nil {
			return nil, fmt.Errorf("graphs.vae_decoder: %w", err)
		}
		if !p.CUDA {
			slog.Warn("vocoder_precision float16 on the CPU provider: ONNX Runtime computes the VAE decoder's float16 ops through casts to float32, slower than float32", "path", path)
		}
	}
	open := func(p iobind.Placement) (s *iobind.Session, err error) {
		err = v.thread.Do(func() (err error) {
			if f16 != nil {
				s, err = iobind.OpenData(path+" (float16)", f16, p)
			} else {
				s, err = iobind.Open(path, p)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("graphs.vae_decoder: %w", err)
		}
		return s, nil
	}
	if v.s, err = open(p); err != nil {
		return nil, err
	}
	for i := range v.states {
		if v.states[i], err = v.s.Alloc([]int64{int64(rows), int64(m.VAE.StateSize)}, iobind.Float32); err != nil {
			return nil, fmt.Errorf("vae_decoder: states of %d streams: %w", rows, err)
		}
	}
	if plain {
		return v, nil
	}
	for i, B := range buckets {
		s, own := v.s, perBatch && i > 0
		if own {
			q := p
			q.Profile = rt.ProfilePrefix(fmt.Sprintf("voxcpm_vae_decoder_%d", B))
			if s, err = open(q); err != nil {
				return nil, fmt.Errorf("vae_decoder, %d rows: %w", B, err)
			}
		}
		b, err := v.newBucket(s, own, 2*i+1, B)
		if err != nil {
			return nil, fmt.Errorf("vae_decoder, %d rows: %w", B, err)
		}
		v.buckets = append(v.buckets, b)
		// Three runs each: ONNX Runtime captures a graph on a run with its ID after two ordinary
		// ones. No stream is in the states yet: what the runs write there is never read.
		for _, r := range b.run {
			for range 3 {
				if err := v.thread.Do(r.run.Run); err != nil {
					return nil, fmt.Errorf("vae_decoder, %d rows: %w", B, err)
				}
			}
		}
	}
	if p.CUDAGraph {
		// The first graph captured and the last: a kernel unsafe to capture shows up after later
		// runs have reused what its replay reads. The last bucket first: the uncaptured runs then
		// end in one row's shape, the shape a voice's priming runs in, so that priming plans
		// nothing again.
		for _, b := range []*vaeBucket{v.buckets[len(v.buckets)-1], v.buckets[0]} {
			if err := v.checkCapture(b); err != nil {
				return nil, err
			}
		}
	}
	return v, nil
}

// checkCapture compares bucket b's captured decode with an uncaptured one (checkCapture). What
// the runs write into the states is never read: no stream is in them yet.
func (v *vaeGraphs) checkCapture(b *vaeBucket) error {
	latent := randomFloats(b.B*v.m.patchFloats(), 1, uint64(b.B))
	state := randomFloats(b.B*v.m.VAE.StateSize, 0.1, uint64(b.B)+1)
	set := func() error {
		if err := iobind.Upload(b.latent, latent); err != nil {
			return err
		}
		return iobind.Upload(b.views[0], state)
	}
	return checkCapture(fmt.Sprintf("vae_decoder, %d rows", b.B), v.thread, v.s, b.run[0], set,
		compared{"audio", b.audio}, compared{"state_out", b.views[1]})
}

// newBucket makes bucket B's tensors and binds its runs, on session s (the bucket's own when own:
// released with it), as graphs id and id+1.
func (v *vaeGraphs) newBucket(s *iobind.Session, own bool, id, B int) (_ *vaeBucket, err error) {
	m := v.m
	b := &vaeBucket{B: B, s: s, own: own}
	defer func() {
		if err != nil {
			b.release()
		}
	}()
	if b.latent, err = s.Alloc([]int64{int64(B), int64(m.PatchSize), int64(m.FeatDim)}, iobind.Float32); err != nil {
		return nil, err
	}
	if b.audio, err = s.Alloc([]int64{int64(B), int64(m.patchSamples())}, iobind.Float32); err != nil {
		return nil, err
	}
	if b.hLatent, err = iobind.NewPinned(s.Placement(), b.latent.Bytes()); err != nil {
		return nil, err
	}
	if b.hAudio, err = iobind.NewPinned(s.Placement(), b.audio.Bytes()); err != nil {
		return nil, err
	}
	for c := range b.views {
		if b.views[c], err = v.stateView(c, 0, B); err != nil {
			return nil, err
		}
	}
	for c := range b.run {
		in := map[string]*iobind.Tensor{"latent": b.latent, "state": b.views[c]}
		outs := []iobind.Output{{Name: "audio", Into: b.audio}, {Name: "state_out", Into: b.views[1-c]}}
		if b.run[c], err = bind(s, in, outs, id+c); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (v *vaeGraphs) stateBytes() int64 { return int64(v.m.VAE.StateSize) * 4 }

// stateView is rows [from, from+n) of state buffer c.
func (v *vaeGraphs) stateView(c, from, n int) (*iobind.Tensor, error) {
	return v.s.View(v.states[c], int64(from)*v.stateBytes(), []int64{int64(n), int64(v.m.VAE.StateSize)})
}

// decode runs the decoder over slots [0, n), their latents patch ([n][patch_size][feat_dim]),
// and returns the audio, [n][patch_size·chunk_size]; the slice is the decoder's until the next
// decode.
func (v *vaeGraphs) decode(n int, patch []float32) ([]float32, error) {
	if len(patch) != n*v.m.patchFloats() {
		return nil, fmt.Errorf("vae_decoder: %d latent values for %d streams", len(patch), n)
	}
	if v.buckets == nil {
		return v.decodePlain(n, patch)
	}
	i := 0
	for i < len(v.buckets) && v.buckets[i].B < n {
		i++
	}
	if i == len(v.buckets) {
		return nil, fmt.Errorf("vae_decoder: %d streams are over the %d rows its shapes were made for", n, v.buckets[len(v.buckets)-1].B)
	}
	b := v.buckets[i]
	s := b.s
	h := b.hLatent.Float32s()
	clear(h[copy(h, patch):])
	if err := s.Send(b.latent, b.hLatent); err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	// On the session's stream after the copy, which the run waits for with its kernels.
	if err := v.thread.Do(b.run[v.cur].run.Run); err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	if err := s.Receive(b.hAudio, b.audio); err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	if err := s.Wait(); err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	v.cur = 1 - v.cur
	return b.hAudio.Float32s()[:n*v.m.patchSamples()], nil
}

// decodePlain is decode in a shape of exactly n rows.
func (v *vaeGraphs) decodePlain(n int, patch []float32) ([]float32, error) {
	m := v.m
	state, err := v.stateView(v.cur, 0, n)
	if err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	defer state.Release()
	next, err := v.stateView(1-v.cur, 0, n)
	if err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	defer next.Release()
	latent, err := iobind.Host([]int64{int64(n), int64(m.PatchSize), int64(m.FeatDim)}, patch)
	if err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	defer latent.Release()
	res, err := v.run(map[string]*iobind.Tensor{"latent": latent, "state": state},
		[]iobind.Output{{Name: "audio", Host: true}, {Name: "state_out", Into: next}})
	if err != nil {
		return nil, fmt.Errorf("vae_decoder: %w", err)
	}
	defer release(res)
	v.cur = 1 - v.cur
	return floats(res[0], n*m.patchSamples(), "vae_decoder: audio")
}

// prime sets slot s's state: zeros, or (context: whole patches) the state after decoding
// context, its audio dropped. The context runs a patch at a time, in the shape of one-row
// decodes (bucket 1's, already planned), its state carried on the host; decoding in pieces
// equals decoding at once (docs/voxcpm.md). It runs uncaptured.
func (v *vaeGraphs) prime(s int, context []float32) error {
	row, err := v.stateView(v.cur, s, 1)
	if err != nil {
		return fmt.Errorf("vae_decoder: %w", err)
	}
	defer row.Release()
	if len(context) == 0 {
		if err := iobind.Zero(row); err != nil {
			return fmt.Errorf("vae_decoder: zero state: %w", err)
		}
		return nil
	}
	m := v.m
	PD := m.patchFloats()
	if len(context)%PD != 0 {
		return fmt.Errorf("vae_decoder: a context of %d values is not whole patches", len(context))
	}
	state := make([]float32, m.VAE.StateSize)
	err = v.thread.Do(func() error {
		for at := 0; at < len(context); at += PD {
			var held []*iobind.Tensor
			in := map[string]*iobind.Tensor{}
			err := hostTensors(in, &held,
				hostInput{"latent", []int64{1, int64(m.PatchSize), int64(m.FeatDim)}, context[at : at+PD]},
				hostInput{"state", []int64{1, int64(m.VAE.StateSize)}, state})
			if err != nil {
				release(held)
				return err
			}
			res, err := v.run(in, []iobind.Output{{Name: "audio", Host: true}, {Name: "state_out", Host: true}})
			release(held)
			if err != nil {
				return err
			}
			next, err := floats(res[1], m.VAE.StateSize, "state_out")
			release(res)
			if err != nil {
				return err
			}
			state = next
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("vae_decoder: prime: %w", err)
	}
	if err := iobind.Upload(row, state); err != nil {
		return fmt.Errorf("vae_decoder: prime: %w", err)
	}
	return nil
}

// run is an ordinary run of the session: with graphs, one that neither captures nor replays.
func (v *vaeGraphs) run(in map[string]*iobind.Tensor, outs []iobind.Output) ([]*iobind.Tensor, error) {
	if v.thread != nil {
		return v.s.RunGraph(in, outs, iobind.NoGraph)
	}
	return v.s.Run(in, outs)
}

// move copies each moving stream's state into its new slot.
func (v *vaeGraphs) move(moves []slotMove) error {
	if len(moves) == 0 {
		return nil
	}
	st := v.states[v.cur]
	copies := make([]iobind.Copy, 0, len(moves))
	for _, mv := range moves {
		copies = append(copies, iobind.Copy{Dst: st, DstOff: int64(mv.To) * v.stateBytes(),
			Src: st, SrcOff: int64(mv.From) * v.stateBytes(), Width: v.stateBytes(), Height: 1})
	}
	if err := iobind.Copies(copies); err != nil {
		return fmt.Errorf("vae_decoder: move states: %w", err)
	}
	return nil
}

func (v *vaeGraphs) close() {
	if v == nil {
		return
	}
	for _, b := range v.buckets {
		b.release()
	}
	v.buckets = nil
	release(v.states[:])
	v.states = [2]*iobind.Tensor{}
	if v.s != nil {
		v.thread.Do(func() error { v.s.Close(); return nil })
		v.s = nil
	}
	v.thread.Close()
	v.thread = nil
}
