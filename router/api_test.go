package router

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/voxmux/voxmux/tts"
)

// serveWith runs a Server with options of the test's choosing over backends.
func serveWith(t *testing.T, m Model, tweak func(*Options), backends ...*Backend) (string, *Pool) {
	t.Helper()
	pool := NewPool(m, QueueOptions{Size: 0, Timeout: time.Second})
	for _, b := range backends {
		pool.Add(b)
	}
	o := Options{Pool: pool, MaxInputChars: 100, RequestTimeout: 10 * time.Second, ModelAliases: []string{"tts-1"}}
	if tweak != nil {
		tweak(&o)
	}
	srv := New(o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return "http://" + ln.Addr().String(), pool
}

var tinyModel = Model{Name: "tiny", SampleRate: 24000, Voices: []string{"default", "other"}}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func do(t *testing.T, method, url, body string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp, b
}

func TestAPIKeys(t *testing.T) {
	url, _ := serveWith(t, tinyModel, func(o *Options) {
		o.APIKeys = map[string]struct{}{"sk-alpha": {}, "sk-beta": {}}
	}, ready("a", &fakeSynth{chunks: 1}, 4))
	speech := `{"input":"hi","response_format":"pcm"}`
	for _, h := range []map[string]string{
		nil,
		{"Authorization": "Bearer sk-wrong"},
		{"Authorization": "sk-alpha"},
		{"Authorization": "Bearer sk-alph"},
		{"Authorization": "Bearer sk-alpha2"},
	} {
		for _, path := range []string{"/v1/audio/speech", "/v1/audio/voices", "/v1/models"} {
			method := "GET"
			if path == "/v1/audio/speech" {
				method = "POST"
			}
			h2 := map[string]string{"X-Request-Id": "req-401"}
			for k, v := range h {
				h2[k] = v
			}
			resp, body := do(t, method, url+path, speech, h2)
			var e openAIError
			if resp.StatusCode != 401 || json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" ||
				e.Error.Code == nil || *e.Error.Code != "invalid_api_key" {
				t.Errorf("%s with %v: %d %s", path, h, resp.StatusCode, body)
			}
			if resp.Header.Get("X-Request-Id") != "req-401" {
				t.Errorf("401 does not echo X-Request-Id: %v", resp.Header)
			}
			if strings.Contains(string(body), "sk-") {
				t.Errorf("the 401 body echoes a key: %s", body)
			}
		}
	}
	for _, key := range []string{"sk-alpha", "sk-beta"} {
		resp, body := do(t, "POST", url+"/v1/audio/speech", speech, map[string]string{"Authorization": "Bearer " + key})
		if resp.StatusCode != 200 || len(body) != 2*480 {
			t.Errorf("key %s: %d, %d bytes", key, resp.StatusCode, len(body))
		}
	}
	// Operations endpoints and the status page stay open.
	for _, path := range []string{"/healthz", "/readyz", "/status.json", "/", "/status/app.js"} {
		if resp, body := do(t, "GET", url+path, "", nil); resp.StatusCode != 200 {
			t.Errorf("%s without a key: %d %s", path, resp.StatusCode, body)
		}
	}
	var st StatusView
	_, body := do(t, "GET", url+"/status.json", "", nil)
	if err := json.Unmarshal(body, &st); err != nil || !st.AuthRequired || strings.Contains(string(body), "sk-") {
		t.Errorf("status.json: %v %s", err, body)
	}
}

func TestModels(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 1}, 4))
	resp, body := do(t, "GET", url+"/v1/models", "", nil)
	var list struct {
		Object string      `json:"object"`
		Data   []modelInfo `json:"data"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &list) != nil || list.Object != "list" || len(list.Data) != 2 ||
		list.Data[0].ID != "tiny" || list.Data[1].ID != "tts-1" || list.Data[0].Object != "model" || list.Data[0].Created == 0 {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
	resp, body = do(t, "GET", url+"/v1/models/tts-1", "", nil)
	var one modelInfo
	if resp.StatusCode != 200 || json.Unmarshal(body, &one) != nil || one.ID != "tts-1" {
		t.Fatalf("model tts-1: %d %s", resp.StatusCode, body)
	}
	resp, body = do(t, "GET", url+"/v1/models/whisper-1", "", nil)
	var e openAIError
	if resp.StatusCode != 404 || json.Unmarshal(body, &e) != nil || e.Error.Code == nil || *e.Error.Code != "model_not_found" {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
	// The alias reaches the model.
	if resp, body := post(t, url, `{"model":"tts-1","input":"hi","response_format":"pcm"}`); resp.StatusCode != 200 {
		t.Fatalf("alias: %d %s", resp.StatusCode, body)
	}
}

// A model whose voices' licences ask for a credit has it on /status.json (the status page shows
// it) and on every GET /v1/models entry; a model without one has neither.
func TestAttributionShown(t *testing.T) {
	const credit = "Voice: Jenny (Dioco), from the jenny-tts-dataset"
	m := tinyModel
	m.Attribution = credit
	for _, c := range []struct {
		m    Model
		want string
	}{{m, credit}, {tinyModel, ""}} {
		url, _ := serveWith(t, c.m, nil, ready("a", &fakeSynth{chunks: 1}, 4))
		var st StatusView
		_, body := do(t, "GET", url+"/status.json", "", nil)
		if err := json.Unmarshal(body, &st); err != nil || st.Model.Attribution != c.want {
			t.Errorf("status.json: attribution %q (%v), want %q: %s", st.Model.Attribution, err, c.want, body)
		}
		var list struct{ Data []modelInfo }
		_, body = do(t, "GET", url+"/v1/models", "", nil)
		if err := json.Unmarshal(body, &list); err != nil || len(list.Data) != 2 {
			t.Fatalf("models: %v %s", err, body)
		}
		for _, e := range list.Data {
			if e.Attribution != c.want {
				t.Errorf("/v1/models entry %s: attribution %q, want %q", e.ID, e.Attribution, c.want)
			}
		}
		if c.want == "" && strings.Contains(string(body), "attribution") {
			t.Errorf("/v1/models names an attribution the model has not: %s", body)
		}
	}
}

func TestRequestIDEchoed(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 1}, 4))
	for _, c := range []struct{ path, method, body string }{
		{"/v1/audio/speech", "POST", `{"input":"hi"}`},
		{"/v1/audio/speech", "POST", `{"input":""}`},
		{"/v1/audio/voices", "GET", ""},
		{"/v1/models", "GET", ""},
	} {
		resp, _ := do(t, c.method, url+c.path, c.body, map[string]string{"X-Request-Id": "abc-123"})
		if got := resp.Header.Get("X-Request-Id"); got != "abc-123" {
			t.Errorf("%s %s: X-Request-Id %q", c.path, c.body, got)
		}
		resp, _ = do(t, c.method, url+c.path, c.body, nil)
		if got := resp.Header.Get("X-Request-Id"); len(got) != 24 {
			t.Errorf("%s %s: generated X-Request-Id %q", c.path, c.body, got)
		}
	}
}

// sseEvents reads an SSE body into its data payloads.
func sseEvents(t *testing.T, r io.Reader) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			if line != "" {
				t.Errorf("unexpected SSE line %q", line)
			}
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event is not JSON: %q", data)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("SSE stream: %v", err)
	}
	return out
}

func TestSSEUsage(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 5}, 4))
	resp, err := http.Post(url+"/v1/audio/speech", "application/json",
		strings.NewReader(`{"input":"héllo","response_format":"pcm","stream_format":"sse","speed":2}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, %v", resp.StatusCode, resp.Header)
	}
	evs := sseEvents(t, resp.Body)
	if len(evs) < 2 {
		t.Fatalf("%d events", len(evs))
	}
	pcm := 0
	for _, ev := range evs[:len(evs)-1] {
		if ev["type"] != "speech.audio.delta" {
			t.Fatalf("event %v", ev)
		}
		b, err := base64.StdEncoding.DecodeString(ev["audio"].(string))
		if err != nil {
			t.Fatal(err)
		}
		pcm += len(b)
	}
	done := evs[len(evs)-1]
	usage, _ := done["usage"].(map[string]any)
	if done["type"] != "speech.audio.done" || usage == nil {
		t.Fatalf("last event %v", done)
	}
	// 5 chunks of 480 samples at 24 kHz is 100 ms; at speed 2 the audio sent lasts 50 ms.
	if usage["input_tokens"] != 5.0 || usage["output_tokens"] != 50.0 || usage["total_tokens"] != 55.0 {
		t.Fatalf("usage %v, want 5 characters in, 50 ms of audio out", usage)
	}
	// atempo's window makes so short a clip a little longer than 0.05 s.
	if secs := float64(pcm) / 2 / 24000; secs < 0.045 || secs > 0.065 {
		t.Fatalf("%.3f s of audio sent at speed 2, want about 0.05", secs)
	}
}

