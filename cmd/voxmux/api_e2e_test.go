package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// appendConfig adds YAML to a config written by writeConfig.
func appendConfig(t *testing.T, path, yaml string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(yaml); err != nil {
		t.Fatal(err)
	}
}

func speechReq(t *testing.T, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	return doRequest(t, "POST", url+"/v1/audio/speech", key, "application/json", strings.NewReader(body))
}

// doRequest sends one request with an optional bearer token and reads the whole answer.
func doRequest(t *testing.T, method, url, token, contentType string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// The real server with API keys from the environment: keys are enforced and never logged, each
// request logs one structured line, and /metrics is what Prometheus' own parser reads, with the
// stage batch counters the instance process reports through Health.
func TestEndToEndKeysLogsMetrics(t *testing.T) {
	listen := freePort(t)
	cfg := writeConfig(t, listen, "  - name: cpu\n    instances: 1\n")
	appendConfig(t, cfg, "model_aliases: [tts-1, house-voice]\napi_keys:\n  env: VOXMUX_TEST_KEYS\n")
	const key = "sk-e2e-7f3a9c"
	s := startServe(t, cfg, listen, "VOXMUX_TEST_KEYS=sk-other,"+key)

	if resp, body := speechReq(t, s.url, "", `{"input":"Hello."}`); resp.StatusCode != 401 || !strings.Contains(string(body), "invalid_api_key") {
		t.Fatalf("without a key: %d %s", resp.StatusCode, body)
	}
	for _, f := range []string{"mp3", "wav", "opus"} {
		resp, body := speechReq(t, s.url, key, `{"model":"house-voice","input":"Hello world.","voice":"alloy","response_format":"`+f+`"}`)
		if resp.StatusCode != 200 || len(body) == 0 {
			t.Fatalf("%s: %d %s", f, resp.StatusCode, body)
		}
	}
	req, _ := http.NewRequest("POST", s.url+"/v1/audio/speech", strings.NewReader(`{"input":"Logged.","response_format":"pcm"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Request-Id", "trace-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("X-Request-Id") != "trace-42" {
		t.Fatalf("X-Request-Id not echoed: %v", resp.Header)
	}

	// The stage counters arrive with the router's next Health poll (every 2 s).
	var fams map[string]*dto.MetricFamily
	// The stage counters come from the instances' Health, which the router polls: wait for a poll
	// that saw every request above (the warm-up and four: at least 5 items in each stage).
	stageItems := func() map[string]float64 {
		stages := map[string]float64{}
		if f := fams["voxmux_stage_batch_items_total"]; f != nil {
			for _, m := range f.Metric {
				for _, l := range m.Label {
					if l.GetName() == "stage" {
						stages[l.GetValue()] = m.Counter.GetValue()
					}
				}
			}
		}
		return stages
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		fams = scrapeMetrics(t, s.url)
		st := stageItems()
		if min(st["lm_prefill"], st["lm_decode"], st["flow"], st["vocoder"]) >= 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"voxmux_requests_total":                      {dto.MetricType_COUNTER, []string{"route", "status", "format"}},
		"voxmux_speech_time_to_first_byte_seconds":   {dto.MetricType_HISTOGRAM, nil},
		"voxmux_speech_duration_seconds":             {dto.MetricType_HISTOGRAM, nil},
		"voxmux_speech_real_time_factor_ratio":       {dto.MetricType_HISTOGRAM, nil},
		"voxmux_audio_produced_seconds_total":        {dto.MetricType_COUNTER, []string{"format"}},
		"voxmux_speech_input_characters_total":       {dto.MetricType_COUNTER, nil},
		"voxmux_speech_response_bytes_total":         {dto.MetricType_COUNTER, []string{"format"}},
		"voxmux_queue_wait_seconds":                  {dto.MetricType_HISTOGRAM, nil},
		"voxmux_queue_length":                        {dto.MetricType_GAUGE, nil},
		"voxmux_inflight_requests":                   {dto.MetricType_GAUGE, []string{"group", "instance"}},
		"voxmux_group_inflight_requests":             {dto.MetricType_GAUGE, []string{"group"}},
		"voxmux_instance_ready":                      {dto.MetricType_GAUGE, []string{"group", "instance"}},
		"voxmux_instance_restarts_total":             {dto.MetricType_COUNTER, []string{"group", "instance"}},
		"voxmux_stage_batches_total":                 {dto.MetricType_COUNTER, []string{"stage", "group", "instance"}},
		"voxmux_stage_batch_items_total":             {dto.MetricType_COUNTER, []string{"stage", "group", "instance"}},
		"voxmux_stage_busy_seconds_total":            {dto.MetricType_COUNTER, []string{"stage", "group", "instance"}},
		"voxmux_stage_wait_seconds_total":            {dto.MetricType_COUNTER, []string{"stage", "group", "instance"}},
		"voxmux_engine_cancels_total":                {dto.MetricType_COUNTER, []string{"group", "instance"}},
		"voxmux_engine_cancel_freeing_seconds_total": {dto.MetricType_COUNTER, []string{"group", "instance"}},
		"go_goroutines":                              {dto.MetricType_GAUGE, nil},
		"process_resident_memory_bytes":              {dto.MetricType_GAUGE, nil},
	}
	for name, w := range want {
		f := fams[name]
		if f == nil {
			t.Errorf("no metric family %s", name)
			continue
		}
		if f.GetType() != w.typ {
			t.Errorf("%s is a %v, want %v", name, f.GetType(), w.typ)
		}
		for _, m := range f.Metric {
			var got []string
			for _, l := range m.Label {
				got = append(got, l.GetName())
			}
			if strings.Join(got, ",") != strings.Join(slices.Sorted(slices.Values(w.labels)), ",") {
				t.Errorf("%s has labels %v, want %v", name, got, w.labels)
			}
		}
	}
	stages := stageItems()
	for _, st := range []string{"lm_prefill", "lm_decode", "flow", "vocoder"} {
		// The warm-up and the four requests above: at least 5 prefilled sequences.
		if stages[st] < 5 {
			t.Errorf("stage %s carried %v items, want at least 5", st, stages[st])
		}
	}
	if ok := hasSeries(fams["voxmux_requests_total"], map[string]string{"route": "/v1/audio/speech", "status": "401", "format": ""}); !ok {
		t.Errorf("the 401 is not counted")
	}
	if ok := hasSeries(fams["voxmux_requests_total"], map[string]string{"route": "/v1/audio/speech", "status": "200", "format": "opus"}); !ok {
		t.Errorf("the opus request is not counted")
	}

	// One line per speech request with the fields operators look for; keys appear nowhere.
	logs := s.logs.String()
	if strings.Contains(logs, key) || strings.Contains(logs, "sk-other") {
		t.Fatalf("an API key is in the logs")
	}
	var line map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil && l["msg"] == "speech" && l["request_id"] == "trace-42" {
			if line != nil {
				t.Fatalf("two log lines for one request")
			}
			line = l
		}
	}
	if line == nil {
		t.Fatalf("no speech log line for trace-42:\n%s", logs)
	}
	for _, k := range []string{"model", "voice", "format", "chars", "audio_seconds", "ttfb_ms", "total_ms", "status", "rtf"} {
		if _, ok := line[k]; !ok {
			t.Errorf("log line lacks %s: %v", k, line)
		}
	}
	if line["format"] != "pcm" || line["chars"] != 7.0 || line["status"] != 200.0 || line["voice"] != "default" || line["model"] != "tiny" {
		t.Errorf("log line %v", line)
	}
}

func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("Prometheus' text parser rejects /metrics: %v", err)
	}
	return fams
}

func hasSeries(f *dto.MetricFamily, labels map[string]string) bool {
	if f == nil {
		return false
	}
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			match = match && got[k] == v
		}
		if match {
			return true
		}
	}
	return false
}
