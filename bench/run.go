// Package bench is a load generator for OpenAI-shaped speech servers: it sweeps concurrency
// levels against POST /v1/audio/speech with streaming responses, measures time to first audio,
// real-time factor and throughput per level, samples GPU memory and utilization, and writes the
// results as markdown, JSON and a PNG chart. A second target (a baseline server) can be run
// through the same sweep, and the report then states the first target's figures as ratios to it.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Target is one server to measure.
type Target struct {
	Name string // how the report calls it, e.g. "voxmux" or "baseline"
	URL  string // base URL; /v1/audio/speech and /metrics are appended
	// Concurrency overrides Options.Concurrency for this target when set.
	Concurrency []int
}

// Options configures a run. The zero value of a field means its default, as noted.
type Options struct {
	// Targets are measured one after the other, each through its whole sweep. The first is the
	// subject; a second one is the baseline the report compares it to.
	Targets     []Target
	Concurrency []int // default DefaultConcurrency

	// A level ends when RequestsPerLevel requests have been sent (at least one per worker) or
	// when DurationPerLevel has passed, whichever is first; requests already sent then run to
	// their end. With neither set, a level sends 4 requests per worker (at least 16).
	RequestsPerLevel int
	DurationPerLevel time.Duration

	Warmup     int    // requests sent to each target before its sweep, not counted
	Format     string // "pcm" (default) or "wav"
	SampleRate int    // Hz of pcm responses; default 24000 (wav responses carry their own)
	Model      string // "model" of each request; empty leaves it out
	Voice      string // "voice" of each request; empty leaves it out
	Corpus     []Sentence
	Timeout    time.Duration // per request; default 5 minutes; a request past it is a failure

	// Client sends the requests; nil builds one with enough idle connections for the sweep.
	Client *http.Client
	// GPUMetricsURL, when set, is the base URL whose /metrics gauges are sampled for every
	// target instead of each target's own (e.g. one exporter for the GPU that both servers share).
	GPUMetricsURL string
	// LocalGPU is used for targets whose /metrics has no GPU gauges; nil means no GPU figures
	// for those targets.
	LocalGPU       GPUSampler
	SampleInterval time.Duration // default 500 ms

	Progress Progress     // nil: none
	Logger   *slog.Logger // nil: discard
	Label    string       // free text for the report's title
	// RequestLength and VoicePrompt say how the servers were set to make requests (as "realistic,
	// 9 speech tokens per text token" and "5.0 s"), for the report, which states them under every
	// table beside the audio each request measured.
	RequestLength string
	VoicePrompt   string
}

// DefaultConcurrency is the default sweep: one stream to a load past what one GPU keeps up with.
var DefaultConcurrency = []int{1, 4, 8, 16, 32, 64, 128, 256}

// Progress is told what the run is doing, for a progress bar.
type Progress interface {
	// StartLevel begins a level; total is -1 when the level is bounded by time only.
	StartLevel(target string, concurrency, total int)
	// Done counts one finished request.
	Done(ok bool)
	EndLevel()
}

// Run measures every target and returns the report. It stops early, with what it has and
// ctx's error, when ctx ends.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	rep := &Report{
		Label:     o.Label,
		StartedAt: time.Now().UTC(),
		Settings: Settings{
			Format: o.Format, SampleRate: o.SampleRate, Model: o.Model, Voice: o.Voice,
			RequestsPerLevel: o.RequestsPerLevel, DurationPerLevel: o.DurationPerLevel.String(),
			Warmup: o.Warmup, TimeoutSeconds: o.Timeout.Seconds(), CorpusSentences: len(o.Corpus),
			RequestLength: o.RequestLength, VoicePrompt: o.VoicePrompt,
		},
	}
	for _, t := range o.Targets {
		tr, err := runTarget(ctx, &o, t)
		rep.Targets = append(rep.Targets, tr)
		if err != nil {
			rep.compare()
			return rep, err
		}
	}
	rep.compare()
	return rep, nil
}

func (o *Options) defaults() error {
	if len(o.Targets) == 0 {
		return errors.New("bench: no target")
	}
	if len(o.Targets) > 2 {
		return errors.New("bench: at most two targets (a subject and a baseline)")
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = DefaultConcurrency
	}
	for _, t := range o.Targets {
		if t.URL == "" {
			return fmt.Errorf("bench: target %q has no URL", t.Name)
		}
		levels := t.Concurrency
		if levels == nil {
			levels = o.Concurrency
		}
		for _, c := range levels {
			if c < 1 {
				return fmt.Errorf("bench: concurrency %d: must be at least 1", c)
			}
		}
	}
	if o.RequestsPerLevel < 0 || o.DurationPerLevel < 0 || o.Warmup < 0 {
		return errors.New("bench: requests, duration and warmup must not be negative")
	}
	switch o.Format {
	case "":
		o.Format = "pcm"
	case "pcm", "wav":
	default:
		return fmt.Errorf("bench: format %q: want pcm or wav", o.Format)
	}
	if o.SampleRate == 0 {
		o.SampleRate = 24000
	}
	if o.SampleRate < 0 {
		return fmt.Errorf("bench: sample rate %d: must be positive", o.SampleRate)
	}
	if len(o.Corpus) == 0 {
		o.Corpus = Corpus
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.SampleInterval == 0 {
		o.SampleInterval = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Client == nil {
		most := 0
		for _, t := range o.Targets {
			for _, c := range append(t.Concurrency, o.Concurrency...) {
				most = max(most, c)
			}
		}
		o.Client = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // the targets are local servers; a proxy would skew every figure
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        2 * most,
			MaxIdleConnsPerHost: 2 * most,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}}
	}
	return nil
}