func TestSSEErrorMidStream(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 5, failAt: 2}, 4))
	resp, err := http.Post(url+"/v1/audio/speech", "application/json",
		strings.NewReader(`{"input":"hi","response_format":"wav","stream_format":"sse"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	evs := sseEvents(t, resp.Body)
	if len(evs) < 2 || evs[0]["type"] != "speech.audio.delta" {
		t.Fatalf("events %v", evs)
	}
	last := evs[len(evs)-1]
	e, _ := last["error"].(map[string]any)
	if last["type"] != "error" || e == nil || e["type"] != "server_error" || e["code"] != "synthesis_failed" ||
		strings.Contains(e["message"].(string), "instance crashed") { // the cause stays in the log
		t.Fatalf("last event %v, want an error event in OpenAI's shape", last)
	}
	for _, ev := range evs {
		if ev["type"] == "speech.audio.done" {
			t.Fatalf("a failed stream sent speech.audio.done")
		}
	}
}

// blockSynth sends nothing until its context ends.
type blockSynth struct{}

func (blockSynth) Synthesize(ctx context.Context, _ tts.Request, _ func(tts.Chunk) error) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestTimeoutBeforeAudioIs504(t *testing.T) {
	url, _ := serveWith(t, tinyModel, func(o *Options) { o.RequestTimeout = 200 * time.Millisecond }, ready("a", blockSynth{}, 4))
	resp, body := post(t, url, `{"input":"hi"}`)
	var e openAIError
	if resp.StatusCode != 504 || json.Unmarshal(body, &e) != nil || e.Error.Type != "server_error" || e.Error.Code == nil || *e.Error.Code != "timeout" {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
}

// recordSynth remembers the requests it got.
type recordSynth struct {
	mu   sync.Mutex
	reqs []tts.Request
}

func (r *recordSynth) Synthesize(_ context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return emit(tts.Chunk{PCM: make([]float32, 480), SampleRate: 24000})
}

func TestInstructionsReachOnlyModelsThatTakeThem(t *testing.T) {
	for _, takes := range []bool{false, true} {
		rec := &recordSynth{}
		m := tinyModel
		m.Instructions = takes
		url, _ := serveWith(t, m, nil, ready("a", rec, 4))
		resp, body := post(t, url, `{"input":"hi","instructions":"Whisper.","response_format":"pcm"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		want := ""
		if takes {
			want = "Whisper."
		}
		if got := rec.reqs[0].Instructions; got != want {
			t.Errorf("model takes instructions=%v: instance got %q, want %q", takes, got, want)
		}
	}
}

func TestStatusPage(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 3}, 4))
	resp, body := do(t, "GET", url+"/", "", nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(body), `id="speak"`) {
		t.Fatalf("/: %d %v", resp.StatusCode, resp.Header)
	}
	for path, ct := range map[string]string{"/status/app.js": "text/javascript", "/status/style.css": "text/css"} {
		resp, body := do(t, "GET", url+path, "", nil)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), ct) || len(body) == 0 {
			t.Errorf("%s: %d %v", path, resp.StatusCode, resp.Header)
		}
	}
	for _, path := range []string{"/status/nope.js", "/status/../router.go", "/index.html"} {
		if resp, _ := do(t, "GET", url+path, "", nil); resp.StatusCode != 404 {
			t.Errorf("%s: %d, want 404", path, resp.StatusCode)
		}
	}
	post(t, url, `{"input":"hello","response_format":"wav"}`)
	post(t, url, `{"input":""}`)
	_, body = do(t, "GET", url+"/status.json", "", nil)
	var st StatusView
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if st.Model.Name != "tiny" || len(st.Formats) != 6 || st.DefaultFormat != "mp3" || !st.Ready || st.AuthRequired {
		t.Fatalf("status %s", body)
	}
	r := st.Recent
	if r.Count != 1 || r.Errors != 1 || len(r.Requests) != 2 || r.Requests[0].Status != 400 || r.Requests[1].Format != "wav" ||
		r.Requests[1].Chars != 5 || r.Requests[1].AudioSeconds != 0.06 || r.TTFBp50 <= 0 || r.RTFp50 <= 0 {
		t.Fatalf("recent %+v", r)
	}
}

