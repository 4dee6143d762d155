package main

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

// ElevenLabs' text-to-speech sockets against a real `voxmux serve` (the tiny model in an
// instance process), driven by a client written from ElevenLabs' public API reference.

// elevenMsg is a server message of ElevenLabs' sockets.
type elevenMsg struct {
	Audio     *string `json:"audio"`
	IsFinal   *bool   `json:"isFinal"`
	ContextID string  `json:"contextId"`
	Alignment *struct {
		Chars            []string `json:"chars"`
		CharStartTimesMs []int    `json:"charStartTimesMs"`
		CharDurationsMs  []int    `json:"charDurationsMs"`
	} `json:"alignment"`
	NormalizedAlignment *json.RawMessage `json:"normalizedAlignment"`
	Error               string           `json:"error"`
	Message             string           `json:"message"`
	audio               []byte
}

func elevenDial(t *testing.T, base, path string, hdr http.Header) *websocket.Conn {
	t.Helper()
	c, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(base, "http")+path, hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (status %d)", path, err, status)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func elevenRead(t *testing.T, c *websocket.Conn) elevenMsg {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	mt, b, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if mt != websocket.TextMessage {
		t.Fatalf("a binary frame: ElevenLabs' sockets send JSON")
	}
	var m elevenMsg
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Audio != nil {
		if m.audio, err = base64.StdEncoding.DecodeString(*m.Audio); err != nil {
			t.Fatalf("audio is not base64: %v", err)
		}
	}
	return m
}

// elevenCtx is what one context received.
type elevenCtx struct {
	audio    []byte
	chars    string
	messages int
	final    bool
}

// checkAlignment checks a message's alignment: as many times as characters, starts never
// decreasing, durations not negative, nothing past the message's audio (ms at bytesPerMs).
func checkAlignment(t *testing.T, m elevenMsg, bytesPerMs float64) {
	t.Helper()
	a := m.Alignment
	if a == nil {
		return
	}
	if len(a.Chars) != len(a.CharStartTimesMs) || len(a.Chars) != len(a.CharDurationsMs) {
		t.Fatalf("alignment of %d chars, %d starts, %d durations", len(a.Chars), len(a.CharStartTimesMs), len(a.CharDurationsMs))
	}
	audioMs := float64(len(m.audio)) / bytesPerMs
	for i := range a.Chars {
		if a.CharDurationsMs[i] < 0 || i > 0 && a.CharStartTimesMs[i] < a.CharStartTimesMs[i-1] {
			t.Fatalf("alignment not monotonic: %v %v", a.CharStartTimesMs, a.CharDurationsMs)
		}
		if end := float64(a.CharStartTimesMs[i] + a.CharDurationsMs[i]); bytesPerMs > 0 && end > audioMs+5 {
			t.Fatalf("character %q ends at %.0f ms of a message of %.0f ms", a.Chars[i], end, audioMs)
		}
	}
	if m.NormalizedAlignment == nil {
		t.Fatalf("audio with alignment but no normalizedAlignment")
	}
}

