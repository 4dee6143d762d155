package voxcpm

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// boundRun is a bucket's run bound once (a CUDA graph's capture and replays) with what it was
// bound to, so that the same tensors can also run uncaptured.
type boundRun struct {
	run  *iobind.Bound
	in   map[string]*iobind.Tensor
	outs []iobind.Output
}

func bind(s *iobind.Session, in map[string]*iobind.Tensor, outs []iobind.Output, id int) (boundRun, error) {
	b, err := s.Bind(in, outs, id)
	return boundRun{run: b, in: in, outs: outs}, err
}

// errReplayDiffers is a capture check's finding that a CUDA graph's replay differs from an
// uncaptured run of the same inputs (checkCapture). The CUDA context is intact after it, unlike
// after a replay that faults.
var errReplayDiffers = errors.New("its CUDA graph's replay differs from an uncaptured run")

// compared is an output a capture check compares.
type compared struct {
	name string
	t    *iobind.Tensor
}

// checkCapture compares a replay of r's captured graph with an uncaptured run of the same
// tensors, each after set has filled the inputs with the same values, by outs. Some of ONNX
// Runtime's CUDA kernels pass arguments through host memory that only the capture fills (a Split
// of unequal pieces, a Concat of unequal inputs, a MatMul whose batch dimensions broadcast, which
// hands cuBLAS an array of pointers): their graphs replay garbage without an error,
// which the audio would otherwise be first to show (as NaN). th is the thread that captured.
func checkCapture(what string, th *ort.Thread, s *iobind.Session, r boundRun, set func() error, outs ...compared) error {
	got := make([][2][]float32, len(outs))
	for k := range 2 {
		if err := set(); err != nil {
			return fmt.Errorf("%s: capture check: %w", what, err)
		}
		run := r.run.Run
		if k == 1 {
			run = func() error {
				res, err := s.RunGraph(r.in, r.outs, iobind.NoGraph)
				release(res)
				return err
			}
		}
		if err := th.Do(run); err != nil {
			return fmt.Errorf("%s: capture check: %w", what, err)
		}
		for i, o := range outs {
			got[i][k] = make([]float32, o.t.Bytes()/4)
			if err := iobind.Download(got[i][k], o.t); err != nil {
				return fmt.Errorf("%s: capture check: %w", what, err)
			}
		}
	}
	var diffs []string
	bad := false
	for i, o := range outs {
		rel := engine.RelRMS(got[i][0], got[i][1])
		bad = bad || !(rel <= engine.ReplayTolerance)
		d := fmt.Sprintf("%s %.3g", o.name, rel)
		// Which side is not finite tells a replay's garbage from inputs that make any run NaN.
		if r, p := nonFinite(got[i][0]), nonFinite(got[i][1]); r+p > 0 {
			d += fmt.Sprintf(" (non-finite values: %d replayed, %d uncaptured)", r, p)
		}
		diffs = append(diffs, d)
	}
	if bad {
		return fmt.Errorf("%s: %w (relative rms: %s): the graph has a kernel that cannot be captured (ONNX Runtime's Split of unequal pieces, Concat of unequal inputs, or a MatMul whose batch dimensions broadcast, such as grouped attention with a key head broadcast over its query heads); export it again with scripts/voxcpm/export.py, or leave its CUDA graphs off (engine.lm_cuda_graph, engine.vocoder_cuda_graph)", what, errReplayDiffers, strings.Join(diffs, ", "))
	}
	return nil
}

// nonFinite counts x's NaN and infinite values.
func nonFinite(x []float32) int {
	n := 0
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			n++
		}
	}
	return n
}

// randomFloats are n standard normal values times scale, from a generator seeded by seed.
func randomFloats(n int, scale float64, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0x766f78))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64() * scale)
	}
	return out
}
