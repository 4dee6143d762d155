package staged

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"sync"

	"github.com/voxmux/voxmux/tts"
)

// promptCache keeps voice prompts' keys and values for the chunk-causal flow (flow.chunk_step):
// the frames of a voice's prompt that depend on the voice alone (Manifest.voiceFrames), at every
// Euler step, guidance pass and layer, computed on the voice's first use and read by every request
// in it. Entries are keyed by the prompt's content (voiceKey), not its name: a voice reaches the
// engine as its content (a manifest voice, or a library voice or clip sent as tts.Request.Prompt),
// and a library voice deleted or made again under the same name is never told to the instance, so
// a changed voice is a new key and the old entry only ages out. Bounded in bytes, least recently
// used first out; an entry in use by a stream stays allocated until the stream ends. Safe for
// concurrent use by the flow workers.
type promptCache struct {
	mu     sync.Mutex
	limit  int64
	bytes  int64
	lru    *list.List // of *voiceKV, most recent first
	byKey  map[[32]byte]*list.Element
	hits   uint64
	misses uint64
	evicts uint64
}

// voiceKV is one voice's kept frames, shared by the streams in it.
type voiceKV struct {
	key   [32]byte
	kv    *chunkKV
	bytes int64
	refs  int  // streams reading it
	gone  bool // out of the cache: released once refs is 0
}

// newPromptCache makes a cache of limit bytes; its entries' memory is counted in the flow's
// memory (flowMemory), which they allocate through.
func newPromptCache(limit int64) *promptCache {
	return &promptCache{limit: limit, lru: list.New(), byKey: map[[32]byte]*list.Element{}}
}

// setLimit changes the cache's bound (before any voice is kept).
func (c *promptCache) setLimit(n int64) {
	c.mu.Lock()
	c.limit = n
	c.mu.Unlock()
}

// voiceKey is a hash of what a voice's kept frames depend on: its speech tokens, mel and
// embedding.
func voiceKey(v *Voice) [32]byte {
	h := sha256.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(len(v.SpeechTokens)))
	h.Write(b[:])
	for _, t := range v.SpeechTokens {
		binary.LittleEndian.PutUint64(b[:], uint64(t))
		h.Write(b[:])
	}
	for _, a := range [][]float32{v.Mel, v.Embedding} {
		binary.LittleEndian.PutUint64(b[:], uint64(len(a)))
		h.Write(b[:])
		for _, x := range a {
			binary.LittleEndian.PutUint32(b[:4], math.Float32bits(x))
			h.Write(b[:4])
		}
	}
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// acquire returns the voice's entry, computing it with compute on a miss (under the cache's lock,
// so that two batches never compute one voice twice); the caller releases it.
func (c *promptCache) acquire(key [32]byte, compute func() (*chunkKV, int64, error)) (*voiceKV, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.hits++
		c.lru.MoveToFront(el)
		v := el.Value.(*voiceKV)
		v.refs++
		return v, nil
	}
	c.misses++
	kv, bytes, err := compute()
	if err != nil {
		return nil, err
	}
	v := &voiceKV{key: key, kv: kv, bytes: bytes, refs: 1}
	c.byKey[key] = c.lru.PushFront(v)
	c.bytes += bytes
	for c.bytes > c.limit && c.lru.Len() > 0 {
		c.evict(c.lru.Back())
	}
	return v, nil
}

// lookup returns the voice's entry where the cache has it (a hit), else nil; the caller releases
// it.
func (c *promptCache) lookup(key [32]byte) *voiceKV {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return nil
	}
	c.hits++
	c.lru.MoveToFront(el)
	v := el.Value.(*voiceKV)
	v.refs++
	return v
}

// evictIdle drops the least recently used entry that no stream reads, for room; it reports
// whether there was one.
func (c *promptCache) evictIdle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for el := c.lru.Back(); el != nil; el = el.Prev() {
		if el.Value.(*voiceKV).refs == 0 {
			c.evict(el)
			return true
		}
	}
	return false
}

// evict takes el out of the cache; its memory goes once no stream reads it.
func (c *promptCache) evict(el *list.Element) {
	v := el.Value.(*voiceKV)
	c.lru.Remove(el)
	delete(c.byKey, v.key)
	c.bytes -= v.bytes
	c.evicts++
	v.gone = true
	if v.refs == 0 {
		v.kv.close()
	}
}

// release ends a stream's use of v.
func (c *promptCache) release(v *voiceKV) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v.refs--
	if v.refs == 0 && v.gone {
		v.kv.close()
	}
}

// stats are the cache's counts since the engine started and the bytes it holds now.
func (c *promptCache) stats() tts.PromptCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return tts.PromptCacheStats{Hits: c.hits, Misses: c.misses, Evictions: c.evicts, Bytes: c.bytes, Voices: c.lru.Len()}
}

// close frees every entry not in use.
func (c *promptCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.lru.Len() > 0 {
		c.evict(c.lru.Back())
	}
}