// levelRequests is how many requests a level of concurrency c sends; 0 means unbounded (time).
func (o *Options) levelRequests(c int) int {
	switch {
	case o.RequestsPerLevel > 0:
		return max(o.RequestsPerLevel, c)
	case o.DurationPerLevel > 0:
		return 0
	}
	return max(4*c, 16)
}

func runTarget(ctx context.Context, o *Options, t Target) (TargetResult, error) {
	tr := TargetResult{Name: t.Name, URL: t.URL}
	log := o.Logger.With("target", t.Name, "url", t.URL)
	sampler, source := o.gpuSampler(ctx, t)
	tr.GPUSource = source
	log.Info("bench target", "gpu_source", source)

	if o.Warmup > 0 {
		g := &generator{o: o, url: t.URL}
		outs := g.level(ctx, min(o.Warmup, 8), o.Warmup, 0, nil)
		failed := 0
		for _, out := range outs {
			if !out.ok {
				failed++
			}
		}
		tr.WarmupFailed = failed
		log.Info("warmup done", "requests", o.Warmup, "failed", failed)
		if err := ctx.Err(); err != nil {
			return tr, err
		}
		if failed == len(outs) && failed > 0 {
			// A sweep against a server that is down or refuses everything measures nothing.
			return tr, fmt.Errorf("%w: %s (%s): all %d warm-up requests failed (%s)", ErrAllFailed, t.Name, t.URL, failed, failureKinds(outs))
		}
	}
	// The target's own stage counters, whatever serves its GPU figures.
	stages := stageReader{&MetricsSampler{Client: o.Client, URL: t.URL}}
	stageServer := false // a reading has found stage counters: a level without figures says why
	// The end of one level is the start of the next: its reading is reused when it succeeded.
	var last stageReading
	lastErr := errNoStageCounters
	levels := t.Concurrency
	if levels == nil {
		levels = o.Concurrency
	}
	for _, c := range levels {
		total := o.levelRequests(c)
		if o.Progress != nil {
			shown := total
			if total == 0 {
				shown = -1
			}
			o.Progress.StartLevel(t.Name, c, shown)
		}
		before, berr := last, lastErr
		if berr != nil {
			before, berr = stages.read(ctx)
		}
		rec := startGPURecorder(ctx, sampler, o.SampleInterval)
		g := &generator{o: o, url: t.URL}
		start := time.Now()
		outs := g.level(ctx, c, total, o.DurationPerLevel, o.Progress)
		end := g.lastEnd()
		if end.Before(start) {
			end = time.Now() // no request ran
		}
		wall := end.Sub(start)
		if o.Progress != nil {
			o.Progress.EndLevel()
		}
		lr := summarize(c, outs, wall)
		gpus, gerr := rec.finish()
		lr.GPUs = gpus
		if gerr != nil {
			lr.GPUError = gerr.Error()
		}
		after, aerr := stages.read(ctx)
		lr.Stages, lr.StageError = levelStages(before, berr, after, aerr, stageServer)
		stageServer = stageServer || berr == nil || aerr == nil
		last, lastErr = after, aerr
		tr.Levels = append(tr.Levels, lr)
		log.Info("bench level", "concurrency", c, "requests", lr.Requests, "failed", lr.Failed,
			"ttfb_p95_ms", float64(lr.TTFBP95Ms), "x_real_time", float64(lr.RealTimeX))
		if err := ctx.Err(); err != nil {
			return tr, err
		}
	}
	return tr, nil
}

// gpuSampler prefers the GPUMetricsURL's or else the target's own /metrics gauges, then the
// local sampler.
func (o *Options) gpuSampler(ctx context.Context, t Target) (GPUSampler, string) {
	url, source := t.URL, "server /metrics"
	if o.GPUMetricsURL != "" {
		url, source = o.GPUMetricsURL, strings.TrimRight(o.GPUMetricsURL, "/")+"/metrics"
	}
	ms := &MetricsSampler{Client: o.Client, URL: url}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := ms.Sample(pctx); err == nil {
		return ms, source
	} else if o.GPUMetricsURL != "" {
		o.Logger.Warn("no GPU gauges at the GPU metrics URL", "url", url, "error", err)
	} else {
		o.Logger.Debug("no GPU gauges on the server", "target", t.Name, "error", err)
	}
	if o.LocalGPU != nil {
		return o.LocalGPU, "local"
	}
	return nil, "none"
}

