package library

import (
	"container/list"
	"sync"

	"github.com/voxmux/voxmux/tts"
)

// cache holds the most recently used prompts, bounded by count and by VoicePrompt.Bytes.
type cache struct {
	maxEntries int
	maxBytes   int64

	mu    sync.Mutex
	order *list.List // front: most recent; values are *entry
	items map[string]*list.Element
	bytes int64
}

type entry struct {
	name   string
	prompt *tts.VoicePrompt
	bytes  int64
}

func newCache(maxEntries int, maxBytes int64) *cache {
	return &cache{maxEntries: maxEntries, maxBytes: maxBytes, order: list.New(), items: map[string]*list.Element{}}
}

func (c *cache) get(name string) *tts.VoicePrompt {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[name]
	if !ok {
		return nil
	}
	c.order.MoveToFront(e)
	return e.Value.(*entry).prompt
}

// put adds p; a prompt larger than the whole cache is not kept (it is read again when used).
func (c *cache) put(name string, p *tts.VoicePrompt) {
	n := int64(p.Bytes())
	if c.maxEntries <= 0 || n > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(name)
	c.items[name] = c.order.PushFront(&entry{name: name, prompt: p, bytes: n})
	c.bytes += n
	for c.order.Len() > c.maxEntries || c.bytes > c.maxBytes {
		c.removeLocked(c.order.Back().Value.(*entry).name)
	}
}

func (c *cache) remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(name)
}

func (c *cache) removeLocked(name string) {
	e, ok := c.items[name]
	if !ok {
		return
	}
	c.order.Remove(e)
	delete(c.items, name)
	c.bytes -= e.Value.(*entry).bytes
}

// stats is the cache's count and bytes.
func (c *cache) stats() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len(), c.bytes
}
