package router

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/voxmux/voxmux/router/audio"
	"github.com/voxmux/voxmux/tts"
)

func TestULaw(t *testing.T) {
	// G.711's table: silence is 0xFF, full scale 0x80 and 0x00, and the code falls as the level rises.
	got := audio.ULaw(nil, []float32{0, 1, -1, 0.5, -0.5})
	want := []byte{0xFF, 0x80, 0x00, 0x8F, 0x0F}
	if string(got) != string(want) {
		t.Fatalf("ULaw = % x, want % x", got, want)
	}
}

func TestParseElevenFormat(t *testing.T) {
	f, err := parseElevenFormat("")
	if err != nil || f.codec != "mp3" || f.rate != 44100 || f.bitrate != 128000 {
		t.Fatalf("default format %+v, %v", f, err)
	}
	if f, err := parseElevenFormat("ulaw_8000"); err != nil || f.codec != "ulaw" || f.rate != 8000 || f.contentType() != "audio/basic" {
		t.Fatalf("ulaw_8000: %+v, %v", f, err)
	}
	if _, err := parseElevenFormat("opus_48000_32"); err == nil || !strings.Contains(err.Error(), "pcm_24000") {
		t.Fatalf("opus_48000_32 accepted or the error names no format: %v", err)
	}
}

// A chunk's characters are spread over its audio; the whitespace before a segment takes none;
// a broken span chain stops the alignment rather than misplace it.
func TestSpanAligner(t *testing.T) {
	var c charTimes
	a := spanAligner{text: "ab cd", lead: " "}
	a.chunk(&tts.TextSpan{Start: 0, End: 3}, 1, 1.3, &c)
	a.chunk(&tts.TextSpan{Start: 3, End: 5}, 1.3, 1.5, &c)
	s := c.socket(1)
	if strings.Join(s.Chars, "") != " ab cd" {
		t.Fatalf("chars %q", s.Chars)
	}
	wantStart := []int{0, 0, 100, 200, 300, 400}
	wantDur := []int{0, 100, 100, 100, 100, 100}
	for i := range wantStart {
		if s.CharStartTimesMs[i] != wantStart[i] || s.CharDurationsMs[i] != wantDur[i] {
			t.Fatalf("starts %v durations %v, want %v %v", s.CharStartTimesMs, s.CharDurationsMs, wantStart, wantDur)
		}
	}
	var d charTimes
	b := spanAligner{text: "ab"}
	b.chunk(&tts.TextSpan{Start: 1, End: 2}, 0, 1, &d)
	b.chunk(&tts.TextSpan{Start: 0, End: 1}, 1, 2, &d)
	if !d.empty() {
		t.Fatalf("a span chain that does not start at 0 aligned %q", d.chars)
	}
}

// GET /v1/models keeps OpenAI's shape unless asked with xi-api-key; the ElevenLabs endpoints take
// xi-api-key against the same keys and answer errors in ElevenLabs' shape.
func TestElevenLabsHTTP(t *testing.T) {
	url, _ := serveWith(t, tinyModel, func(o *Options) { o.APIKeys = map[string]struct{}{"k1": {}} }, ready("a", &fakeSynth{chunks: 3}, 4))
	bearer := map[string]string{"Authorization": "Bearer k1"}
	xi := map[string]string{"xi-api-key": "k1"}
	if resp, b := do(t, "GET", url+"/v1/models", "", bearer); resp.StatusCode != 200 || !strings.HasPrefix(string(b), `{"object":"list"`) {
		t.Fatalf("OpenAI /v1/models: %d %s", resp.StatusCode, b)
	}
	resp, b := do(t, "GET", url+"/v1/models", "", xi)
	var models []struct {
		ModelID string `json:"model_id"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &models) != nil || models[0].ModelID != "tiny" {
		t.Fatalf("ElevenLabs /v1/models: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, "GET", url+"/v1/voices", "", xi)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `{"voice_id":"default","name":"default","category":"premade"`) {
		t.Fatalf("/v1/voices: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, "GET", url+"/v1/voices", "", map[string]string{"xi-api-key": "wrong"}); resp.StatusCode != 401 {
		t.Fatalf("a wrong xi-api-key got %d", resp.StatusCode)
	}
	resp, b = do(t, "POST", url+"/v1/text-to-speech/other?output_format=pcm_24000", `{"text":"Hello there.","model_id":"eleven_flash_v2_5"}`, xi)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/pcm" || len(b) != 3*480*2 {
		t.Fatalf("convert: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), len(b))
	}
	resp, b = do(t, "POST", url+"/v1/text-to-speech/default/with-timestamps?output_format=ulaw_8000", `{"text":"Hi."}`, xi)
	var stamped struct {
		AudioBase64 string `json:"audio_base64"`
		Alignment   any    `json:"alignment"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &stamped) != nil {
		t.Fatalf("with-timestamps: %d %s", resp.StatusCode, b)
	}
	if a, _ := base64.StdEncoding.DecodeString(stamped.AudioBase64); len(a) != 3*480/3 {
		t.Fatalf("with-timestamps: %d bytes of ulaw_8000, want %d", len(a), 3*480/3)
	}
	for _, tc := range []struct{ path, body, code string }{
		{"/v1/text-to-speech/nobody", `{"text":"Hi."}`, "voice_not_found"},
		{"/v1/text-to-speech/default?output_format=wav_44100", `{"text":"Hi."}`, "invalid_output_format"},
		{"/v1/text-to-speech/default", `{"text":" "}`, "invalid_text"},
		{"/v1/text-to-speech/default", `{"text":"Hi.","model_id":"gpt-9"}`, "model_not_found"},
		{"/v1/text-to-speech/default/stream", `{"text":"Hi.","voice_settings":{"speed":3}}`, "invalid_voice_settings"},
	} {
		resp, b := do(t, "POST", url+tc.path, tc.body, xi)
		var e struct {
			Detail struct{ Status, Message string } `json:"detail"`
		}
		if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || e.Detail.Status != tc.code {
			t.Errorf("%s %s: %d %s, want 400 %s", tc.path, tc.body, resp.StatusCode, b, tc.code)
		}
	}
}

// close_context keeps the text flushed before it and drops the rest: the flushed segment is spoken
// whole, the one cut after the flush never is, and isFinal ends the context.
func TestElevenLabsCloseContextKeepsFlushed(t *testing.T) {
	f := &fakeSynth{chunks: 3, gate: make(chan struct{})}
	url := serveTest(t, ready("a", f, 4))
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(url, "http")+"/v1/text-to-speech/default/multi-stream-input?output_format=pcm_24000", http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func() map[string]any {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var m map[string]any
		if err := c.ReadJSON(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	wsSend(t, c, obj{"text": " ", "context_id": "a"})
	wsSend(t, c, obj{"text": "One two three.", "context_id": "a", "flush": true})
	if m := read(); m["audio"] == nil || m["contextId"] != "a" {
		t.Fatalf("first message %v", m)
	}
	wsSend(t, c, obj{"text": " Four five six. and more", "context_id": "a"})
	wsSend(t, c, obj{"context_id": "a", "close_context": true})
	time.Sleep(100 * time.Millisecond) // the close reaches the session before the audio goes on
	close(f.gate)
	chunks := 1
	for {
		m := read()
		if m["isFinal"] == true {
			break
		}
		if m["error"] != nil {
			t.Fatalf("error %v", m)
		}
		chunks++
	}
	if chunks != 3 {
		t.Fatalf("%d audio messages for the flushed segment of 3 chunks (and none of the dropped one)", chunks)
	}
}