// generator runs one level's requests against one URL.
type generator struct {
	o   *Options
	url string

	mu  sync.Mutex
	end time.Time
}

func (g *generator) lastEnd() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.end
}

// level runs c workers that each send one request at a time until total requests have been
// sent (total > 0) or dur has passed (dur > 0; each worker still sends one). Request i of the level speaks corpus sentence
// i mod len(corpus), so a level's inputs are the same on every run and for every target.
func (g *generator) level(ctx context.Context, c, total int, dur time.Duration, p Progress) []outcome {
	var next atomic.Int64
	deadline := time.Now().Add(dur)
	outs := make([][]outcome, c)
	var wg sync.WaitGroup
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every worker sends at least one request, so a level always runs at its concurrency.
			for sent := 0; ctx.Err() == nil; sent++ {
				if sent > 0 && dur > 0 && !time.Now().Before(deadline) {
					return
				}
				i := int(next.Add(1) - 1)
				if total > 0 && i >= total {
					return
				}
				out := g.do(ctx, g.o.Corpus[i%len(g.o.Corpus)])
				if ctx.Err() != nil {
					return // the run was stopped; this request says nothing about the server
				}
				outs[w] = append(outs[w], out)
				if p != nil {
					p.Done(out.ok)
				}
			}
		}()
	}
	wg.Wait()
	var all []outcome
	for _, o := range outs {
		all = append(all, o...)
	}
	return all
}

type speechRequest struct {
	Model          string `json:"model,omitempty"`
	Input          string `json:"input"`
	Voice          string `json:"voice,omitempty"`
	ResponseFormat string `json:"response_format"`
}

// do sends one request and reads its streamed audio to the end.
func (g *generator) do(ctx context.Context, s Sentence) (out outcome) {
	out.chars = s.Chars()
	body, err := json.Marshal(speechRequest{Model: g.o.Model, Input: s.Text, Voice: g.o.Voice, ResponseFormat: g.o.Format})
	if err != nil {
		out.errKind = "encode request"
		return out
	}
	rctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(g.url, "/")+"/v1/audio/speech", bytes.NewReader(body))
	if err != nil {
		out.errKind = "bad URL"
		return out
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	defer func() {
		g.mu.Lock()
		if now := time.Now(); now.After(g.end) {
			g.end = now
		}
		g.mu.Unlock()
	}()
	resp, err := g.o.Client.Do(req)
	if err != nil {
		out.errKind = errKind(rctx, err, "connect")
		return out
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		out.errKind = fmt.Sprintf("HTTP %d", resp.StatusCode)
		return out
	}
	audio := newAudioCounter(g.o.Format, g.o.SampleRate)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			before := audio.bytes
			if err := audio.feed(buf[:n]); err != nil {
				out.errKind = "bad audio: " + err.Error()
				return out
			}
			if before == 0 && audio.bytes > 0 {
				out.ttfb = time.Since(start)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			out.errKind = errKind(rctx, rerr, "stream cut")
			return out
		}
	}
	out.total = time.Since(start)
	out.audioSecs = audio.seconds()
	if out.audioSecs <= 0 {
		out.errKind = "no audio"
		return out
	}
	out.ok = true
	return out
}

// ErrAllFailed is what Run and Report.Check return when a target answered no request with audio.
var ErrAllFailed = errors.New("bench: no request succeeded")

// failureKinds lists the kinds of failures among outs, most frequent first ("connect × 4").
func failureKinds(outs []outcome) string {
	counts := map[string]int{}
	for _, o := range outs {
		if !o.ok {
			counts[o.errKind]++
		}
	}
	return kindList(counts)
}

func kindList(counts map[string]int) string {
	kinds := make([]string, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if counts[kinds[i]] != counts[kinds[j]] {
			return counts[kinds[i]] > counts[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s × %d", k, counts[k])
		if k == "connect" {
			parts[i] = fmt.Sprintf("cannot connect × %d: is the server running there?", counts[k])
		}
	}
	return strings.Join(parts, ", ")
}

// Check returns an error wrapping ErrAllFailed for each target whose measured requests all
// failed (a report of nothing but errors is not a measurement); nil otherwise.
func (r *Report) Check() error {
	var errs []error
	for _, t := range r.Targets {
		requests, ok := 0, 0
		counts := map[string]int{}
		for _, l := range t.Levels {
			requests += l.Requests
			ok += l.Succeeded
			for k, n := range l.Errors {
				counts[k] += n
			}
		}
		if requests > 0 && ok == 0 {
			errs = append(errs, fmt.Errorf("%w: %s (%s): all %d requests failed (%s)", ErrAllFailed, t.Name, t.URL, requests, kindList(counts)))
		}
	}
	return errors.Join(errs...)
}

func errKind(ctx context.Context, err error, what string) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "timeout"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return what
}
