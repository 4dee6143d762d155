package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// fakeTTS is an in-process speech server: it streams 16-bit mono audio of samplesPerChar
// samples per input character in three flushed chunks with a short pause before each, answers
// "FAIL" with 503 and cuts the connection after the first chunk for "CUT".
type fakeTTS struct {
	rate           int // Hz written in WAV headers
	samplesPerChar int
	pause          time.Duration
	metrics        string // body of GET /metrics; empty: 404
	// metricsFunc, when set, is called for each GET /metrics and its body follows metrics.
	metricsFunc func() string
	requests    atomic.Int64
	mu          sync.Mutex
	formats     map[string]int
}

func (f *fakeTTS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/metrics" && (f.metrics != "" || f.metricsFunc != nil):
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, f.metrics)
		if f.metricsFunc != nil {
			fmt.Fprint(w, f.metricsFunc())
		}
		return
	case r.URL.Path != "/v1/audio/speech" || r.Method != http.MethodPost:
		http.NotFound(w, r)
		return
	}
	f.requests.Add(1)
	var req struct {
		Model, Input, Voice string
		ResponseFormat      string `json:"response_format"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	if f.formats == nil {
		f.formats = map[string]int{}
	}
	f.formats[req.ResponseFormat]++
	f.mu.Unlock()
	if req.Input == "FAIL" {
		http.Error(w, `{"error":"busy"}`, http.StatusServiceUnavailable)
		return
	}
	fl := w.(http.Flusher)
	w.WriteHeader(http.StatusOK)
	if req.ResponseFormat == "wav" {
		_, _ = w.Write(wavHeader(f.rate))
	}
	pcm := make([]byte, 2*f.samplesPerChar*utf8.RuneCountInString(req.Input))
	for i := range pcm {
		pcm[i] = byte(i)
	}
	third := len(pcm) / 3 &^ 1
	for i, part := range [][]byte{pcm[:third], pcm[third : 2*third], pcm[2*third:]} {
		time.Sleep(f.pause)
		_, _ = w.Write(part)
		fl.Flush()
		if i == 0 && req.Input == "CUT" {
			panic(http.ErrAbortHandler) // the client sees a broken chunked body
		}
	}
}

// wavHeader is a streaming WAV header with a LIST chunk before the data, as some servers write.
func wavHeader(rate int) []byte {
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString("RIFF")
	le(uint32(0xFFFFFFFF))
	b.WriteString("WAVEfmt ")
	le(uint32(16))
	le(uint16(1))
	le(uint16(1))
	le(uint32(rate))
	le(uint32(rate * 2))
	le(uint16(2))
	le(uint16(16))
	b.WriteString("LIST")
	le(uint32(5)) // odd size: one pad byte follows
	b.WriteString("INFOx\x00")
	b.WriteString("data")
	le(uint32(0xFFFFFFFF))
	return b.Bytes()
}

var testCorpus = []Sentence{
	{"en", "Hello there."}, // 12 characters
	{"zh", "你好"},           // 2
	{"en", "FAIL"},
	{"es", "Hola amigo"}, // 10
	{"en", "CUT"},
}

func TestRunStatsAndReport(t *testing.T) {
	fake := &fakeTTS{rate: 24000, samplesPerChar: 1200, pause: time.Millisecond}
	srv := httptest.NewServer(fake)
	defer srv.Close()

	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{1, 4},
		RequestsPerLevel: 10,
		Warmup:           3,
		Corpus:           testCorpus,
		Model:            "tiny",
		Voice:            "bench",
		RequestLength:    "realistic, 9 speech tokens per text token",
		VoicePrompt:      "5.0 s",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := fake.requests.Load(); got != 3+10+10 {
		t.Errorf("server saw %d speech requests, want 23 (3 warm-up + 2 levels × 10)", got)
	}
	if fake.formats["pcm"] != 23 {
		t.Errorf("formats %v, want pcm only", fake.formats)
	}
	if len(rep.Targets) != 1 || len(rep.Targets[0].Levels) != 2 {
		t.Fatalf("report has %+v", rep.Targets)
	}
	if rep.Targets[0].GPUSource != "none" {
		t.Errorf("gpu source %q, want none (no /metrics, no local sampler)", rep.Targets[0].GPUSource)
	}
	if rep.Targets[0].WarmupFailed != 1 {
		// Warm-up requests 0..2 speak sentences 0..2, and sentence 2 fails.
		t.Errorf("warm-up failures %d, want 1", rep.Targets[0].WarmupFailed)
	}
	for _, l := range rep.Targets[0].Levels {
		// Ten requests go round-robin over five sentences: each twice.
		if l.Requests != 10 || l.Succeeded != 6 || l.Failed != 4 {
			t.Errorf("c=%d: requests %d ok %d failed %d, want 10/6/4", l.Concurrency, l.Requests, l.Succeeded, l.Failed)
		}
		if l.SuccessRate != 0.6 {
			t.Errorf("c=%d: success rate %v, want 0.6", l.Concurrency, l.SuccessRate)
		}
		if l.Errors["HTTP 503"] != 2 || l.Errors["stream cut"] != 2 {
			t.Errorf("c=%d: errors %v, want 2 × HTTP 503 and 2 × stream cut", l.Concurrency, l.Errors)
		}
		if l.Chars != 2*(12+2+10) {
			t.Errorf("c=%d: chars %d, want 48", l.Concurrency, l.Chars)
		}
		if want := 48 * 1200 / 24000.0; math.Abs(l.AudioSeconds-want) > 1e-9 {
			t.Errorf("c=%d: audio %v s, want %v", l.Concurrency, l.AudioSeconds, want)
		}
		if !(l.WallSeconds > 0) || !l.TTFBP50Ms.Known() || !l.RTFP95.Known() {
			t.Errorf("c=%d: missing figures: %+v", l.Concurrency, l)
		}
		if l.TTFBP50Ms > l.TTFBP95Ms || l.RTFP50 > l.RTFP95 {
			t.Errorf("c=%d: P50 above P95: %+v", l.Concurrency, l)
		}
		if got, want := float64(l.RealTimeX), l.AudioSeconds/l.WallSeconds; math.Abs(got-want) > 1e-9 {
			t.Errorf("c=%d: × real time %v, want audio/wall %v", l.Concurrency, got, want)
		}
		if got, want := float64(l.CharsPerSecond), float64(l.Chars)/l.WallSeconds; math.Abs(got-want) > 1e-9 {
			t.Errorf("c=%d: chars/s %v, want %v", l.Concurrency, got, want)
		}
	}

	dir := t.TempDir()
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "bench.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"concurrency", "success", "TTFB P50 (ms)", "TTFB P95 (ms)", "RTF P50", "RTF P95", "chars/s", "× real time", "GPU peak memory", "GPU util", "HTTP 503 × 2"} {
		if !strings.Contains(string(md), col) {
			t.Errorf("bench.md lacks %q:\n%s", col, md)
		}
	}
	// Under the table: the settings, and per request 2 × 48 chars × 1200 samples / 24 kHz over 12
	// requests, at 20 chars a second of audio.
	if want := "Requests: voice `bench` (voice prompt 5.0 s); request length: realistic, 9 speech tokens per text token; " +
		"≈0.4 s of audio per request, 20.0 characters per second of audio (mean of 12 requests).\n"; !strings.Contains(string(md), want) {
		t.Errorf("bench.md lacks %q:\n%s", want, md)
	}
	var back Report
	js, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatalf("bench.json does not parse: %v", err)
	}
	if back.Settings.RequestLength != "realistic, 9 speech tokens per text token" || back.Settings.VoicePrompt != "5.0 s" {
		t.Errorf("bench.json settings %+v", back.Settings)
	}
	if back.Targets[0].Levels[1].Chars != 48 || back.Targets[0].Levels[1].Concurrency != 4 {
		t.Errorf("bench.json round trip lost figures: %+v", back.Targets[0].Levels[1])
	}
	checkPNG(t, filepath.Join(dir, "bench.png"))
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s does not decode as PNG: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 200 || b.Dy() < 200 {
		t.Errorf("%s is only %v", path, b)
	}
}

func TestWAVDurationFromHeader(t *testing.T) {
	// The header says 16 kHz; --sample-rate (24 kHz here) only applies to raw PCM.
	fake := &fakeTTS{rate: 16000, samplesPerChar: 160}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{2},
		RequestsPerLevel: 2,
		Format:           "wav",
		SampleRate:       24000,
		Corpus:           []Sentence{{"en", "Hello there."}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l := rep.Targets[0].Levels[0]
	if l.Succeeded != 2 {
		t.Fatalf("level %+v", l)
	}
	if want := 2 * 12 * 160 / 16000.0; math.Abs(l.AudioSeconds-want) > 1e-9 {
		t.Errorf("audio %v s, want %v", l.AudioSeconds, want)
	}
	if fake.formats["wav"] != 2 {
		t.Errorf("formats %v, want wav", fake.formats)
	}
}

func TestAudioCounterByteByByte(t *testing.T) {
	a := newAudioCounter("wav", 24000)
	stream := append(wavHeader(8000), make([]byte, 1600)...)
	for i := range stream {
		if err := a.feed(stream[i : i+1]); err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
		if i < len(wavHeader(8000))-1 && a.bytes != 0 {
			t.Fatalf("byte %d: counted audio inside the header", i)
		}
	}
	if a.seconds() != 0.1 {
		t.Errorf("seconds %v, want 0.1 (800 samples at 8 kHz)", a.seconds())
	}
	if err := newAudioCounter("wav", 24000).feed([]byte("ID3\x04 not a wav file")); err == nil {
		t.Error("a non-WAV stream was accepted")
	}
}

func TestDurationBoundedLevelEnds(t *testing.T) {
	fake := &fakeTTS{rate: 24000, samplesPerChar: 10, pause: time.Millisecond}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{3},
		DurationPerLevel: 50 * time.Millisecond,
		Corpus:           []Sentence{{"en", "Hello there."}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l := rep.Targets[0].Levels[0]
	if l.Requests < 3 || l.Requests != l.Succeeded+l.Failed || int(fake.requests.Load()) != l.Requests {
		t.Errorf("level %+v, server saw %d", l, fake.requests.Load())
	}
}

const fakeMetrics = `# HELP voxmux_gpu_memory_used_bytes GPU memory in use.
# TYPE voxmux_gpu_memory_used_bytes gauge
voxmux_gpu_memory_used_bytes{gpu="0"} 1.5e+09
voxmux_gpu_memory_used_bytes{gpu="1"} 2.5e+09
# TYPE voxmux_gpu_utilization_ratio gauge
voxmux_gpu_utilization_ratio{gpu="0"} 0.5
voxmux_gpu_utilization_ratio{gpu="1"} 0.25
# TYPE voxmux_requests_total counter
voxmux_requests_total 7
`

func TestGPUFromServerMetrics(t *testing.T) {
	fake := &fakeTTS{rate: 24000, samplesPerChar: 10, metrics: fakeMetrics}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	local := &countingSampler{}
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{1},
		RequestsPerLevel: 2,
		Corpus:           []Sentence{{"en", "Hi."}},
		LocalGPU:         local,
		SampleInterval:   5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := rep.Targets[0]
	if tr.GPUSource != "server /metrics" || local.calls.Load() != 0 {
		t.Fatalf("gpu source %q, local sampler called %d times", tr.GPUSource, local.calls.Load())
	}
	gpus := tr.Levels[0].GPUs
	if len(gpus) != 2 {
		t.Fatalf("gpus %+v", gpus)
	}
	if gpus[0].PeakMemoryBytes != 1.5e9 || gpus[1].PeakMemoryBytes != 2.5e9 ||
		gpus[0].MeanUtilPct != 50 || gpus[1].MeanUtilPct != 25 || gpus[0].Samples < 2 {
		t.Errorf("gpus %+v", gpus)
	}
	if md := markdown(t, rep); !strings.Contains(md, "0: 1.40 GiB, 1: 2.33 GiB") || !strings.Contains(md, "0: 50%, 1: 25%") {
		t.Errorf("markdown GPU columns wrong:\n%s", md)
	}
}

func TestGPUFromAnotherServersMetrics(t *testing.T) {
	// The subject has no gauges; a third server (the GPU's exporter) has them for both targets.
	subject := httptest.NewServer(&fakeTTS{rate: 24000, samplesPerChar: 10})
	defer subject.Close()
	exporter := httptest.NewServer(&fakeTTS{metrics: fakeMetrics})
	defer exporter.Close()
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: subject.URL}},
		Concurrency:      []int{1},
		RequestsPerLevel: 1,
		Corpus:           []Sentence{{"en", "Hi."}},
		GPUMetricsURL:    exporter.URL,
		SampleInterval:   5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := rep.Targets[0]
	if tr.GPUSource != exporter.URL+"/metrics" || len(tr.Levels[0].GPUs) != 2 || tr.Levels[0].GPUs[1].PeakMemoryBytes != 2.5e9 {
		t.Errorf("source %q gpus %+v", tr.GPUSource, tr.Levels[0].GPUs)
	}
}

// countingSampler reports one GPU whose memory grows by 100 bytes at each reading.
type countingSampler struct{ calls atomic.Int64 }

func (c *countingSampler) Sample(context.Context) ([]GPUSample, error) {
	n := c.calls.Add(1)
	return []GPUSample{{Index: 0, MemoryUsedBytes: uint64(100 * n), UtilizationPct: 40}}, nil
}

func TestGPUFromLocalSampler(t *testing.T) {
	fake := &fakeTTS{rate: 24000, samplesPerChar: 10}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	local := &countingSampler{}
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{1},
		RequestsPerLevel: 3,
		Corpus:           []Sentence{{"en", "Hi."}},
		LocalGPU:         local,
		SampleInterval:   time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := rep.Targets[0]
	g := tr.Levels[0].GPUs
	if tr.GPUSource != "local" || len(g) != 1 {
		t.Fatalf("source %q gpus %+v", tr.GPUSource, g)
	}
	calls := local.calls.Load()
	if calls < 2 || g[0].Samples != int(calls) || g[0].PeakMemoryBytes != uint64(100*calls) || g[0].MeanUtilPct != 40 {
		t.Errorf("after %d readings: %+v", calls, g[0])
	}
}

func TestCompareStatesRatios(t *testing.T) {
	subject := httptest.NewServer(&fakeTTS{rate: 24000, samplesPerChar: 100})
	defer subject.Close()
	baseline := httptest.NewServer(&fakeTTS{rate: 24000, samplesPerChar: 100, pause: 2 * time.Millisecond})
	defer baseline.Close()
	rep, err := Run(context.Background(), Options{
		Targets: []Target{
			{Name: "voxmux", URL: subject.URL},
			{Name: "baseline", URL: baseline.URL, Concurrency: []int{1}},
		},
		Concurrency:      []int{1, 2},
		RequestsPerLevel: 4,
		Corpus:           []Sentence{{"en", "Hello there."}, {"es", "Hola amigo"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The baseline ran only c=1, so only c=1 compares.
	if len(rep.Comparison) != 1 || rep.Comparison[0].Concurrency != 1 {
		t.Fatalf("comparison %+v", rep.Comparison)
	}
	s, b, c := rep.Targets[0].Levels[0], rep.Targets[1].Levels[0], rep.Comparison[0]
	for name, pair := range map[string][3]Value{
		"x real time": {c.RealTimeX, s.RealTimeX, b.RealTimeX},
		"chars/s":     {c.CharsPerSecond, s.CharsPerSecond, b.CharsPerSecond},
		"ttfb p50":    {c.TTFBP50, s.TTFBP50Ms, b.TTFBP50Ms},
		"ttfb p95":    {c.TTFBP95, s.TTFBP95Ms, b.TTFBP95Ms},
		"rtf p95":     {c.RTFP95, s.RTFP95, b.RTFP95},
	} {
		if math.Abs(float64(pair[0]-pair[1]/pair[2])) > 1e-9 {
			t.Errorf("%s ratio %v, want %v / %v", name, pair[0], pair[1], pair[2])
		}
	}
	if md := markdown(t, rep); !strings.Contains(md, "## voxmux ÷ baseline") || !strings.Contains(md, "## baseline (") {
		t.Errorf("markdown lacks the comparison:\n%s", md)
	}
	var png bytes.Buffer
	if err := rep.WritePNG(&png); err != nil {
		t.Fatal(err)
	}
}

func TestUnknownFiguresStayNull(t *testing.T) {
	// Every request fails: no latency figures, and JSON must still encode (NaN is not JSON).
	srv := httptest.NewServer(&fakeTTS{rate: 24000, samplesPerChar: 10})
	defer srv.Close()
	rep, err := Run(context.Background(), Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{1},
		RequestsPerLevel: 2,
		Corpus:           []Sentence{{"en", "FAIL"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l := rep.Targets[0].Levels[0]
	if l.SuccessRate != 0 || l.TTFBP50Ms.Known() || l.RTFP95.Known() {
		t.Errorf("level %+v", l)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"ttfb_p50_ms": null`) {
		t.Errorf("unknown TTFB not null:\n%s", js.String())
	}
	if err := rep.WritePNG(&bytes.Buffer{}); err != nil {
		t.Fatalf("chart with no data: %v", err)
	}
}