func TestElevenLabsMultiContextAgainstServe(t *testing.T) {
	listen := freePort(t)
	cfg := writeConfig(t, listen, "  - name: cpu\n    instances: 1\nrealtime:\n  min_chars: 10\n  idle_flush: 0s\n")
	appendConfig(t, cfg, "api_keys:\n  env: VOXMUX_EL_KEYS\n")
	const key = "sk-eleven-e2e-1"
	s := startServe(t, cfg, listen, "VOXMUX_EL_KEYS="+key)
	path := "/v1/text-to-speech/default/multi-stream-input?model_id=eleven_flash_v2_5&output_format=pcm_16000&sync_alignment=true&auto_mode=false&inactivity_timeout=60"

	// A wrong key in the header is refused at the upgrade; in the first message, the socket closes.
	_, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(s.url, "http")+path, http.Header{"xi-api-key": {"wrong"}})
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("wrong xi-api-key header: %v, %+v", err, resp)
	}
	bad := elevenDial(t, s.url, path, nil)
	if err := bad.WriteJSON(map[string]any{"text": " ", "xi_api_key": "wrong"}); err != nil {
		t.Fatal(err)
	}
	if m := elevenRead(t, bad); m.Error != "invalid_api_key" {
		t.Fatalf("wrong xi_api_key answered %+v", m)
	}
	if _, _, err := bad.ReadMessage(); !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
		t.Fatalf("after a wrong key the socket should close with 1008, got %v", err)
	}

	// The key in the first message, as browsers send it.
	c := elevenDial(t, s.url, path, nil)
	send := func(v map[string]any) {
		t.Helper()
		if err := c.WriteJSON(v); err != nil {
			t.Fatal(err)
		}
	}
	send(map[string]any{"text": " ", "context_id": "a", "xi_api_key": key, "voice_settings": map[string]any{"stability": 0.5, "similarity_boost": 0.8, "speed": 1},
		"generation_config": map[string]any{"chunk_length_schedule": []int{50, 90, 120, 150}}})
	send(map[string]any{"text": " ", "context_id": "b"})
	textA := "Hello there. How are you today?"
	// Flushed a sentence at a time, as LiveKit's plugin does: the space a flush leaves behind
	// still reaches the alignment.
	for _, piece := range []string{"Hello ", "there. ", "How are ", "you today?"} {
		send(map[string]any{"text": piece, "context_id": "a", "flush": strings.HasSuffix(piece, ". ")})
	}
	send(map[string]any{"text": "Second context speaks too.", "context_id": "b", "flush": true})
	send(map[string]any{"context_id": "a", "flush": true})
	// close_context after the last flush: the flushed text is still spoken, then isFinal.
	send(map[string]any{"context_id": "a", "close_context": true})

	got := map[string]*elevenCtx{}
	for got["a"] == nil || !got["a"].final || got["b"] == nil || got["b"].messages == 0 {
		m := elevenRead(t, c)
		if m.Error != "" {
			t.Fatalf("error %s: %s", m.Error, m.Message)
		}
		g := got[m.ContextID]
		if g == nil {
			g = &elevenCtx{}
			got[m.ContextID] = g
		}
		if g.final {
			t.Fatalf("context %q sent a message after isFinal", m.ContextID)
		}
		if m.IsFinal != nil && *m.IsFinal {
			g.final = true
			continue
		}
		checkAlignment(t, m, 32) // 16-bit samples at 16 kHz: 32 bytes a millisecond
		g.audio = append(g.audio, m.audio...)
		g.messages++
		if m.Alignment != nil {
			g.chars += strings.Join(m.Alignment.Chars, "")
		}
	}
	a := got["a"]
	if a.chars != textA {
		t.Errorf("context a's alignment spells %q, want %q", a.chars, textA)
	}
	// The tiny model speaks 2 to 4 speech tokens a character at 25 tokens a second.
	secs := float64(len(a.audio)) / 32000
	if n := float64(len(textA)); secs < n*2/25*0.9 || secs > n*4/25*1.1 {
		t.Errorf("context a: %.2f s of pcm_16000 for %d characters", secs, len(textA))
	}

	// close_context mid-turn: text not flushed is dropped and its synthesis cancelled; isFinal
	// comes at once and nothing more of the context.
	long := strings.Repeat("A long reply that the user interrupts before it ends. ", 4)
	for _, tok := range strings.SplitAfter(long, " ") {
		send(map[string]any{"text": tok, "context_id": "c"})
	}
	for {
		m := elevenRead(t, c)
		if m.Error != "" {
			t.Fatalf("error %s: %s", m.Error, m.Message)
		}
		if m.ContextID == "c" && m.Audio != nil {
			break
		}
		if m.ContextID == "b" && m.IsFinal != nil {
			t.Fatalf("context b ended without close_context")
		}
	}
	send(map[string]any{"context_id": "c", "close_context": true})
	deadline := time.Now().Add(5 * time.Second)
	for {
		m := elevenRead(t, c)
		if m.ContextID == "c" && m.IsFinal != nil && *m.IsFinal {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no isFinal for context c within 5 s of close_context")
		}
	}
	// The engine counted the cancel (its counters reach the router every 2 s).
	deadline = time.Now().Add(20 * time.Second)
	for {
		cancels := 0.0
		for _, m := range scrapeMetrics(t, s.url)["voxmux_engine_cancels_total"].GetMetric() {
			cancels += m.GetCounter().GetValue()
		}
		if cancels >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the barge-in never reached the instance's engine")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// close_socket: b (already flushed) ends with isFinal, then the socket closes normally.
	send(map[string]any{"close_socket": true})
	for {
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		_, b, err := c.ReadMessage()
		if err != nil {
			if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				t.Fatalf("close_socket ended with %v", err)
			}
			break
		}
		var m elevenMsg
		_ = json.Unmarshal(b, &m)
		if m.ContextID == "c" {
			t.Fatalf("context c sent %s after its isFinal", b)
		}
		if m.ContextID == "b" && m.IsFinal != nil {
			got["b"].final = true
		}
	}
	if !got["b"].final {
		t.Errorf("context b closed by close_socket without isFinal")
	}
}

