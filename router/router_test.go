package router

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// fakeSynth produces n chunks of 480 samples; hooks let a test make it fail or wait.
type fakeSynth struct {
	chunks int
	fail   error         // returned before any audio
	failAt int           // >0: fail after this many chunks
	gate   chan struct{} // if set, each chunk after the first waits for a receive
	mu     sync.Mutex
	calls  int
}

func (f *fakeSynth) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	for i := 0; i < f.chunks; i++ {
		if f.failAt > 0 && i == f.failAt {
			return errors.New("instance crashed")
		}
		if f.gate != nil && i > 0 {
			select {
			case <-f.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		pcm := make([]float32, 480)
		for j := range pcm {
			pcm[j] = 0.5
		}
		if err := emit(tts.Chunk{PCM: pcm, SampleRate: 24000, Index: i}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeSynth) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// serveTest runs a Server on a loopback port over the given backends.
func serveTest(t *testing.T, backends ...*Backend) string {
	t.Helper()
	pool := NewPool(Model{Name: "tiny", SampleRate: 24000, Voices: []string{"default", "other"}}, QueueOptions{Size: 0, Timeout: time.Second})
	for _, b := range backends {
		pool.Add(b)
	}
	srv := New(Options{Pool: pool, MaxInputChars: 50, RequestTimeout: 10 * time.Second})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return "http://" + ln.Addr().String()
}

func ready(name string, s Synthesizer, capacity int) *Backend {
	b := &Backend{Name: name, Synth: s, Capacity: capacity}
	b.SetReady(true)
	return b
}

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/audio/speech", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, b
}

func TestBadInput(t *testing.T) {
	url := serveTest(t, ready("a", &fakeSynth{chunks: 2}, 4))
	cases := []struct {
		name, body string
		status     int
		param      string
	}{
		{"malformed JSON", `{"input": "hi"`, 400, ""},
		{"not an object", `[1,2]`, 400, ""},
		{"missing input", `{"model":"tiny"}`, 400, "input"},
		{"empty input", `{"input":"   "}`, 400, "input"},
		{"input over limit", `{"input":"` + strings.Repeat("a", 51) + `"}`, 400, "input"},
		{"unknown format", `{"input":"hi","response_format":"ogg"}`, 400, "response_format"},
		{"speed too low", `{"input":"hi","speed":0.1}`, 400, "speed"},
		{"speed too high", `{"input":"hi","speed":4.5}`, 400, "speed"},
		{"unknown voice", `{"input":"hi","voice":"nobody"}`, 400, "voice"},
		{"bad voice type", `{"input":"hi","voice":7}`, 400, "voice"},
		{"unknown model", `{"model":"gpt-9","input":"hi"}`, 404, "model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, url, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("error body is not OpenAI-shaped JSON: %s", body)
			}
			if e.Error.Message == "" || e.Error.Type != "invalid_request_error" {
				t.Fatalf("error body %s", body)
			}
			if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
				t.Fatalf("param %v, want %q", e.Error.Param, c.param)
			}
		})
	}
	// The server is still up and serves a good request.
	resp, body := post(t, url, `{"input":"hi","voice":{"id":"other"},"response_format":"pcm"}`)
	if resp.StatusCode != 200 || len(body) != 2*2*480 {
		t.Fatalf("good request after bad ones: %d, %d bytes", resp.StatusCode, len(body))
	}
}

func TestBodyTooLarge(t *testing.T) {
	url := serveTest(t, ready("a", &fakeSynth{chunks: 1}, 4))
	for _, n := range []int{1<<20 + 10, 3 << 20} {
		body := `{"input":"` + strings.Repeat("a", n) + `"}`
		resp, b := post(t, url, body)
		if resp.StatusCode != 413 || !strings.Contains(string(b), `"invalid_request_error"`) {
			t.Fatalf("%d-byte body: status %d body %.200s", n, resp.StatusCode, b)
		}
	}
}

