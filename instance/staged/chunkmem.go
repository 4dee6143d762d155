package staged

import (
	"fmt"
	"slices"
)

// The chunk-causal flow's memory admission (flowMemory, docs/cosyvoice3.md, "Memory"): the flow
// loop reserves what a batch will allocate before it starts; a batch that does not fit is cut to
// the items that do, and where none does its items wait until memory frees. When nothing runs
// and the head of the queue still does not fit, room is made: first voices in the prompt cache
// that no stream reads, then the kept frames of the streams that started last (they compute them
// again from their voice's on when their next chunk runs: exact, as one run over many chunks
// computes what chunk-by-chunk runs do). Only a chunk that alone needs more than the whole bound
// fails.

func (p *Pipeline) newChunkKV() *chunkKV { return &chunkKV{} }

// chunkFrameBytes is what one kept frame takes at one Euler step, in the graph's dtype.
func (m *Manifest) chunkFrameBytes() int64 {
	elem := int64(4)
	if m.DType == "float16" {
		elem = 2
	}
	return int64(m.Flow.KVLayers*4*m.Flow.KVWidth) * elem
}

// chunkVoiceFrames is how many of s's voice's frames its prompt cache entry keeps (0: none).
func (p *Pipeline) chunkVoiceFrames(s *stream) int {
	if s.voice == nil {
		return 0
	}
	return p.m.voiceFrames(len(s.voice.SpeechTokens) * p.m.Flow.FramesPerToken)
}

// chunkPrepare gives it's stream its kept-frame state and, where the prompt cache has its voice,
// the voice's entry now: held by the stream, it cannot leave the cache while the item waits.
func (p *Pipeline) chunkPrepare(it *flowItem) {
	s := it.s
	if s.kv == nil {
		s.kv = p.newChunkKV()
	}
	if st := s.kv; st.base == nil && st.n == 0 && p.chunkVoiceFrames(s) > 0 {
		if ent := p.prompts.lookup(voiceKey(s.voice)); ent != nil {
			st.base, st.ctx = ent, ent.kv.ctx
		}
	}
}

// chunkNeed is the most device memory a batch of prepared items allocates (flowChunks.run): the
// frames each keeps and their context samples, a voice computed for the cache, and the batch's
// padded past and present, inputs and working memory (chunkRunBytes).
func (p *Pipeline) chunkNeed(items []*flowItem) int64 {
	f := p.m.Flow
	fb, cb, K := p.m.chunkFrameBytes(), p.m.chunkCtxBytes(), int64(f.Steps)
	var need int64
	P, N := 1, 0
	voices := map[[32]byte]bool{}
	for _, it := range items {
		st := it.s.kv
		done := st.done()
		if st.base == nil && st.n == 0 {
			if V := p.chunkVoiceFrames(it.s); V > 0 {
				done = V
				if key := voiceKey(it.s.voice); !voices[key] {
					voices[key] = true
					need += K*int64(V)*fb + cb + p.m.chunkRunBytes(1, 1, V)
				}
			}
		}
		from, keep := p.m.chunkPlan(done, it.chunk, it.last)
		if keep > 0 {
			need += K*int64(keep)*fb + cb
		}
		P, N = max(P, from), max(N, it.chunk.end-from)
	}
	return need + p.m.chunkRunBytes(len(items), P, N)
}

// chunkMemory is the flow loop's side of flowMemory: the streams holding kept frames of their
// own, in the order they first kept some.
type chunkMemory struct {
	e    *Engine
	mem  *flowMemory
	kept []*stream
}

// admit cuts take to the items whose memory can be reserved now; nil when none fits.
func (c *chunkMemory) admit(take, rest []*flowItem) ([]*flowItem, []*flowItem, *flowGrant) {
	for _, it := range take {
		c.e.p.chunkPrepare(it)
	}
	for k := len(take); k > 0; k-- {
		if g, ok := c.mem.reserve(c.e.p.chunkNeed(take[:k])); ok {
			return take[:k:k], slices.Concat(take[k:], rest), g
		}
	}
	return nil, slices.Concat(take, rest), nil
}

// makeRoom frees memory for head, the first item waiting, while no batch runs: a voice no stream
// reads, else the kept frames of the stream that started keeping last. It reports whether it
// freed any.
func (c *chunkMemory) makeRoom(head *flowItem) bool {
	if c.e.p.prompts.evictIdle() {
		return true
	}
	c.prune()
	for i := len(c.kept) - 1; i >= 0; i-- {
		s := c.kept[i]
		if s == head.s && i > 0 {
			continue // its own frames go last: computing them again costs it more
		}
		if c.e.dropKept(s) {
			c.kept = slices.Delete(c.kept, i, i+1)
			c.mem.preempted()
			return true
		}
	}
	return false
}

// tooBig reports head's error where it alone needs more than the whole bound.
func (c *chunkMemory) tooBig(head *flowItem) error {
	need := c.e.p.chunkNeed([]*flowItem{head})
	if need <= c.mem.limit {
		return nil
	}
	return fmt.Errorf("chunk flow: a chunk needs %d MiB of keys and values, more than engine.flow_kv_memory_mb (%d MiB)", need>>20, c.mem.limit>>20)
}

// kept notes that s keeps frames of its own.
func (c *chunkMemory) keeps(s *stream) {
	if !slices.Contains(c.kept, s) {
		c.kept = append(c.kept, s)
	}
}

// prune forgets streams that keep nothing any more.
func (c *chunkMemory) prune() {
	c.kept = slices.DeleteFunc(c.kept, func(s *stream) bool { return s.held.Load() == 0 || !c.e.keepsOwn(s) })
}

// keepsOwn reports whether s keeps frames of its own.
func (e *Engine) keepsOwn(s *stream) bool {
	e.kvMu.Lock()
	defer e.kvMu.Unlock()
	return s.kv != nil && s.kv.n > 0
}

// dropKept frees s's own kept frames (no batch holds s); it reports whether there were any.
func (e *Engine) dropKept(s *stream) bool {
	e.kvMu.Lock()
	defer e.kvMu.Unlock()
	if s.kv == nil || s.kv.n == 0 {
		return false
	}
	s.kv.drop()
	return true
}

// freeKV frees s's kept frames and its hold on its voice's: after its last chunk or its last hold.
func (e *Engine) freeKV(s *stream) {
	e.kvMu.Lock()
	kv := s.kv
	s.kv = nil
	e.kvMu.Unlock()
	if kv == nil {
		return
	}
	if kv.base != nil {
		e.p.prompts.release(kv.base)
	}
	kv.close()
}
