package instance

import (
	"sync"
	"time"
)

// Stage names, as they appear in the engine's statistics.
const (
	StagePrefill = "lm_prefill"
	StageDecode  = "lm_decode"
	StageFlow    = "flow"
	StageVocoder = "vocoder"
)

// StageStats is what one stage of the engine has done since it started.
type StageStats struct {
	Runs  uint64        // batched runs
	Items uint64        // requests (or chunks) those runs carried
	Busy  time.Duration // time spent in them
}

// stats counts the engine's runs per stage; the loops add, readers take a copy.
type stats struct {
	mu sync.Mutex
	m  map[string]StageStats
}

func (s *stats) add(stage string, items int, since time.Time) {
	d := time.Since(since)
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]StageStats{}
	}
	st := s.m[stage]
	st.Runs++
	st.Items += uint64(items)
	st.Busy += d
	s.m[stage] = st
	s.mu.Unlock()
}

func (s *stats) snapshot() map[string]StageStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]StageStats, len(s.m))
	for k, v := range s.m {
		out[k] = v
	}
	return out
}
