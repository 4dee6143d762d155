package staged

import (
	"fmt"
	"slices"
	"time"
)

// firstAudioSummary gives the median and 95th percentile of each part of the time to first audio
// and of their sum, in ms.
func firstAudioSummary(fa []FirstAudio) string {
	if len(fa) == 0 {
		return ""
	}
	parts := []struct {
		name string
		of   func(FirstAudio) time.Duration
	}{
		{"total", func(f FirstAudio) time.Duration { return f.Prefill + f.Decode + f.Flow + f.Vocoder }},
		{"prefill", func(f FirstAudio) time.Duration { return f.Prefill }},
		{"decode", func(f FirstAudio) time.Duration { return f.Decode }},
		{"flow", func(f FirstAudio) time.Duration { return f.Flow }},
		{"vocoder", func(f FirstAudio) time.Duration { return f.Vocoder }},
	}
	out := fmt.Sprintf("n=%d p50/p95_ms", len(fa))
	ds := make([]time.Duration, len(fa))
	for _, p := range parts {
		for i, f := range fa {
			ds[i] = p.of(f)
		}
		slices.Sort(ds)
		q := func(x float64) float64 { return float64(ds[int(x*float64(len(ds)-1)+0.5)].Microseconds()) / 1000 }
		out += fmt.Sprintf(" %s=%.0f/%.0f", p.name, q(0.5), q(0.95))
	}
	return out
}

// FirstAudioSummary summarizes the requests' first audio since the last call (instance logs it).
func (e *Engine) FirstAudioSummary() string { return firstAudioSummary(e.FirstAudio()) }

// FirstAudioSummary summarizes every engine's requests' first audio since the last call.
func (r *replicas) FirstAudioSummary() string { return firstAudioSummary(r.FirstAudio()) }
