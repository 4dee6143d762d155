package router

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// syncBuffer collects log output written from the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestInternalErrorsStayInTheLog: what an instance or its connection says about a failure (a
// socket path, gRPC transport text) never reaches the client, and the status is the documented one.
func TestInternalErrorsStayInTheLog(t *testing.T) {
	const secret = "dial unix /tmp/plugin123456: connect: connection refused"
	for _, c := range []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"not ready", &tts.Error{Kind: tts.ErrNotReady, Msg: "connection error: desc = \"transport: " + secret + "\""}, 502, "instance_error"},
		{"internal", &tts.Error{Kind: tts.ErrInternal, Msg: secret}, 502, "instance_error"},
		{"plain", fmt.Errorf("rpc: %s", secret), 502, "instance_error"},
		{"busy", &tts.Error{Kind: tts.ErrBusy, Msg: "instance a at max_inflight (" + secret + ")"}, 429, "rate_limit_exceeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs syncBuffer
			url, _ := serveWith(t, tinyModel, func(o *Options) {
				o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			}, ready("a", &fakeSynth{fail: c.err}, 4))
			resp, body := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi"}`, nil)
			var e openAIError
			if resp.StatusCode != c.status || json.Unmarshal(body, &e) != nil || e.Error.Code == nil || *e.Error.Code != c.code {
				t.Fatalf("%d %s, want %d %s", resp.StatusCode, body, c.status, c.code)
			}
			if strings.Contains(string(body), "/tmp/plugin") || strings.Contains(string(body), "dial") {
				t.Fatalf("the body carries internal text: %s", body)
			}
			if !strings.Contains(logs.String(), "/tmp/plugin123456") {
				t.Fatalf("the log line lost the cause: %s", logs.String())
			}
		})
	}
}

// TestClientValuesAreExcerpted: a huge model, voice or format is quoted back, and logged, only as
// a bounded excerpt.
func TestClientValuesAreExcerpted(t *testing.T) {
	var logs syncBuffer
	url, _ := serveWith(t, tinyModel, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	}, ready("a", &fakeSynth{chunks: 1}, 4))
	huge := strings.Repeat("x", 900<<10)
	for _, field := range []string{"model", "voice", "response_format", "stream_format"} {
		before := len(logs.String())
		resp, body := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi",`+`"`+field+`":"`+huge+`"}`, nil)
		if resp.StatusCode/100 != 4 {
			t.Fatalf("%s: %d", field, resp.StatusCode)
		}
		if len(body) > 1024 || !strings.Contains(string(body), strings.Repeat("x", maxExcerpt)+"…") {
			t.Errorf("%s: %d-byte error body: %.300s", field, len(body), body)
		}
		if line := logs.String()[before:]; len(line) > 2048 {
			t.Errorf("%s: %d-byte log line", field, len(line))
		}
	}
}

// TestMalformedRequestEchoesNothing: fasthttp's own error text quotes the request's bytes; a
// request it cannot parse gets a fixed message, never its headers back.
func TestMalformedRequestEchoesNothing(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 1}, 4))
	addr := strings.TrimPrefix(url, "http://")
	for _, c := range []struct {
		name, req string
		status    int
	}{
		{"bad header line", "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-secret-key\r\nContent-Length: abc\r\n\r\n", 400},
		{"oversized headers", "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-secret-key\r\nCookie: " + strings.Repeat("c", ReadBufferSize+1024) + "\r\n\r\n", 431},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			go conn.Write([]byte(c.req))
			var resp strings.Builder
			r := bufio.NewReader(conn)
			for {
				line, err := r.ReadString('\n')
				resp.WriteString(line)
				if err != nil {
					break
				}
			}
			got := resp.String()
			if !strings.HasPrefix(got, fmt.Sprintf("HTTP/1.1 %d ", c.status)) {
				t.Fatalf("response %.300q", got)
			}
			if strings.Contains(got, "sk-secret-key") || strings.Contains(got, "ccc") {
				t.Fatalf("the error echoes the request: %.500q", got)
			}
		})
	}
}

// TestConnLoggerCutsRequestBytes: fasthttp's messages about a request it could not parse quote
// its bytes; the log keeps the reason only.
func TestConnLoggerCutsRequestBytes(t *testing.T) {
	var logs syncBuffer
	c := connLogger{slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	c.Printf("error when serving connection %q<->%q: %v", "a", "b",
		fmt.Errorf("cannot parse content-length: buffer size=101, contents: %q", "Authorization: Bearer sk-secret-key\r\n"+strings.Repeat("c", 5000)))
	if out := logs.String(); strings.Contains(out, "sk-secret") || len(out) > 600 || !strings.Contains(out, "content-length") {
		t.Fatalf("log %s", out)
	}
}

// TestInstanceVerdictReachesTheClient: an instance's refusal of the input is for the client and
// arrives whole when it is of a reasonable length, bounded when it is not.
func TestInstanceVerdictReachesTheClient(t *testing.T) {
	verdict := "text is too long for model tiny: its 5000 prompt tokens and at least 100 speech tokens need more than the LM's 4096 positions (lm.max_positions)"
	for _, c := range []struct {
		msg, want string
	}{
		{verdict, verdict},
		{strings.Repeat("v", 10000), strings.Repeat("v", maxVerdict) + "…"},
	} {
		url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{fail: &tts.Error{Kind: tts.ErrInvalid, Msg: c.msg}}, 4))
		resp, body := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi"}`, nil)
		var e openAIError
		if resp.StatusCode != 400 || json.Unmarshal(body, &e) != nil || e.Error.Message != c.want {
			t.Errorf("%d %.300s", resp.StatusCode, body)
		}
	}
}