func TestRecentRing(t *testing.T) {
	r := newRecentRing(3)
	for i := 1; i <= 5; i++ {
		r.add(recentRequest{Chars: i})
	}
	got := r.list()
	if len(got) != 3 || got[0].Chars != 5 || got[1].Chars != 4 || got[2].Chars != 3 {
		t.Fatalf("%+v", got)
	}
	if q := quantile([]float64{5, 1, 4, 2, 3}, .5); q != 3 {
		t.Fatalf("median %v", q)
	}
}

// fakeMember is a ready Member that answers Health with stage counters.
type fakeMember struct {
	fakeSynth
	restarts int
}

func (m *fakeMember) Status() tts.Status {
	return tts.Status{State: tts.StateReady, Restarts: m.restarts}
}
func (m *fakeMember) Changed() <-chan struct{}          { return make(chan struct{}) }
func (m *fakeMember) Restart(ctx context.Context) error { return nil }
func (m *fakeMember) Health(context.Context) (tts.Health, error) {
	return tts.Health{Ready: true, Stages: []tts.StageStats{{Stage: "lm_decode", Batches: 10, Items: 25, Busy: 2500 * time.Millisecond}, {Stage: "vocoder", Batches: 4, Items: 6, Wait: 750 * time.Millisecond}},
		Cancels: tts.CancelStats{Count: 3, Freeing: 120 * time.Millisecond, MaxFreeing: 60 * time.Millisecond}}, nil
}