func TestWAVStreamsBeforeSynthesisEnds(t *testing.T) {
	gate := make(chan struct{})
	url := serveTest(t, ready("a", &fakeSynth{chunks: 3, gate: gate}, 4))
	resp, err := http.Post(url+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"hello","response_format":"wav"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/wav" || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
	}
	// The header and the first chunk arrive while the synthesizer is still blocked.
	r := bufio.NewReader(resp.Body)
	first := make([]byte, 44+2*480)
	if _, err := io.ReadFull(r, first); err != nil {
		t.Fatalf("first chunk did not arrive before synthesis finished: %v", err)
	}
	if string(first[:4]) != "RIFF" || string(first[8:12]) != "WAVE" {
		t.Fatalf("not a WAV header: %q", first[:12])
	}
	close(gate)
	rest, err := io.ReadAll(r)
	if err != nil || len(rest) != 2*2*480 {
		t.Fatalf("rest: %d bytes, %v", len(rest), err)
	}
}

func TestRetryBeforeAudio(t *testing.T) {
	bad := &fakeSynth{fail: &tts.Error{Kind: tts.ErrInternal, Msg: "boom"}}
	good := &fakeSynth{chunks: 2}
	// bad has the lower load ratio (0 of 100 against 1 of 2), so it is tried first; equal ratios
	// would be a coin toss.
	g := ready("good", good, 2)
	g.inflight.Add(1)
	url := serveTest(t, ready("bad", bad, 100), g)
	resp, body := post(t, url, `{"input":"hi","response_format":"pcm"}`)
	if resp.StatusCode != 200 || len(body) != 2*2*480 {
		t.Fatalf("status %d, %d bytes: %s", resp.StatusCode, len(body), body)
	}
	if bad.Calls() != 1 || good.Calls() != 1 {
		t.Fatalf("calls bad=%d good=%d", bad.Calls(), good.Calls())
	}
}

func TestInvalidIsNotRetried(t *testing.T) {
	a := &fakeSynth{fail: &tts.Error{Kind: tts.ErrInvalid, Msg: "nothing to say"}}
	b := &fakeSynth{fail: &tts.Error{Kind: tts.ErrInvalid, Msg: "nothing to say"}}
	url := serveTest(t, ready("a", a, 4), ready("b", b, 4))
	resp, body := post(t, url, `{"input":"hi"}`)
	if resp.StatusCode != 400 || a.Calls()+b.Calls() != 1 {
		t.Fatalf("status %d calls %d+%d: %s", resp.StatusCode, a.Calls(), b.Calls(), body)
	}
}

func TestFailureAfterAudioCutsTheStream(t *testing.T) {
	url := serveTest(t, ready("a", &fakeSynth{chunks: 5, failAt: 2}, 4))
	resp, err := http.Post(url+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"hi","response_format":"pcm"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("a stream that failed mid-way read as complete (%d bytes)", len(b))
	}
	t.Logf("client saw %d bytes then %v", len(b), err)
}

func TestNoBackendAndFull(t *testing.T) {
	url := serveTest(t)
	resp, body := post(t, url, `{"input":"hi"}`)
	if resp.StatusCode != 503 {
		t.Fatalf("no backends: %d %s", resp.StatusCode, body)
	}
	r, err := http.Get(url + "/readyz")
	if err != nil || r.StatusCode != 503 {
		t.Fatalf("readyz with no backends: %v %v", r.StatusCode, err)
	}

	gate := make(chan struct{})
	url = serveTest(t, ready("a", &fakeSynth{chunks: 2, gate: gate}, 1))
	first, err := http.Post(url+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	resp, body = post(t, url, `{"input":"hi"}`)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("full: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	close(gate)
	io.Copy(io.Discard, first.Body)
}

func TestHealthz(t *testing.T) {
	url := serveTest(t, ready("a", &fakeSynth{chunks: 1}, 1))
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/nope": 404} {
		r, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, r.StatusCode, want)
		}
	}
	r, err := http.Get(url + "/v1/audio/speech")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 405 {
		t.Errorf("GET speech: %d", r.StatusCode)
	}
}

var _ = fmt.Sprintf
