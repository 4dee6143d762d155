package iobind

import "fmt"

// SlotCache is an LM's key/value cache in device memory, one tensor per layer and key or value,
// each [slots, heads, positions, head_dim], which the LM's graphs write in place
// (GroupQueryAttention with past and present bound to the same memory). A stream owns a slot and
// its tokens sit at positions 0..n-1 of it, so a step copies nothing; a step runs over slots
// 0..top, so streams are moved down into free slots (Move) when the top ones empty. The staged
// family's shared-cache LM and VoxCPM's two LMs keep their caches in one.
type SlotCache struct {
	s    *Session // allocates the tensors, on the device every session of the engine runs on
	elem Elem
	// heads, positions and dim are a slot's shape in each tensor.
	heads, positions, dim int
	n                     int       // tensors
	kv                    []*Tensor // nil until the first Reserve
	// slots allocated; most is the cap, 0 for none.
	slots, most int
	// fixed: allocated once for most slots and never moved (CUDA graphs hold the addresses).
	fixed bool
}

// SlotShape is what a SlotCache holds: tensors of [slots, Heads, Positions, Dim] of Elem.
type SlotShape struct {
	Tensors, Heads, Positions, Dim int
	Elem                           Elem
}

// NewSlotCache makes a cache of shape on s's device for up to most slots (0: no cap). A fixed
// cache is allocated now, for most slots, and never moves: CUDA graphs captured over it hold its
// addresses. Otherwise Reserve allocates as streams come.
func NewSlotCache(s *Session, shape SlotShape, most int, fixed bool) (*SlotCache, error) {
	c := &SlotCache{s: s, elem: shape.Elem, heads: shape.Heads, positions: shape.Positions, dim: shape.Dim,
		n: shape.Tensors, most: most, fixed: fixed}
	if fixed {
		if most <= 0 {
			return nil, fmt.Errorf("slot cache: a fixed cache needs a number of slots, not %d", most)
		}
		if err := c.Reserve(most); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// firstSlots is the slots a growing cache allocates first; it doubles from there.
const firstSlots = 8

// Reserve makes room for slots [0, n), doubling from firstSlots (up to the cap) so that joins
// rarely reallocate. The slots' contents move with them. A fixed cache cannot grow.
func (c *SlotCache) Reserve(n int) error {
	if n <= c.slots {
		return nil
	}
	if c.fixed && c.slots > 0 {
		return fmt.Errorf("%d streams need more than the %d slots the CUDA graphs were made for", n, c.slots)
	}
	if c.most > 0 && n > c.most {
		return fmt.Errorf("%d streams need more than the cache's %d slots", n, c.most)
	}
	size := max(c.slots, firstSlots)
	if c.most > 0 {
		size = max(c.slots, min(firstSlots, c.most))
	}
	for size < n {
		size *= 2
	}
	if c.most > 0 {
		size = min(size, c.most)
	}
	if c.fixed {
		size = c.most
	}
	kv := make([]*Tensor, c.n)
	for i := range kv {
		t, err := c.s.Alloc([]int64{int64(size), int64(c.heads), int64(c.positions), int64(c.dim)}, c.elem)
		if err != nil {
			releaseAll(kv)
			return fmt.Errorf("cache for %d streams: %w", size, err)
		}
		kv[i] = t
	}
	if c.slots > 0 {
		copies := make([]Copy, 0, len(kv))
		for i, t := range c.kv {
			copies = append(copies, Copy{Dst: kv[i], Src: t, Width: t.Bytes(), Height: 1})
		}
		if err := Copies(copies); err != nil {
			releaseAll(kv)
			return fmt.Errorf("cache for %d streams: %w", size, err)
		}
	}
	c.Release()
	c.kv, c.slots = kv, size
	return nil
}

// Slots is the number of slots allocated.
func (c *SlotCache) Slots() int { return c.slots }

// Tensors are the whole cache's tensors, in the order the shape's tensors were named; nil before
// the first Reserve.
func (c *SlotCache) Tensors() []*Tensor { return c.kv }

// PosBytes is one position of one head; SlotBytes one slot of one tensor.
func (c *SlotCache) PosBytes() int64 { return int64(c.dim * c.elem.Size()) }
func (c *SlotCache) SlotBytes() int64 {
	return int64(c.heads) * int64(c.positions) * c.PosBytes()
}

// Views are the tensors over slots [from, from+n), in order; the caller releases them.
func (c *SlotCache) Views(from, n int) ([]*Tensor, error) {
	shape := []int64{int64(n), int64(c.heads), int64(c.positions), int64(c.dim)}
	out := make([]*Tensor, len(c.kv))
	for i, t := range c.kv {
		v, err := c.s.View(t, int64(from)*c.SlotBytes(), shape)
		if err != nil {
			releaseAll(out)
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// SlotMove is one stream moving from slot From to slot To, with its first Positions positions.
type SlotMove struct{ From, To, Positions int }

// Move copies each stream's positions (every head of every tensor) into its new slot, all before
// one wait.
func (c *SlotCache) Move(moves []SlotMove) error {
	if len(moves) == 0 {
		return nil
	}
	pitch := int64(c.positions) * c.PosBytes()
	var copies []Copy
	for _, mv := range moves {
		for _, t := range c.kv {
			copies = append(copies, Copy{Dst: t, DstOff: int64(mv.To) * c.SlotBytes(), DstPitch: pitch,
				Src: t, SrcOff: int64(mv.From) * c.SlotBytes(), SrcPitch: pitch,
				Width: int64(mv.Positions) * c.PosBytes(), Height: int64(c.heads)})
		}
	}
	if err := Copies(copies); err != nil {
		return fmt.Errorf("cache: move: %w", err)
	}
	return nil
}

// Release frees the tensors; a later Reserve allocates them again.
func (c *SlotCache) Release() {
	releaseAll(c.kv)
	c.kv, c.slots = nil, 0
}

// releaseAll releases tensors; nil ones are skipped.
func releaseAll(ts []*Tensor) {
	for _, t := range ts {
		t.Release()
	}
}