// The router's metrics, scraped over HTTP and read back with Prometheus' own text parser.
func TestMetricsScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	pool := NewPool(tinyModel, QueueOptions{Size: 4, Timeout: time.Second})
	m := &fakeMember{fakeSynth: fakeSynth{chunks: 3}, restarts: 2}
	pool.AddGroup(&Group{Name: "g0", Backends: []*Backend{{Name: "g0/0", Synth: m, Member: m, Capacity: 4}}})
	metrics := NewMetrics(reg, pool)
	srv := New(Options{Pool: pool, MaxInputChars: 100, Metrics: reg, RequestMetrics: metrics})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	url := "http://" + ln.Addr().String()
	deadline := time.Now().Add(10 * time.Second)
	for !pool.AnyReady() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go metrics.PollInstances(ctx, 50*time.Millisecond)

	post(t, url, `{"input":"hello","response_format":"mp3"}`)
	post(t, url, `{"input":"hello","response_format":"opus"}`)
	post(t, url, `{"input":""}`)
	do(t, "GET", url+"/v1/audio/voices", "", nil)
	time.Sleep(200 * time.Millisecond) // two polls

	fams := scrape(t, url)
	counter := func(name string, labels map[string]string) float64 {
		t.Helper()
		f := fams[name]
		if f == nil {
			t.Fatalf("no family %s", name)
		}
	metrics:
		for _, mt := range f.Metric {
			for _, lp := range mt.Label {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return mt.Counter.GetValue()
			case dto.MetricType_GAUGE:
				return mt.Gauge.GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(mt.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("%s has no series with %v", name, labels)
		return 0
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"voxmux_requests_total", map[string]string{"route": "/v1/audio/speech", "status": "200", "format": "mp3"}, 1},
		{"voxmux_requests_total", map[string]string{"route": "/v1/audio/speech", "status": "200", "format": "opus"}, 1},
		{"voxmux_requests_total", map[string]string{"route": "/v1/audio/speech", "status": "400", "format": ""}, 1},
		{"voxmux_requests_total", map[string]string{"route": "/v1/audio/voices", "status": "200"}, 1},
		{"voxmux_speech_time_to_first_byte_seconds", nil, 2},
		{"voxmux_speech_duration_seconds", nil, 2},
		{"voxmux_speech_real_time_factor_ratio", nil, 2},
		{"voxmux_audio_produced_seconds_total", map[string]string{"format": "mp3"}, 0.06},
		{"voxmux_speech_input_characters_total", nil, 10},
		{"voxmux_queue_wait_seconds", nil, 2},
		{"voxmux_queue_length", nil, 0},
		{"voxmux_inflight_requests", map[string]string{"group": "g0", "instance": "g0/0"}, 0},
		{"voxmux_group_inflight_requests", map[string]string{"group": "g0"}, 0},
		{"voxmux_instance_restarts_total", map[string]string{"group": "g0", "instance": "g0/0"}, 2},
		{"voxmux_stage_batches_total", map[string]string{"stage": "lm_decode", "instance": "g0/0"}, 10},
		{"voxmux_stage_batch_items_total", map[string]string{"stage": "lm_decode", "instance": "g0/0"}, 25},
		{"voxmux_stage_batch_items_total", map[string]string{"stage": "vocoder", "instance": "g0/0"}, 6},
		{"voxmux_stage_busy_seconds_total", map[string]string{"stage": "lm_decode", "instance": "g0/0"}, 2.5},
		{"voxmux_stage_wait_seconds_total", map[string]string{"stage": "vocoder", "instance": "g0/0"}, 0.75},
		{"voxmux_engine_cancels_total", map[string]string{"instance": "g0/0"}, 3},
		{"voxmux_engine_cancel_freeing_seconds_total", map[string]string{"instance": "g0/0"}, 0.12},
	}
	for _, c := range checks {
		if got := counter(c.name, c.labels); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := counter("voxmux_speech_response_bytes_total", map[string]string{"format": "opus"}); got <= 0 {
		t.Errorf("opus bytes %v", got)
	}
	checkNames(t, fams)
}

// scrape fetches /metrics and parses it with Prometheus' text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("Prometheus cannot parse /metrics: %v", err)
	}
	return fams
}

// checkNames holds voxmux's metrics to Prometheus' naming: the prefix, and a unit or _total suffix.
func checkNames(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	for name, f := range fams {
		if !strings.HasPrefix(name, "voxmux_") {
			continue
		}
		if !model.LegacyValidation.IsValidMetricName(name) {
			t.Errorf("%s is not a valid metric name", name)
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
		case dto.MetricType_HISTOGRAM:
			if !strings.HasSuffix(name, "_seconds") && !strings.HasSuffix(name, "_ratio") && !strings.HasSuffix(name, "_bytes") {
				t.Errorf("histogram %s has no unit suffix", name)
			}
		}
	}
}
