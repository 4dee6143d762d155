package router

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/voxmux/voxmux/tts"
)

// Metrics are the router's Prometheus metrics. main builds them once on the registry it serves
// at /metrics and hands them to the Server in Options.RequestMetrics; a nil *Metrics records
// nothing.
type Metrics struct {
	requests   *prometheus.CounterVec
	ttfb       prometheus.Histogram
	duration   prometheus.Histogram
	rtf        prometheus.Histogram
	audio      *prometheus.CounterVec
	chars      prometheus.Counter
	bytes      *prometheus.CounterVec
	incomplete *prometheus.CounterVec
	queueWait  prometheus.Histogram

	pool  *Pool
	mu    sync.Mutex
	stage map[*Backend][]tts.StageStats // last Health answer of each instance
	// cancel is each instance's last tts.CancelStats.
	cancel map[*Backend]tts.CancelStats
	// prompt is each instance's last tts.PromptCacheStats, where it has a prompt cache.
	prompt map[*Backend]tts.PromptCacheStats
	// flowMem is each instance's last tts.FlowMemoryStats, where it has a chunk-causal flow.
	flowMem map[*Backend]tts.FlowMemoryStats
}

// NewMetrics registers the router's metrics on reg. The pool's figures (queue length, in-flight
// and restarts per instance, stage batch counters) are read from pool at each scrape.
func NewMetrics(reg prometheus.Registerer, pool *Pool) *Metrics {
	// Latency buckets from 10 ms to 30 s: first audio is expected well under a second, a whole
	// long input may take many.
	lat := []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "voxmux_requests_total",
			Help: "HTTP requests by route, status code and (for speech) response_format.",
		}, []string{"route", "status", "format"}),
		ttfb: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "voxmux_speech_time_to_first_byte_seconds",
			Help:    "From a speech request's arrival to its first audio leaving (the response headers).",
			Buckets: lat,
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "voxmux_speech_duration_seconds",
			Help:    "From a speech request's arrival to the end of its response body.",
			Buckets: lat,
		}),
		rtf: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "voxmux_speech_real_time_factor_ratio",
			Help:    "Synthesis time over the duration of the audio made (below 1 is faster than real time).",
			Buckets: []float64{.01, .02, .05, .1, .2, .3, .5, .75, 1, 1.5, 2, 5},
		}),
		audio: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "voxmux_audio_produced_seconds_total",
			Help: "Seconds of audio sent to clients, by response_format.",
		}, []string{"format"}),
		chars: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "voxmux_speech_input_characters_total",
			Help: "Characters of input of the speech requests that produced audio.",
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "voxmux_speech_response_bytes_total",
			Help: "Bytes of speech response bodies sent, by response_format.",
		}, []string{"format"}),
		incomplete: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "voxmux_speech_incomplete_total",
			Help: "Speech streams that ended before their audio was complete: failed_mid_stream or client_gone.",
		}, []string{"outcome"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "voxmux_queue_wait_seconds",
			Help:    "Time a request waited for a free instance slot (0 when one was free).",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 2.5, 5, 10, 30},
		}),
		pool:    pool,
		stage:   map[*Backend][]tts.StageStats{},
		cancel:  map[*Backend]tts.CancelStats{},
		prompt:  map[*Backend]tts.PromptCacheStats{},
		flowMem: map[*Backend]tts.FlowMemoryStats{},
	}
	reg.MustRegister(m.requests, m.ttfb, m.duration, m.rtf, m.audio, m.chars, m.bytes, m.incomplete, m.queueWait, newPoolCollector(m))
	return m
}

func (m *Metrics) request(route string, status int, format string) {
	if m != nil {
		m.requests.WithLabelValues(route, strconv.Itoa(status), format).Inc()
	}
}

func (m *Metrics) waited(d time.Duration) {
	if m != nil {
		m.queueWait.Observe(d.Seconds())
	}
}

// spoke records a speech response whose body ended; outcome is ok, failed_mid_stream or client_gone.
func (m *Metrics) spoke(r recentRequest, outcome string, bytes int64) {
	if m == nil {
		return
	}
	m.ttfb.Observe(r.TTFBMillis / 1000)
	m.duration.Observe(r.TotalMillis / 1000)
	if r.RTF > 0 {
		m.rtf.Observe(r.RTF)
	}
	m.audio.WithLabelValues(r.Format).Add(r.AudioSeconds)
	m.bytes.WithLabelValues(r.Format).Add(float64(bytes))
	m.chars.Add(float64(r.Chars))
	if outcome != "ok" {
		m.incomplete.WithLabelValues(outcome).Inc()
	}
}

