package bench

import (
	"math"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/gonum/stat"
)

// Value is a measurement that may be unknown (NaN), e.g. a percentile of no successful requests;
// JSON writes unknown as null.
type Value float64

// Known reports whether v holds a number.
func (v Value) Known() bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

// MarshalJSON writes null for an unknown value.
func (v Value) MarshalJSON() ([]byte, error) {
	if !v.Known() {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(v), 'g', -1, 64), nil
}

// UnmarshalJSON reads null as unknown.
func (v *Value) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*v = Value(math.NaN())
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	*v = Value(f)
	return err
}

var unknown = Value(math.NaN())

// LevelResult is what one target did at one concurrency level.
type LevelResult struct {
	Concurrency int `json:"concurrency"`
	Requests    int `json:"requests"`
	Succeeded   int `json:"succeeded"`
	Failed      int `json:"failed"`
	// Errors counts failures by kind ("HTTP 503", "timeout", "stream cut", ...).
	Errors      map[string]int `json:"errors,omitempty"`
	SuccessRate Value          `json:"success_rate"` // 0 to 1

	// Latency of successful requests: TTFB is the time from sending the request to the first
	// byte of audio; RTF is the whole request's time divided by the audio's duration.
	TTFBP50Ms Value `json:"ttfb_p50_ms"`
	TTFBP95Ms Value `json:"ttfb_p95_ms"`
	RTFP50    Value `json:"rtf_p50"`
	RTFP95    Value `json:"rtf_p95"`

	// Throughput over the level's wall time (first request sent to last response ended),
	// counting successful requests only.
	WallSeconds    float64 `json:"wall_seconds"`
	AudioSeconds   float64 `json:"audio_seconds"`
	Chars          int     `json:"chars"`
	CharsPerSecond Value   `json:"chars_per_second"`
	RealTimeX      Value   `json:"x_real_time"` // audio seconds per wall second

	GPUs     []GPUStat `json:"gpus,omitempty"`
	GPUError string    `json:"gpu_error,omitempty"`
	// Stages are the server's pipeline stages over the level (voxmux's stage counters); none
	// for a server without them.
	Stages []StageStat `json:"stages,omitempty"`
	// StageError says why a server that has stage counters has none for this level.
	StageError string `json:"stage_error,omitempty"`
}

// outcome is one request's measurement.
type outcome struct {
	ok        bool
	errKind   string
	chars     int
	ttfb      time.Duration
	total     time.Duration
	audioSecs float64
}

// summarize folds a level's outcomes into its result.
func summarize(concurrency int, outs []outcome, wall time.Duration) LevelResult {
	r := LevelResult{Concurrency: concurrency, Requests: len(outs), WallSeconds: wall.Seconds()}
	var ttfb, rtf []float64
	for _, o := range outs {
		if !o.ok {
			r.Failed++
			if r.Errors == nil {
				r.Errors = map[string]int{}
			}
			r.Errors[o.errKind]++
			continue
		}
		r.Succeeded++
		r.AudioSeconds += o.audioSecs
		r.Chars += o.chars
		ttfb = append(ttfb, float64(o.ttfb)/float64(time.Millisecond))
		rtf = append(rtf, o.total.Seconds()/o.audioSecs)
	}
	r.SuccessRate = unknown
	if r.Requests > 0 {
		r.SuccessRate = Value(float64(r.Succeeded) / float64(r.Requests))
	}
	r.TTFBP50Ms, r.TTFBP95Ms = quantile(0.5, ttfb), quantile(0.95, ttfb)
	r.RTFP50, r.RTFP95 = quantile(0.5, rtf), quantile(0.95, rtf)
	r.CharsPerSecond, r.RealTimeX = unknown, unknown
	if s := wall.Seconds(); s > 0 {
		r.CharsPerSecond = Value(float64(r.Chars) / s)
		r.RealTimeX = Value(r.AudioSeconds / s)
	}
	return r
}

// quantile is the nearest-rank p-quantile of xs (the smallest value with at least p of the data
// at or below it, as load-testing tools report P95), unknown for no data.
func quantile(p float64, xs []float64) Value {
	if len(xs) == 0 {
		return unknown
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Value(stat.Quantile(p, stat.Empirical, s, nil))
}

// ratio is a/b, unknown when either is unknown or b is zero.
func ratio(a, b Value) Value {
	if !a.Known() || !b.Known() || b == 0 {
		return unknown
	}
	return a / b
}