func TestStoppedRunReturnsWhatItHas(t *testing.T) {
	srv := httptest.NewServer(&fakeTTS{rate: 24000, samplesPerChar: 10})
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := Run(ctx, Options{
		Targets:          []Target{{Name: "fake", URL: srv.URL}},
		Concurrency:      []int{1, 2},
		RequestsPerLevel: 2,
	})
	if err == nil || rep == nil {
		t.Fatalf("rep %v err %v, want a partial report and context.Canceled", rep, err)
	}
}

func TestOptionErrors(t *testing.T) {
	for name, o := range map[string]Options{
		"no target":     {},
		"zero level":    {Targets: []Target{{Name: "a", URL: "http://127.0.0.1:1"}}, Concurrency: []int{0}},
		"bad format":    {Targets: []Target{{Name: "a", URL: "http://127.0.0.1:1"}}, Format: "mp3"},
		"three targets": {Targets: []Target{{URL: "a"}, {URL: "b"}, {URL: "c"}}},
	} {
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestQuantile(t *testing.T) {
	if q := quantile(0.5, []float64{3, 1, 2}); q != 2 {
		t.Errorf("median of 1,2,3 = %v", q)
	}
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100..1
	}
	if q := quantile(0.95, xs); q != 95 {
		t.Errorf("P95 of 1..100 = %v, want 95", q)
	}
	if q := quantile(0.95, nil); q.Known() {
		t.Errorf("quantile of nothing = %v", q)
	}
}

// markdown is rep's markdown report.
func markdown(t *testing.T, rep *Report) string {
	t.Helper()
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	return md.String()
}

// TestAllFailedIsAnError: a sweep in which no request got audio, or a server that cannot be
// reached, is an error (so `voxmux bench` exits non-zero), and says what went wrong.
func TestAllFailedIsAnError(t *testing.T) {
	srv := httptest.NewServer(&fakeTTS{rate: 24000, samplesPerChar: 10})
	defer srv.Close()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // a port nothing listens on
	for _, c := range []struct {
		name   string
		url    string
		corpus []Sentence
		warmup int
		want   string
	}{
		{"every request 503", srv.URL, []Sentence{{"en", "FAIL"}}, 0, "HTTP 503 × 2"},
		{"every warm-up 503", srv.URL, []Sentence{{"en", "FAIL"}}, 2, "warm-up"},
		{"unreachable", down.URL, testCorpus, 0, "cannot connect × 2"},
		{"unreachable at warm-up", down.URL, testCorpus, 1, "is the server running"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep, err := Run(context.Background(), Options{
				Targets:          []Target{{Name: "fake", URL: c.url}},
				Concurrency:      []int{1},
				RequestsPerLevel: 2,
				Warmup:           c.warmup,
				Corpus:           c.corpus,
			})
			if err == nil {
				err = rep.Check()
			}
			if !errors.Is(err, ErrAllFailed) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.url) {
				t.Fatalf("error %v, want ErrAllFailed naming %q and the URL", err, c.want)
			}
		})
	}
	// Some requests failing is a measurement, not an error.
	rep, err := Run(context.Background(), Options{
		Targets: []Target{{Name: "fake", URL: srv.URL}}, Concurrency: []int{1}, RequestsPerLevel: 5, Corpus: testCorpus,
	})
	if err != nil || rep.Check() != nil {
		t.Fatalf("partly failing run: %v, %v", err, rep.Check())
	}
}
