package voxcpm

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// caches are the device memory of the slots' LM caches: one tensor per layer and key/value of
// the base and the residual LM, [slots, kv_heads, max_positions, head_dim], which the prefill and
// step graphs write in place (docs/pipeline.md, "The shared cache"). The slots' VAE states are the
// decoder's (vaeGraphs).
type caches struct {
	m *Manifest
	// s allocates the tensors (every session of the engine runs on the same device).
	s    *iobind.Session
	elem iobind.Elem
	kv   []*iobind.Tensor // in cacheNames' order
	// slots allocated; most is the cap (max_inflight).
	slots, most int
	// fixed: allocated once for most slots and never moved (CUDA graphs hold the addresses).
	fixed bool
}

func newCaches(m *Manifest, s *iobind.Session, most int, fixed bool) (*caches, error) {
	c := &caches{m: m, s: s, elem: iobind.Float32, most: most, fixed: fixed}
	if m.DType == "float16" {
		c.elem = iobind.Float16
	}
	if fixed {
		if err := c.reserve(most); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// posBytes is one position of one head; slotBytes one slot of one cache tensor.
func (c *caches) posBytes() int64 { return int64(c.m.LM.HeadDim * c.elem.Size()) }
func (c *caches) slotBytes() int64 {
	return int64(c.m.LM.KVHeads) * int64(c.m.LM.MaxPositions) * c.posBytes()
}

// reserve makes room for slots [0, n): doubling from 8, up to most, so joins rarely reallocate.
// The slots' contents move with them.
func (c *caches) reserve(n int) error {
	if n <= c.slots {
		return nil
	}
	if n > c.most {
		return fmt.Errorf("%d streams need more than the %d slots (max_inflight)", n, c.most)
	}
	if c.fixed && c.slots > 0 {
		return fmt.Errorf("caches: the CUDA graphs' %d slots cannot grow", c.slots)
	}
	size := max(c.slots, min(8, c.most))
	for size < n {
		size *= 2
	}
	size = min(size, c.most)
	if c.fixed {
		size = c.most
	}
	past, _ := c.m.cacheNames()
	L := c.m.LM
	kv := make([]*iobind.Tensor, len(past))
	for i := range kv {
		t, err := c.s.Alloc([]int64{int64(size), int64(L.KVHeads), int64(L.MaxPositions), int64(L.HeadDim)}, c.elem)
		if err != nil {
			release(kv)
			return fmt.Errorf("caches for %d streams: %w", size, err)
		}
		kv[i] = t
	}
	if c.slots > 0 {
		copies := make([]iobind.Copy, 0, len(kv))
		for i, t := range c.kv {
			copies = append(copies, iobind.Copy{Dst: kv[i], Src: t, Width: t.Bytes(), Height: 1})
		}
		if err := iobind.Copies(copies); err != nil {
			release(kv)
			return fmt.Errorf("caches for %d streams: %w", size, err)
		}
	}
	c.release()
	c.kv, c.slots = kv, size
	return nil
}

// views are the cache tensors over slots [from, from+n), in cacheNames' order; the caller
// releases them.
func (c *caches) views(from, n int) ([]*iobind.Tensor, error) {
	L := c.m.LM
	shape := []int64{int64(n), int64(L.KVHeads), int64(L.MaxPositions), int64(L.HeadDim)}
	out := make([]*iobind.Tensor, len(c.kv))
	for i, t := range c.kv {
		v, err := c.s.View(t, int64(from)*c.slotBytes(), shape)
		if err != nil {
			release(out)
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// slotMove is one stream moving down from slot from to slot to, with positions cache positions.
type slotMove struct{ from, to, positions int }

// move copies each stream's cache positions (every head of every layer of both LMs) into its
// new slot, all before one wait.
func (c *caches) move(moves []slotMove) error {
	if len(moves) == 0 {
		return nil
	}
	H := int64(c.m.LM.KVHeads)
	pitch := int64(c.m.LM.MaxPositions) * c.posBytes()
	var copies []iobind.Copy
	for _, mv := range moves {
		for _, t := range c.kv {
			copies = append(copies, iobind.Copy{Dst: t, DstOff: int64(mv.to) * c.slotBytes(), DstPitch: pitch,
				Src: t, SrcOff: int64(mv.from) * c.slotBytes(), SrcPitch: pitch,
				Width: int64(mv.positions) * c.posBytes(), Height: H})
		}
	}
	if err := iobind.Copies(copies); err != nil {
		return fmt.Errorf("caches: move: %w", err)
	}
	return nil
}

func (c *caches) release() {
	release(c.kv)
	c.kv, c.slots = nil, 0
}

// release frees tensors; nil ones are skipped.
func release(ts []*iobind.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}
