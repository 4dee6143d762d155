package engine

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// Report is what an engine tells about its work since it started: each stage's runs
// (tts.Health.Stages), what cancelled requests cost it (tts.Health.Cancels), and where the first
// audio of the requests since the last report spent its time.
type Report struct {
	Stages  []tts.StageStats
	Cancels tts.CancelStats
	// FirstAudio is taken by the report: the next one holds only later requests'. Empty where the
	// engine does not time its first audio.
	FirstAudio []FirstAudio
	// PromptCache is a chunk-causal flow's voice prompt cache (zero for engines without one).
	PromptCache tts.PromptCacheStats
	// FlowMemory is a chunk-causal flow's device memory (zero for engines without one).
	FlowMemory tts.FlowMemoryStats
}

// FirstAudio is where one request's first audio spent its time: the parts of its way through the
// engine, in order (a staged engine's prefill, decode, flow and vocoder).
type FirstAudio []Part

// Part is one part of the way to a request's first audio.
type Part struct {
	Name string
	Took time.Duration
}

// Merge adds several engines' reports up so that they read like one engine's: stage counts and
// cancels summed, first audio gathered.
func Merge(reports ...Report) Report {
	var out Report
	all := make([][]tts.StageStats, len(reports))
	for i, r := range reports {
		all[i] = r.Stages
		out.Cancels = AddCancels(out.Cancels, r.Cancels)
		out.FirstAudio = append(out.FirstAudio, r.FirstAudio...)
		out.PromptCache = AddPromptCache(out.PromptCache, r.PromptCache)
		f := r.FlowMemory
		out.FlowMemory = tts.FlowMemoryStats{Bytes: out.FlowMemory.Bytes + f.Bytes, Peak: out.FlowMemory.Peak + f.Peak,
			Limit: out.FlowMemory.Limit + f.Limit, Waits: out.FlowMemory.Waits + f.Waits, Preemptions: out.FlowMemory.Preemptions + f.Preemptions}
	}
	out.Stages = Sum(all...)
	return out
}

// AddPromptCache sums two engines' prompt cache figures.
func AddPromptCache(a, b tts.PromptCacheStats) tts.PromptCacheStats {
	return tts.PromptCacheStats{Hits: a.Hits + b.Hits, Misses: a.Misses + b.Misses, Evictions: a.Evictions + b.Evictions,
		Bytes: a.Bytes + b.Bytes, Voices: a.Voices + b.Voices}
}

// AddCancels sums two engines' cancel figures; the longest stays the longest of both.
func AddCancels(a, b tts.CancelStats) tts.CancelStats {
	return tts.CancelStats{Count: a.Count + b.Count, Freeing: a.Freeing + b.Freeing, MaxFreeing: max(a.MaxFreeing, b.MaxFreeing)}
}

// firstAudioKept bounds the first-audio figures kept for a reader, so that memory stays bounded
// when nobody reads them.
const firstAudioKept = 100000

// FirstAudios keeps requests' first-audio figures until a reader takes them. Safe for concurrent
// use; the zero value is ready.
type FirstAudios struct {
	mu sync.Mutex
	fa []FirstAudio
}

// Add keeps fa, unless firstAudioKept figures already wait.
func (f *FirstAudios) Add(fa ...FirstAudio) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fa = append(f.fa, fa[:min(len(fa), max(0, firstAudioKept-len(f.fa)))]...)
}

// Take returns the figures kept since the last Take.
func (f *FirstAudios) Take() []FirstAudio {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.fa
	f.fa = nil
	return out
}

// SummarizeFirstAudio gives the median and 95th percentile of the time to first audio and of each
// of its parts, in ms (parts named as in the first figure); "" for none.
func SummarizeFirstAudio(fa []FirstAudio) string {
	if len(fa) == 0 {
		return ""
	}
	type part struct {
		name string
		of   func(FirstAudio) time.Duration
	}
	parts := []part{{"total", func(f FirstAudio) time.Duration {
		var d time.Duration
		for _, p := range f {
			d += p.Took
		}
		return d
	}}}
	for i, p := range fa[0] {
		parts = append(parts, part{p.Name, func(f FirstAudio) time.Duration {
			if i < len(f) {
				return f[i].Took
			}
			return 0
		}})
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