// Each output_format on stream-input decodes to the same speech at its own rate: pcm at its
// rate, μ-law at 8 kHz, MP3 at 44.1 kHz and 128 kbit/s.
func TestElevenLabsFormatsAgainstServe(t *testing.T) {
	needCommand(t, "ffmpeg", "ffprobe")
	listen := freePort(t)
	s := startServe(t, writeConfig(t, listen, "  - name: cpu\n    instances: 1\n"), listen)
	const text = "The quick brown fox jumps over the lazy dog."
	speak := func(format string) []byte {
		c := elevenDial(t, s.url, "/v1/text-to-speech/default/stream-input?model_id=eleven_multilingual_v2&output_format="+format, http.Header{"xi-api-key": {"any"}})
		for _, m := range []map[string]any{{"text": " "}, {"text": "The quick brown fox "}, {"text": "jumps over the lazy dog. "}, {"text": ""}} {
			if err := c.WriteJSON(m); err != nil {
				t.Fatal(err)
			}
		}
		var audio []byte
		var chars string
		for {
			m := elevenRead(t, c)
			if m.Error != "" {
				t.Fatalf("%s: error %s: %s", format, m.Error, m.Message)
			}
			if m.IsFinal != nil && *m.IsFinal {
				break
			}
			audio = append(audio, m.audio...)
			if m.Alignment != nil {
				chars += strings.Join(m.Alignment.Chars, "")
			}
		}
		if chars != text {
			t.Errorf("%s: alignment spells %q", format, chars)
		}
		if _, _, err := c.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			t.Errorf("%s: after isFinal stream-input should close normally, got %v", format, err)
		}
		return audio
	}
	want := float64(len(speak("pcm_24000"))) / 2 / 24000
	if n := float64(len(text)); want < n*2/25 || want > n*4/25 {
		t.Fatalf("pcm_24000: %.2f s for %d characters", want, len(text))
	}
	dir := t.TempDir()
	for _, f := range []struct {
		format   string
		ffmpegIn []string // how ffmpeg reads it
		rate     string   // what ffprobe finds
		minKbps  int
	}{
		{"pcm_16000", []string{"-f", "s16le", "-ar", "16000", "-ac", "1"}, "16000", 0},
		{"pcm_22050", []string{"-f", "s16le", "-ar", "22050", "-ac", "1"}, "22050", 0},
		{"pcm_44100", []string{"-f", "s16le", "-ar", "44100", "-ac", "1"}, "44100", 0},
		{"ulaw_8000", []string{"-f", "mulaw", "-ar", "8000", "-ac", "1"}, "8000", 0},
		{"mp3_44100_128", nil, "44100", 120},
	} {
		audio := speak(f.format)
		file := filepath.Join(dir, f.format)
		if err := os.WriteFile(file, audio, 0o644); err != nil {
			t.Fatal(err)
		}
		probe := append([]string{"-v", "error"}, f.ffmpegIn...)
		probe = append(probe, "-select_streams", "a:0", "-show_entries", "stream=sample_rate,bit_rate", "-of", "csv=p=0", file)
		out, err := exec.Command("ffprobe", probe...).Output()
		if err != nil {
			t.Fatalf("%s: ffprobe: %v", f.format, err)
		}
		fields := strings.Split(strings.TrimSpace(string(out)), ",")
		if fields[0] != f.rate {
			t.Errorf("%s: ffprobe finds %s Hz, want %s", f.format, fields[0], f.rate)
		}
		if bps, _ := strconv.Atoi(fields[len(fields)-1]); f.minKbps > 0 && bps < f.minKbps*1000 {
			t.Errorf("%s: ffprobe finds %v bit/s, want 128 kbit/s", f.format, fields)
		}
		args := append([]string{"-v", "error"}, f.ffmpegIn...)
		args = append(args, "-i", file, "-f", "s16le", "-ar", "24000", "-ac", "1", "pipe:1")
		dec, err := exec.Command("ffmpeg", args...).Output()
		if err != nil {
			t.Fatalf("%s: ffmpeg cannot decode it: %v", f.format, err)
		}
		got := float64(len(dec)) / 2 / 24000
		if got < 0.9*want || got > 1.1*want+0.06 {
			t.Errorf("%s: decodes to %.3f s, want %.3f s", f.format, got, want)
		}
		t.Logf("%-14s %6d bytes, %.3f s", f.format, len(audio), got)
	}
}
