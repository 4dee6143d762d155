package voxcpm

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/voxmux/voxmux/instance/ort"
)

// ONNX element types of the contract's tensors beside ort's.
const onnxInt32 = 6

// cacheNames are the caches' input (past) and output (present) names, in one order: the base LM's
// key and value of each layer, then the residual LM's.
func (m *Manifest) cacheNames() (past, present []string) {
	for n := range m.LM.Layers {
		past = append(past, fmt.Sprintf("past_key.%d", n), fmt.Sprintf("past_value.%d", n))
		present = append(present, fmt.Sprintf("present_key.%d", n), fmt.Sprintf("present_value.%d", n))
	}
	for n := range m.LM.ResidualLayers {
		past = append(past, fmt.Sprintf("res_past_key.%d", n), fmt.Sprintf("res_past_value.%d", n))
		present = append(present, fmt.Sprintf("res_present_key.%d", n), fmt.Sprintf("res_present_value.%d", n))
	}
	return past, present
}

// cacheElem is the caches' ONNX element type.
func (m *Manifest) cacheElem() int32 {
	if m.DType == "float16" {
		return ort.ONNXFloat16
	}
	return ort.ONNXFloat
}

// graphIO is a graph's contract: its inputs and outputs by name, each with its element type.
type graphIO struct {
	key     string // the manifest's key
	file    string
	in, out map[string]int32
}

// contract lists every graph's inputs and outputs (docs/voxcpm.md).
func (m *Manifest) contract() []graphIO {
	f32, i64, i32 := int32(ort.ONNXFloat), int32(ort.ONNXInt64), int32(onnxInt32)
	withCache := func(in, out map[string]int32) {
		past, present := m.cacheNames()
		for i := range past {
			in[past[i]] = m.cacheElem()
			out[present[i]] = m.cacheElem()
		}
		in["seqlens_k"] = i32
		in["total_sequence_length"] = i32
	}
	prefill := graphIO{key: "graphs.prefill", file: m.Graphs.Prefill,
		in:  map[string]int32{"text_ids": i64, "text_mask": f32, "feat": f32, "feat_mask": f32},
		out: map[string]int32{"mu": f32, "stop_logits": f32}}
	withCache(prefill.in, prefill.out)
	step := graphIO{key: "graphs.step", file: m.Graphs.Step,
		in:  map[string]int32{"mu": f32, "cond": f32, "noise": f32, "cfg_value": f32},
		out: map[string]int32{"patch": f32, "next_mu": f32, "next_stop_logits": f32}}
	withCache(step.in, step.out)
	out := []graphIO{prefill, step,
		{key: "graphs.vae_decoder", file: m.Graphs.VAEDecoder,
			in:  map[string]int32{"latent": f32, "state": f32},
			out: map[string]int32{"audio": f32, "state_out": f32}},
	}
	if m.Graphs.VAEEncoder != "" {
		out = append(out, graphIO{key: "graphs.vae_encoder", file: m.Graphs.VAEEncoder,
			in: map[string]int32{"audio": f32}, out: map[string]int32{"latent": f32}})
	}
	return out
}

// checkGraphs reads each graph's inputs and outputs from its file and checks them against the
// contract: every input it names, of its type, and no other input (nothing would feed it);
// every output the engine reads.
func (m *Manifest) checkGraphs() error {
	var errs []error
	for _, g := range m.contract() {
		path := m.Path(g.file)
		ins, outs, err := ort.ReadGraphIO(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", g.key, path, err))
			continue
		}
		errs = append(errs, checkIO(g.key, path, "input", g.in, ins, true)...)
		errs = append(errs, checkIO(g.key, path, "output", g.out, outs, false)...)
	}
	return errors.Join(errs...)
}

// checkIO compares a graph's declared tensors with the contract's; exact: no other tensor may be
// declared.
func checkIO(key, path, what string, want map[string]int32, got []ort.TensorInfo, exact bool) []error {
	var errs []error
	have := map[string]ort.TensorInfo{}
	for _, t := range got {
		have[t.Name] = t
		if _, ok := want[t.Name]; !ok && exact {
			errs = append(errs, fmt.Errorf("%s: %s has %s %q, which the contract does not name", key, path, what, t.Name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		t, ok := have[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: %s has no %s %q", key, path, what, name))
		case t.ElemType != 0 && t.ElemType != want[name]:
			errs = append(errs, fmt.Errorf("%s: %s: %s %q is %s, want %s", key, path, what, name, ort.ElemTypeName(t.ElemType), ort.ElemTypeName(want[name])))
		}
	}
	return errs
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