// HealthReporter is what PollInstances needs of a backend's Member: its own Health answer (the
// plugin's Member has it).
type HealthReporter interface {
	Health(ctx context.Context) (tts.Health, error)
}

// PollInstances asks every instance for its Health every interval until ctx ends, keeping the
// stage batch counters for /metrics. main runs it in a goroutine.
func (m *Metrics) PollInstances(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for _, b := range m.pool.Backends() {
			hr, ok := b.Member.(HealthReporter)
			if !ok || !b.ready.Load() {
				continue
			}
			hctx, cancel := context.WithTimeout(ctx, every)
			h, err := hr.Health(hctx)
			cancel()
			if err != nil {
				continue // the supervisor sees a dead process; the last counters stay
			}
			m.mu.Lock()
			m.stage[b] = h.Stages
			m.cancel[b] = h.Cancels
			if pc := h.PromptCache; pc != (tts.PromptCacheStats{}) {
				m.prompt[b] = pc
			}
			if fm := h.FlowMemory; fm != (tts.FlowMemoryStats{}) {
				m.flowMem[b] = fm
			}
			m.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poolCollector reads the pool at scrape time.
type poolCollector struct {
	m                                                                                           *Metrics
	queueLength, inflight, groupInflight, capacity, ready, restarts, batches, items, busy, wait *prometheus.Desc
	cancels, cancelFreeing, promptHits, promptMisses, promptEvictions, promptBytes              *prometheus.Desc
	flowKVBytes, flowKVPeak, flowKVLimit, flowKVWaits, flowKVPreemptions                        *prometheus.Desc
}

func newPoolCollector(m *Metrics) *poolCollector {
	inst := []string{"group", "instance"}
	stage := []string{"stage", "group", "instance"}
	return &poolCollector{
		m:             m,
		queueLength:   prometheus.NewDesc("voxmux_queue_length", "Requests waiting for a free instance slot.", nil, nil),
		inflight:      prometheus.NewDesc("voxmux_inflight_requests", "Requests in flight on an instance.", inst, nil),
		groupInflight: prometheus.NewDesc("voxmux_group_inflight_requests", "Requests in flight on a GPU group.", []string{"group"}, nil),
		capacity:      prometheus.NewDesc("voxmux_instance_capacity_requests", "An instance's max_inflight.", inst, nil),
		ready:         prometheus.NewDesc("voxmux_instance_ready", "1 while the instance is in rotation.", inst, nil),
		restarts:      prometheus.NewDesc("voxmux_instance_restarts_total", "Times the instance's process was replaced (crash or restart).", inst, nil),
		batches: prometheus.NewDesc("voxmux_stage_batches_total",
			"Batched runs of a pipeline stage in an instance process (reset when the process restarts).", stage, nil),
		items: prometheus.NewDesc("voxmux_stage_batch_items_total",
			"Items (sequences, chunks) carried by a stage's batches; over voxmux_stage_batches_total it is the mean batch size.", stage, nil),
		busy: prometheus.NewDesc("voxmux_stage_busy_seconds_total",
			"Time a stage's batched runs took, summed over its workers (so a stage with several can pass wall time); over voxmux_stage_batches_total it is the mean run time.", stage, nil),
		wait: prometheus.NewDesc("voxmux_stage_wait_seconds_total",
			"Time items waited for a stage before one of its runs took them, summed over items; its rate is the stage's mean queue.", stage, nil),
		cancels: prometheus.NewDesc("voxmux_engine_cancels_total",
			"Requests cancelled (client gone, WebSocket context closed) while an instance's engine still worked on them (reset when the process restarts).", inst, nil),
		cancelFreeing: prometheus.NewDesc("voxmux_engine_cancel_freeing_seconds_total",
			"Time from each cancel until no stage of the engine held the request, summed: engine time spent on audio nobody hears; over voxmux_engine_cancels_total it is the mean.", inst, nil),
		promptHits: prometheus.NewDesc("voxmux_engine_prompt_cache_hits_total",
			"Requests whose voice prompt's keys and values a chunk-causal flow found kept (reset when the process restarts).", inst, nil),
		promptMisses: prometheus.NewDesc("voxmux_engine_prompt_cache_misses_total",
			"Requests whose voice prompt's keys and values a chunk-causal flow computed (reset when the process restarts).", inst, nil),
		promptEvictions: prometheus.NewDesc("voxmux_engine_prompt_cache_evictions_total",
			"Voices a chunk-causal flow's prompt cache dropped for room (least recently used first).", inst, nil),
		promptBytes: prometheus.NewDesc("voxmux_engine_prompt_cache_bytes",
			"Bytes of voice prompts' keys and values a chunk-causal flow keeps now (bounded by engine option flow_prompt_cache_mb).", inst, nil),
		flowKVBytes: prometheus.NewDesc("voxmux_engine_flow_kv_bytes",
			"Device memory a chunk-causal flow holds now for keys and values: streams' kept frames, the prompt cache and batches' padded past.", inst, nil),
		flowKVPeak: prometheus.NewDesc("voxmux_engine_flow_kv_peak_bytes",
			"The most device memory a chunk-causal flow has held for keys and values since the instance started.", inst, nil),
		flowKVLimit: prometheus.NewDesc("voxmux_engine_flow_kv_limit_bytes",
			"A chunk-causal flow's bound on its keys' and values' device memory (engine option flow_kv_memory_mb).", inst, nil),
		flowKVWaits: prometheus.NewDesc("voxmux_engine_flow_kv_waits_total",
			"Times a chunk-causal flow batch waited for memory under flow_kv_memory_mb (reset when the process restarts).", inst, nil),
		flowKVPreemptions: prometheus.NewDesc("voxmux_engine_flow_kv_preemptions_total",
			"Streams whose kept frames a chunk-causal flow dropped for room and computed again (reset when the process restarts).", inst, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.queueLength, c.inflight, c.groupInflight, c.capacity, c.ready, c.restarts, c.batches, c.items, c.busy, c.wait, c.cancels, c.cancelFreeing, c.promptHits, c.promptMisses, c.promptEvictions, c.promptBytes,
		c.flowKVBytes, c.flowKVPeak, c.flowKVLimit, c.flowKVWaits, c.flowKVPreemptions} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.m.pool
	ch <- prometheus.MustNewConstMetric(c.queueLength, prometheus.GaugeValue, float64(p.QueueLen()))
	for _, g := range p.Groups() {
		ch <- prometheus.MustNewConstMetric(c.groupInflight, prometheus.GaugeValue, float64(g.Inflight()), g.Name)
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for _, b := range p.Backends() {
		l := []string{b.GroupName(), b.Name}
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(b.Inflight()), l...)
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(b.Capacity), l...)
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, b2f(b.Ready()), l...)
		if b.Member != nil {
			ch <- prometheus.MustNewConstMetric(c.restarts, prometheus.CounterValue, float64(b.Member.Status().Restarts), l...)
		}
		if cs, ok := c.m.cancel[b]; ok {
			ch <- prometheus.MustNewConstMetric(c.cancels, prometheus.CounterValue, float64(cs.Count), l...)
			ch <- prometheus.MustNewConstMetric(c.cancelFreeing, prometheus.CounterValue, cs.Freeing.Seconds(), l...)
		}
		if pc, ok := c.m.prompt[b]; ok {
			ch <- prometheus.MustNewConstMetric(c.promptHits, prometheus.CounterValue, float64(pc.Hits), l...)
			ch <- prometheus.MustNewConstMetric(c.promptMisses, prometheus.CounterValue, float64(pc.Misses), l...)
			ch <- prometheus.MustNewConstMetric(c.promptEvictions, prometheus.CounterValue, float64(pc.Evictions), l...)
			ch <- prometheus.MustNewConstMetric(c.promptBytes, prometheus.GaugeValue, float64(pc.Bytes), l...)
		}
		if fm, ok := c.m.flowMem[b]; ok {
			ch <- prometheus.MustNewConstMetric(c.flowKVBytes, prometheus.GaugeValue, float64(fm.Bytes), l...)
			ch <- prometheus.MustNewConstMetric(c.flowKVPeak, prometheus.GaugeValue, float64(fm.Peak), l...)
			ch <- prometheus.MustNewConstMetric(c.flowKVLimit, prometheus.GaugeValue, float64(fm.Limit), l...)
			ch <- prometheus.MustNewConstMetric(c.flowKVWaits, prometheus.CounterValue, float64(fm.Waits), l...)
			ch <- prometheus.MustNewConstMetric(c.flowKVPreemptions, prometheus.CounterValue, float64(fm.Preemptions), l...)
		}
		for _, s := range c.m.stage[b] {
			sl := []string{s.Stage, b.GroupName(), b.Name}
			ch <- prometheus.MustNewConstMetric(c.batches, prometheus.CounterValue, float64(s.Batches), sl...)
			ch <- prometheus.MustNewConstMetric(c.items, prometheus.CounterValue, float64(s.Items), sl...)
			ch <- prometheus.MustNewConstMetric(c.busy, prometheus.CounterValue, s.Busy.Seconds(), sl...)
			ch <- prometheus.MustNewConstMetric(c.wait, prometheus.CounterValue, s.Wait.Seconds(), sl...)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
