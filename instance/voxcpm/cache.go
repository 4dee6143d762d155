package voxcpm

import (
	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// newCaches makes the device memory of the slots' LM caches for at most most streams: one tensor
// per layer and key/value of the base and the residual LM, [slots, kv_heads, max_positions,
// head_dim], in cacheNames' order, which the prefill and step graphs write in place
// (docs/pipeline.md, "The shared cache"). A fixed cache is allocated once for most slots (CUDA
// graphs hold its addresses). The slots' VAE states are the decoder's (vaeGraphs).
func newCaches(m *Manifest, s *iobind.Session, most int, fixed bool) (*iobind.SlotCache, error) {
	past, _ := m.cacheNames()
	elem := iobind.Float32
	if m.DType == "float16" {
		elem = iobind.Float16
	}
	return iobind.NewSlotCache(s, iobind.SlotShape{Tensors: len(past), Heads: m.LM.KVHeads,
		Positions: m.LM.MaxPositions, Dim: m.LM.HeadDim, Elem: elem}, most, fixed)
}

// release frees tensors; nil ones are skipped.
func release(ts []*iobind.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}

// slotMove is one stream moving down from one slot to another with its cache positions (the
// caches' and VAE states' Move).
type slotMove = iobind.SlotMove
