package router

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestCORS(t *testing.T) {
	any := &CORSOptions{Origins: []string{"*"}, MaxAge: 10 * time.Minute}
	one := &CORSOptions{Origins: []string{"https://app.example"}, MaxAge: time.Minute}
	preflight := map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
	for _, c := range []struct {
		name                  string
		cors                  *CORSOptions
		method, path          string
		header                map[string]string
		status                int
		allowOrigin, allowHdr string
	}{
		{"preflight, any origin", any, "OPTIONS", "/v1/audio/speech", preflight, 204, "*", "authorization, content-type, x-stainless-os"},
		{"preflight needs no key", any, "OPTIONS", "/v1/models", preflight, 204, "*", "authorization, content-type, x-stainless-os"},
		{"preflight, listed origin", one, "OPTIONS", "/v1/audio/speech", preflight, 204, "https://app.example", "authorization, content-type, x-stainless-os"},
		{"preflight, other origin", one, "OPTIONS", "/v1/audio/speech",
			map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}, 204, "", ""},
		{"preflight, odd header list", any, "OPTIONS", "/v1/audio/speech",
			map[string]string{"Origin": "https://a.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "a b\"c"}, 204, "*", corsHeaders},
		{"preflight, CORS off", nil, "OPTIONS", "/v1/audio/speech", preflight, 405, "", ""},
		{"speech", any, "POST", "/v1/audio/speech", map[string]string{"Origin": "https://a.example"}, 200, "*", ""},
		{"error", any, "POST", "/v1/audio/speech?bad", map[string]string{"Origin": "https://a.example", "Authorization": "Bearer wrong"}, 401, "*", ""},
		{"voices, listed origin", one, "GET", "/v1/audio/voices", map[string]string{"Origin": "https://app.example"}, 200, "https://app.example", ""},
		{"voices, other origin", one, "GET", "/v1/audio/voices", map[string]string{"Origin": "https://evil.example"}, 200, "", ""},
		{"CORS off", nil, "GET", "/v1/audio/voices", map[string]string{"Origin": "https://a.example"}, 200, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			url, _ := serveWith(t, tinyModel, func(o *Options) {
				o.CORS = c.cors
				if c.status == 401 || c.name == "preflight needs no key" {
					o.APIKeys = map[string]struct{}{"sk-right": {}}
				}
			}, ready("a", &fakeSynth{chunks: 1}, 4))
			body := ""
			if c.method == "POST" {
				body = `{"input":"hi","response_format":"pcm"}`
			}
			resp, b := do(t, c.method, url+c.path, body, c.header)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, b)
			}
			if got := resp.Header.Get("Access-Control-Allow-Origin"); got != c.allowOrigin {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", got, c.allowOrigin)
			}
			if c.method == "OPTIONS" && c.allowOrigin != "" {
				if got := resp.Header.Get("Access-Control-Allow-Headers"); got != c.allowHdr {
					t.Errorf("Access-Control-Allow-Headers %q, want %q", got, c.allowHdr)
				}
				if m := resp.Header.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "POST") || !strings.Contains(m, "GET") {
					t.Errorf("Access-Control-Allow-Methods %q", m)
				}
				if resp.Header.Get("Access-Control-Max-Age") != "600" && c.cors == any {
					t.Errorf("Access-Control-Max-Age %q", resp.Header.Get("Access-Control-Max-Age"))
				}
			}
			if c.method != "OPTIONS" && c.allowOrigin != "" && !strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "X-Request-Id") {
				t.Errorf("Access-Control-Expose-Headers %q", resp.Header.Get("Access-Control-Expose-Headers"))
			}
			if c.allowOrigin != "" && c.allowOrigin != "*" && !strings.Contains(resp.Header.Get("Vary"), "Origin") {
				t.Errorf("Vary %q", resp.Header.Get("Vary"))
			}
		})
	}
}

func TestHeadAndHealth(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 1}, 4))
	for _, path := range []string{"/", "/status.json", "/status/app.js", "/v1/audio/voices", "/v1/audio/models", "/v1/models", "/v1/models/tiny", "/healthz", "/health", "/readyz"} {
		get, gbody := do(t, "GET", url+path, "", nil)
		head, hbody := do(t, "HEAD", url+path, "", nil)
		if get.StatusCode != 200 || head.StatusCode != 200 || len(hbody) != 0 {
			t.Errorf("%s: GET %d, HEAD %d with %d body bytes", path, get.StatusCode, head.StatusCode, len(hbody))
			continue
		}
		// /status.json's figures (uptime, recent requests) may change between the two calls.
		sameLen := head.ContentLength == int64(len(gbody)) || path == "/status.json" && head.ContentLength > 0
		if head.Header.Get("Content-Type") != get.Header.Get("Content-Type") || !sameLen {
			t.Errorf("%s: HEAD %q %d, GET %q %d", path, head.Header.Get("Content-Type"), head.ContentLength, get.Header.Get("Content-Type"), len(gbody))
		}
	}
	if resp, body := do(t, "GET", url+"/health", "", nil); string(body) != "ok\n" {
		t.Errorf("/health: %d %q", resp.StatusCode, body)
	}
}

func TestRequestIDBounded(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 1}, 4))
	for _, c := range []struct {
		id   string
		kept bool
	}{
		{"abc-123_x.y:z", true},
		{strings.Repeat("a", maxRequestID), true},
		{strings.Repeat("a", maxRequestID+1), false},
		{strings.Repeat("b", 8000), false},
		{"a b", false},
		{"<script>", false},
		{"é", false},
	} {
		resp, _ := do(t, "GET", url+"/v1/models", "", map[string]string{"X-Request-Id": c.id})
		got := resp.Header.Get("X-Request-Id")
		if c.kept && got != c.id || !c.kept && (got == c.id || len(got) != 24) {
			t.Errorf("X-Request-Id %.40q came back as %.40q", c.id, got)
		}
	}
}

func TestEnumerationsIgnoreCase(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 1}, 4))
	for _, body := range []string{
		`{"input":"hi","response_format":"PCM"}`,
		`{"input":"hi","response_format":"Pcm","voice":"ALLOY"}`,
		`{"input":"hi","response_format":"pcm","voice":"Other","model":"TTS-1"}`,
		`{"input":"hi","response_format":"pcm","model":"Tiny","stream_format":"AUDIO"}`,
	} {
		resp, b := do(t, "POST", url+"/v1/audio/speech", body, nil)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/pcm" || len(b) != 960 {
			t.Errorf("%s: %d %q %d bytes", body, resp.StatusCode, resp.Header.Get("Content-Type"), len(b))
		}
	}
	resp, _ := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi","response_format":"WAV","stream_format":"SSE"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("SSE: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// TestLargeHeadersPass: a browser behind proxies can send many kilobytes of cookies.
func TestLargeHeadersPass(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 1}, 4))
	req, _ := http.NewRequest("GET", url+"/v1/models", nil)
	for i := 0; i < 40; i++ {
		req.AddCookie(&http.Cookie{Name: "c" + strings.Repeat("x", i%7), Value: strings.Repeat("v", 400)})
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("16 KB of cookies: %d", resp.StatusCode)
	}
}
