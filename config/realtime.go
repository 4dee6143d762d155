package config

import "time"

// Realtime tunes the WebSocket text-in speech API (WS /v1/audio/speech/stream, docs/api.md):
// when text streamed in is enough to start speaking, and how much one connection may hold.
type Realtime struct {
	// MinChars is how many characters a segment needs before a clause boundary (, ; : and
	// dashes) ends it; sentence ends (. ! ? and their full-width forms) and line breaks end a
	// segment at any length. Fewer characters start speech sooner, more give the model more
	// text to phrase at once.
	MinChars int `yaml:"min_chars"`
	// MaxChars ends a segment at its last space once this many characters wait with no
	// boundary (text without punctuation); at most max_input_chars.
	MaxChars int `yaml:"max_chars"`
	// IdleFlush speaks what waits once no text has arrived for this long (an LLM that
	// stalled mid-sentence); "0s" never does, and waits for a boundary, flush or input.done.
	// Left out: 2s.
	IdleFlush *Duration `yaml:"idle_flush"`
	// MaxContexts is how many contexts one connection may have open at once.
	MaxContexts int `yaml:"max_contexts"`
}

// Defaults of realtime.
const (
	DefaultRealtimeMinChars    = 20
	DefaultRealtimeMaxChars    = 200
	DefaultRealtimeMaxContexts = 8
	DefaultRealtimeIdleFlush   = Duration(2 * time.Second)
)

// Idle is IdleFlush with its default.
func (r Realtime) Idle() time.Duration {
	if r.IdleFlush == nil {
		return DefaultRealtimeIdleFlush.Std()
	}
	return r.IdleFlush.Std()
}

func (c *Config) applyRealtimeDefaults() {
	r := &c.Realtime
	if r.MinChars == 0 {
		r.MinChars = DefaultRealtimeMinChars
	}
	if r.MaxChars == 0 {
		r.MaxChars = min(DefaultRealtimeMaxChars, c.MaxInputChars)
	}
	if r.MaxContexts == 0 {
		r.MaxContexts = DefaultRealtimeMaxContexts
	}
}

func (c *Config) validateRealtime() error {
	r := c.Realtime
	switch {
	case r.MinChars < 1:
		return bad("$.realtime.min_chars", "realtime.min_chars", "%d: must be at least 1", r.MinChars)
	case r.MaxChars < r.MinChars:
		return bad("$.realtime.max_chars", "realtime.max_chars", "%d is below realtime.min_chars (%d)", r.MaxChars, r.MinChars)
	case r.MaxChars > c.MaxInputChars:
		return bad("$.realtime.max_chars", "realtime.max_chars", "%d is above max_input_chars (%d): a segment is one request", r.MaxChars, c.MaxInputChars)
	case r.IdleFlush != nil && *r.IdleFlush < 0:
		return bad("$.realtime.idle_flush", "realtime.idle_flush", "must not be negative")
	case r.MaxContexts < 1:
		return bad("$.realtime.max_contexts", "realtime.max_contexts", "%d: must be at least 1", r.MaxContexts)
	}
	return nil
}
