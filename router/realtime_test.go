package router

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/voxmux/voxmux/tts"
)

func TestSegmenter(t *testing.T) {
	g := segmenter{minChars: 10, maxChars: 40}
	for _, tc := range []struct {
		in    string
		flush bool
		segs  []string
		rest  string
	}{
		{"Hello world.", false, nil, "Hello world."},                                  // "." waits for what follows
		{"Hello world. How", false, []string{"Hello world."}, " How"},                 // a sentence end
		{"Really? Yes", false, []string{"Really?"}, " Yes"},                           // ? at once
		{"Wow!", false, []string{"Wow!"}, ""},                                         // ! needs nothing after it
		{"It costs 3.5 dollars, ok", false, []string{"It costs 3.5 dollars,"}, " ok"}, // "3.5" is no end
		{"Hi, there", false, nil, "Hi, there"},                                        // a clause under min_chars
		{"line one\nline two", false, []string{"line one\n"}, "line two"},
		{"no punctuation at all in this long run of words here", false, []string{"no punctuation at all in this long run "}, "of words here"},
		{"tail", true, []string{"tail"}, ""},
		{"   ", true, nil, ""},
		{"你好，世界。再见", false, []string{"你好，世界。"}, "再见"},
	} {
		segs, rest := g.split(tc.in, tc.flush)
		if strings.Join(segs, "|") != strings.Join(tc.segs, "|") || rest != tc.rest {
			t.Errorf("split(%q, %v) = %q, %q; want %q, %q", tc.in, tc.flush, segs, rest, tc.segs, tc.rest)
		}
	}
}

// Words are placed on the audio by the chunks' text spans: exact at chunk ends, interpolated
// inside; without spans they are spread over the segment when it ends.
func TestAligner(t *testing.T) {
	text := "one two three"
	a := newAligner(text, 100, 2, 1000)
	w := a.chunk(1000, &tts.TextSpan{Start: 0, End: 4}) // "one " over 1 s
	if len(w) != 1 || w[0].Word != "one" || w[0].Start != 2 || w[0].End != 2.75 || w[0].CharStart != 100 || w[0].CharEnd != 103 {
		t.Fatalf("first chunk words %+v", w)
	}
	w = a.chunk(2000, &tts.TextSpan{Start: 4, End: 13}) // "two three" over 2 s
	if len(w) != 2 || w[0].Start != 3 || w[1].Word != "three" || w[1].End != 5 {
		t.Fatalf("second chunk words %+v", w)
	}
	if w := a.finish(); len(w) != 0 {
		t.Fatalf("finish placed %+v again", w)
	}
	b := newAligner("ab cd", 0, 0, 100)
	if w := b.chunk(100, nil); w != nil {
		t.Fatalf("words without spans before the end: %+v", w)
	}
	w = b.finish()
	if len(w) != 2 || w[0].Start != 0 || w[0].End != 0.4 || w[1].Start != 0.6 || w[1].End != 1 {
		t.Fatalf("spread words %+v", w)
	}
}

// wsDial connects to the test server's stream endpoint.
func wsDial(t *testing.T, base string, hdr http.Header, protocols ...string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: protocols, HandshakeTimeout: 5 * time.Second}
	c, resp, err := d.Dial("ws"+strings.TrimPrefix(base, "http")+RealtimePath, hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial: %v (status %d)", err, status)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type wsMsg struct {
	Type         string  `json:"type"`
	Voice        string  `json:"voice"`
	ContextID    string  `json:"context_id"`
	SegmentIndex int     `json:"segment_index"`
	Text         string  `json:"text"`
	Code         string  `json:"code"`
	Message      string  `json:"message"`
	Param        string  `json:"param"`
	Reason       string  `json:"reason"`
	Bytes        int     `json:"bytes"`
	Start        float64 `json:"start"`
	End          float64 `json:"end"`
	Words        []Word  `json:"words"`
	SampleRate   int     `json:"sample_rate"`
	Audio        *string `json:"audio"`
	audio        []byte
}

// wsRead reads the next message; an audio.delta gets its binary frame.
func wsRead(t *testing.T, c *websocket.Conn) wsMsg {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	mt, b, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if mt != websocket.TextMessage {
		t.Fatalf("a binary frame without its audio.delta")
	}
	var m wsMsg
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Type == "audio.delta" && m.Audio != nil {
		if m.audio, err = base64.StdEncoding.DecodeString(*m.Audio); err != nil || len(m.audio) != m.Bytes {
			t.Fatalf("audio.delta of %d bytes carries %d bytes of base64 audio, %v", m.Bytes, len(m.audio), err)
		}
	} else if m.Type == "audio.delta" {
		mt, m.audio, err = c.ReadMessage()
		if err != nil || mt != websocket.BinaryMessage || len(m.audio) != m.Bytes {
			t.Fatalf("audio.delta of %d bytes followed by frame type %d of %d bytes, %v", m.Bytes, mt, len(m.audio), err)
		}
	}
	return m
}

func wsSend(t *testing.T, c *websocket.Conn, v any) {
	t.Helper()
	if err := c.WriteJSON(v); err != nil {
		t.Fatal(err)
	}
}

type obj = map[string]any

// The whole protocol on one context: text arriving in LLM-sized deltas is spoken a segment at a
// time, each segment's audio framed by audio.start and audio.done; input.done closes the context
// and close ends the session.
func TestRealtimeSession(t *testing.T) {
	f := &fakeSynth{chunks: 3}
	url := serveTest(t, ready("a", f, 4))
	c := wsDial(t, url, nil)
	wsSend(t, c, obj{"type": "input.text", "text": "early"})
	if m := wsRead(t, c); m.Type != "error" || m.Code != "session_not_configured" {
		t.Fatalf("text before session.config: %+v", m)
	}
	wsSend(t, c, obj{"type": "session.config", "voice": "other", "response_format": "pcm", "sample_rate": 16000, "seed": 7})
	if m := wsRead(t, c); m.Type != "session.created" || m.SampleRate != 16000 {
		t.Fatalf("session.config answered %+v", m)
	}
	for _, tok := range []string{"Hello", " world", ".", " How", " are", " you", "?"} {
		wsSend(t, c, obj{"type": "input.text", "text": tok})
	}
	wsSend(t, c, obj{"type": "input.done"})
	var got []string
	pcmBytes := 0
	for {
		m := wsRead(t, c)
		if len(got) == 0 || m.Type != "audio.delta" || got[len(got)-1] != "audio.delta" {
			got = append(got, m.Type) // a run of audio.delta counts once
		}
		switch m.Type {
		case "audio.start":
			if want := []string{"Hello world.", "How are you?"}[m.SegmentIndex]; m.Text != want {
				t.Errorf("segment %d text %q, want %q", m.SegmentIndex, m.Text, want)
			}
		case "audio.delta":
			pcmBytes += len(m.audio)
		case "audio.done":
			if want := []int{2, 3}[m.SegmentIndex]; len(m.Words) != want {
				t.Errorf("segment %d: words %+v, want its two words", m.SegmentIndex, m.Words)
			}
		}
		if m.Type == "context.closed" {
			if m.Reason != "done" || m.ContextID != "default" {
				t.Errorf("context.closed %+v", m)
			}
			break
		}
	}
	want := "audio.start audio.delta audio.done audio.start audio.delta audio.done context.closed"
	if strings.Join(got, " ") != want {
		t.Errorf("messages %s\nwant %s", strings.Join(got, " "), want)
	}
	// 2 segments × 3 chunks × 480 samples at 24 kHz, sent at 16 kHz as 16-bit samples.
	if want := 2 * 3 * 480 * 2 / 3 * 2; pcmBytes < want-64 || pcmBytes > want+64 {
		t.Errorf("%d bytes of pcm, want about %d", pcmBytes, want)
	}
	wsSend(t, c, obj{"type": "close"})
	if m := wsRead(t, c); m.Type != "session.done" {
		t.Fatalf("close answered %+v", m)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
		t.Fatalf("after session.done: %v, want a normal close", err)
	}
}

// cancelSynth speaks chunks until its request is cancelled, and reports the cancel.
type cancelSynth struct {
	mu        sync.Mutex
	cancelled map[string]bool
}

func (s *cancelSynth) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	for i := 0; ; i++ {
		if err := emit(tts.Chunk{PCM: make([]float32, 480), SampleRate: 24000, Index: i}); err != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
			continue
		}
		break
	}
	s.mu.Lock()
	s.cancelled[req.Text] = true
	s.mu.Unlock()
	return ctx.Err()
}

// Two contexts on one connection; closing one (a barge-in) cancels its request at the instance,
// answers context.closed and sends nothing more of it, while the other goes on.
func TestRealtimeCloseContext(t *testing.T) {
	s := &cancelSynth{cancelled: map[string]bool{}}
	url := serveTest(t, ready("a", s, 4))
	c := wsDial(t, url, nil)
	wsSend(t, c, obj{"type": "session.config", "audio_encoding": "base64"})
	wsRead(t, c)
	wsSend(t, c, obj{"type": "input.text", "context_id": "a", "text": "Never ending a.", "flush": true})
	wsSend(t, c, obj{"type": "input.text", "context_id": "b", "text": "Never ending b.", "flush": true})
	seen := map[string]int{}
	for seen["a"] < 3 || seen["b"] < 3 {
		m := wsRead(t, c)
		if m.Type == "audio.delta" {
			seen[m.ContextID]++
		}
	}
	wsSend(t, c, obj{"type": "close_context", "context_id": "a"})
	closed := false
	for n := 0; n < 20; n++ {
		m := wsRead(t, c)
		if m.ContextID == "a" && closed {
			t.Fatalf("context a sent %s after context.closed", m.Type)
		}
		if m.Type == "context.closed" {
			if m.ContextID != "a" || m.Reason != "cancelled" {
				t.Fatalf("context.closed %+v", m)
			}
			closed = true
		}
	}
	if !closed {
		t.Fatal("no context.closed for a")
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		a, b := s.cancelled["Never ending a."], s.cancelled["Never ending b."]
		s.mu.Unlock()
		if a {
			if b {
				t.Fatal("closing context a cancelled b too")
			}
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Closing the socket cancels the rest.
	c.Close()
	for time.Now().Before(deadline) {
		s.mu.Lock()
		b := s.cancelled["Never ending b."]
		s.mu.Unlock()
		if b {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the instance never saw context b cancelled after the socket closed")
}

// API keys apply to the socket as to HTTP: an Authorization header, or (browsers) the
// subprotocol bearer.KEY, the server then selecting voxmux.v1.
func TestRealtimeAuth(t *testing.T) {
	pool := NewPool(tinyModel, QueueOptions{Size: 1, Timeout: time.Second})
	pool.Add(ready("a", &fakeSynth{chunks: 1}, 1))
	srv := New(Options{Pool: pool, MaxInputChars: 100, APIKeys: map[string]struct{}{"k1": {}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	base := "ws://" + ln.Addr().String() + RealtimePath
	if _, resp, err := websocket.DefaultDialer.Dial(base, nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("no key: %v", err)
	}
	if _, resp, err := (&websocket.Dialer{Subprotocols: []string{"voxmux.v1", "bearer.wrong"}}).Dial(base, nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("wrong key: %v", err)
	}
	c, _, err := websocket.DefaultDialer.Dial(base, http.Header{"Authorization": {"Bearer k1"}})
	if err != nil {
		t.Fatalf("header key: %v", err)
	}
	c.Close()
	c, _, err = (&websocket.Dialer{Subprotocols: []string{"voxmux.v1", "bearer.k1"}}).Dial(base, nil)
	if err != nil {
		t.Fatalf("subprotocol key: %v", err)
	}
	if c.Subprotocol() != "voxmux.v1" {
		t.Errorf("selected subprotocol %q", c.Subprotocol())
	}
	c.Close()
}

// A segment queued behind a full instance whose socket closes leaves the queue at once; a live
// request behind it is served.
func TestRealtimeQueuedSegmentDropped(t *testing.T) {
	gate := make(chan struct{})
	f := &fakeSynth{chunks: 2, gate: gate}
	pool := NewPool(tinyModel, QueueOptions{Size: 1, Timeout: 30 * time.Second})
	pool.Add(ready("a", f, 1))
	srv := New(Options{Pool: pool, MaxInputChars: 100})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	url := "http://" + ln.Addr().String()

	busy := wsDial(t, url, nil)
	wsSend(t, busy, obj{"type": "session.config"})
	wsRead(t, busy)
	wsSend(t, busy, obj{"type": "input.text", "text": "Holds the slot.", "flush": true})
	for m := wsRead(t, busy); m.Type != "audio.delta"; m = wsRead(t, busy) {
	}
	gone := wsDial(t, url, nil)
	wsSend(t, gone, obj{"type": "session.config"})
	wsRead(t, gone)
	wsSend(t, gone, obj{"type": "input.text", "text": "Waits, then leaves.", "flush": true})
	waitFor(t, func() bool { return pool.QueueLen() == 1 }, "the segment to queue")
	gone.Close()
	waitFor(t, func() bool { return pool.QueueLen() == 0 }, "the abandoned segment to leave the queue")

	live := wsDial(t, url, nil)
	wsSend(t, live, obj{"type": "session.config"})
	wsRead(t, live)
	wsSend(t, live, obj{"type": "input.text", "text": "Served next.", "flush": true})
	waitFor(t, func() bool { return pool.QueueLen() == 1 }, "the live segment to queue")
	close(gate) // the busy request ends
	for {
		m := wsRead(t, live)
		if m.Type == "audio.done" {
			break
		}
		if m.Type == "error" {
			t.Fatalf("live request: %+v", m)
		}
	}
	if n := f.Calls(); n != 2 {
		t.Errorf("instance ran %d requests, want 2 (the abandoned one never)", n)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Text for a context after its input.done is refused, not silently dropped.
func TestRealtimeTextAfterInputDone(t *testing.T) {
	gate := make(chan struct{})
	url := serveTest(t, ready("a", &fakeSynth{chunks: 2, gate: gate}, 4))
	c := wsDial(t, url, nil)
	wsSend(t, c, obj{"type": "session.config"})
	wsRead(t, c)
	wsSend(t, c, obj{"type": "input.text", "text": "Done soon."})
	wsSend(t, c, obj{"type": "input.done"})
	wsSend(t, c, obj{"type": "input.text", "text": "Too late."})
	for {
		m := wsRead(t, c)
		if m.Type == "error" {
			if m.Code != "context_closing" {
				t.Fatalf("error %+v", m)
			}
			break
		}
	}
	close(gate)
	for m := wsRead(t, c); m.Type != "context.closed"; m = wsRead(t, c) {
		if m.Type == "audio.start" && m.Text != "Done soon." {
			t.Fatalf("spoke %q", m.Text)
		}
	}
}

// A session.config's ref_audio and ref_text clone the session's voice as a speech request's do:
// the voice is computed once, before session.created, and every segment speaks in it; a bad clip
// gets the HTTP API's code, message and param, and leaves the session unconfigured.
func TestRealtimeRefAudio(t *testing.T) {
	c := newCloner(nil)
	const maxUpload = 100_000
	url := serveLibrary(t, t.TempDir(), c, func(o *Options) { o.MaxUploadBytes = maxUpload })
	if resp, b := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	clips := c.clips.Load()
	ref := base64.StdEncoding.EncodeToString(wav16(16000, 3))
	ws := wsDial(t, url, nil)
	for _, tc := range []struct {
		name        string
		config      obj
		code, param string
		words       string
	}{
		{"no ref_text", obj{"ref_audio": ref}, "invalid_value", "ref_text", "ref_audio needs ref_text"},
		{"no ref_audio", obj{"ref_text": "hello"}, "invalid_value", "ref_audio", "ref_text needs ref_audio"},
		{"with a cloned voice", obj{"voice": "anna", "ref_audio": ref, "ref_text": "hello"}, "invalid_value", "ref_audio", "send one of them"},
		{"not base64", obj{"ref_audio": "%%%", "ref_text": "hello"}, "invalid_value", "ref_audio", "not base64"},
		{"not audio", obj{"ref_audio": base64.StdEncoding.EncodeToString([]byte("not audio")), "ref_text": "hello"}, "invalid_value", "ref_audio", "cannot be read"},
		{"too short", obj{"ref_audio": base64.StdEncoding.EncodeToString(wav16(16000, 0.5)), "ref_text": "hello"}, "invalid_value", "ref_audio", "the clip is 0.50 seconds"},
		{"too large", obj{"ref_audio": base64.StdEncoding.EncodeToString(wav16(16000, 4)), "ref_text": "hello"}, "file_too_large", "ref_audio", "the limit is 100000"},
		// The mock instance refuses any clip but 3 s at 16 kHz: the instance's verdict.
		{"refused by the instance", obj{"ref_audio": base64.StdEncoding.EncodeToString(wav16(8000, 4)), "ref_text": "hello"}, "invalid_value", "ref_audio", "unexpected clip"},
	} {
		tc.config["type"] = "session.config"
		wsSend(t, ws, tc.config)
		if m := wsRead(t, ws); m.Type != "error" || m.Code != tc.code || m.Param != tc.param || !strings.Contains(m.Message, tc.words) {
			t.Errorf("%s: %+v, want error %s on %s saying %q", tc.name, m, tc.code, tc.param, tc.words)
		}
	}
	if n := c.clips.Load() - clips; n != 1 {
		t.Fatalf("the instance computed %d voices, want 1 (the clip it refused)", n)
	}
	wsSend(t, ws, obj{"type": "input.text", "text": "early"})
	if m := wsRead(t, ws); m.Code != "session_not_configured" {
		t.Fatalf("a refused config configured the session: %+v", m)
	}
	wsSend(t, ws, obj{"type": "session.config", "voice": "alloy", "ref_audio": ref, "ref_text": "Hello, this is Anna."})
	if m := wsRead(t, ws); m.Type != "session.created" || m.Voice != "ref_audio" {
		t.Fatalf("session.config answered %+v, want session.created naming the voice ref_audio", m)
	}
	if n := c.clips.Load() - clips; n != 2 {
		t.Fatalf("the instance computed %d voices, want 2", n)
	}
	wsSend(t, ws, obj{"type": "input.text", "text": "Hello there. How are you?"})
	wsSend(t, ws, obj{"type": "input.done"})
	for m := wsRead(t, ws); m.Type != "context.closed"; m = wsRead(t, ws) {
		if m.Type == "error" {
			t.Fatalf("%+v", m)
		}
	}
	for i := range 2 {
		if p := <-c.prompts; p == nil || !reflect.DeepEqual(*p, fixedPrompt) {
			t.Fatalf("segment %d: the instance got prompt %+v", i, p)
		}
	}
	if n := c.clips.Load() - clips; n != 2 {
		t.Fatalf("segments computed the voice again: %d", n)
	}
	// Once configured, a message is bounded as before: room for a clip was for session.config.
	wsSend(t, ws, obj{"type": "input.text", "text": strings.Repeat("a", MaxBodyBytes)})
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := ws.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
		t.Fatalf("a message over %d bytes after session.config: %v, want close 1009", MaxBodyBytes, err)
	}

	// A session.config past the bound of a speech request with ref_audio ends the session, as
	// the HTTP API answers 413.
	ws = wsDial(t, url, nil)
	wsSend(t, ws, obj{"type": "session.config", "ref_audio": strings.Repeat("A", uploadBodyBytes(maxUpload)), "ref_text": "hello"})
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := ws.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
		t.Fatalf("session.config over the bound: %v, want close 1009", err)
	}
}

// A model that does not clone answers ref_audio as the HTTP API does.
func TestRealtimeRefAudioNotCloning(t *testing.T) {
	url := serveTest(t, ready("a", &fakeSynth{chunks: 1}, 4))
	ws := wsDial(t, url, nil)
	wsSend(t, ws, obj{"type": "session.config", "ref_audio": base64.StdEncoding.EncodeToString(wav16(16000, 3)), "ref_text": "hello"})
	if m := wsRead(t, ws); m.Type != "error" || m.Code != "cloning_not_supported" || m.Param != "ref_audio" {
		t.Fatalf("%+v, want cloning_not_supported", m)
	}
	// Its messages are bounded as before.
	wsSend(t, ws, obj{"type": "session.config", "ref_audio": strings.Repeat("A", MaxBodyBytes), "ref_text": "hello"})
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := ws.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
		t.Fatalf("session.config over %d bytes: %v, want close 1009", MaxBodyBytes, err)
	}
}

// failFirstSynth speaks 3 chunks of 480 samples at 24 kHz, but fails a request whose text starts
// with "First" after 2 of them.
type failFirstSynth struct{}

func (failFirstSynth) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	for i := range 3 {
		if i == 2 && strings.HasPrefix(req.Text, "First") {
			return errors.New("instance crashed")
		}
		if err := emit(tts.Chunk{PCM: make([]float32, 480), SampleRate: 24000, Index: i}); err != nil {
			return err
		}
	}
	return nil
}

// After a segment fails partway, the next segment's audio is placed after the part of the failed
// one that was sent, so that a client's timeline stays continuous.
func TestRealtimeTimestampsAfterFailedSegment(t *testing.T) {
	url := serveTest(t, ready("a", failFirstSynth{}, 4))
	c := wsDial(t, url, nil)
	wsSend(t, c, obj{"type": "session.config", "response_format": "pcm"})
	if m := wsRead(t, c); m.Type != "session.created" {
		t.Fatalf("session.config answered %+v", m)
	}
	wsSend(t, c, obj{"type": "input.text", "text": "First one. Second one."})
	wsSend(t, c, obj{"type": "input.done"})
	var end float64 // where the audio sent so far ends
	failed := false
	for {
		m := wsRead(t, c)
		switch m.Type {
		case "audio.delta":
			if m.Start != end {
				t.Fatalf("segment %d: audio.delta starts at %v, want %v (where the audio sent so far ends)", m.SegmentIndex, m.Start, end)
			}
			end = m.End
		case "error":
			failed = true
		}
		if m.Type == "context.closed" {
			break
		}
	}
	if !failed || end != 0.1 {
		t.Fatalf("failed %v, audio ends at %v: want the first segment failed and 5 chunks of 0.02 s sent", failed, end)
	}
}

// Error messages quote a client's value as an excerpt and speak of JSON fields, not Go types, on
// the WebSocket and over HTTP.
func TestErrorTextQuotesExcerptsWithoutGoTypes(t *testing.T) {
	url := serveTest(t, ready("a", &fakeSynth{chunks: 1}, 4))
	huge := strings.Repeat("x", 200000)
	clean := func(what, msg string, wants ...string) {
		t.Helper()
		if len(msg) > 400 {
			t.Errorf("%s: a message of %d bytes", what, len(msg))
		}
		for _, bad := range []string{"Go ", "wsIn", "speechRequest", "struct", "*string", "uint64"} {
			if strings.Contains(msg, bad) {
				t.Errorf("%s: %q names a Go type (%q)", what, msg, bad)
			}
		}
		for _, w := range wants {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q does not say %q", what, msg, w)
			}
		}
	}
	c := wsDial(t, url, nil)
	wsSend(t, c, obj{"type": "session.config", "sample_rate": "fast"})
	m := wsRead(t, c)
	clean("a string for an integer", m.Message, "sample_rate must be an integer, not string")
	wsSend(t, c, obj{"type": "session.config", "response_format": huge})
	m = wsRead(t, c)
	clean("unknown format", m.Message, "response_format", "…")
	wsSend(t, c, obj{"type": "session.config", "response_format": "pcm"})
	if m := wsRead(t, c); m.Type != "session.created" {
		t.Fatalf("session.config answered %+v", m)
	}
	wsSend(t, c, obj{"type": huge})
	m = wsRead(t, c)
	clean("unknown type", m.Message, "unknown message type", "…")
	wsSend(t, c, obj{"type": "close_context", "context_id": huge})
	m = wsRead(t, c)
	clean("unknown context", m.Message, "is not open", "…")

	for body, want := range map[string][]string{
		`{"input": 5}`:                                  {"input must be a string, not number"},
		`{"input": "hi", "speed": "fast"}`:              {"speed must be a number, not string"},
		`{"input": "hi", "stream": 1}`:                  {"stream must be true or false, not number"},
		`{"input": "hi",`:                               {"ends early"},
		`{"input": "hi", "voice": ` + `"` + huge + `"}`: nil,
		`{"model": "` + huge + `", "input": "hi"}`:      {"…"},
	} {
		resp, b := post(t, url, body)
		var e struct {
			Error struct{ Message, Param string } `json:"error"`
		}
		json.Unmarshal(b, &e)
		if resp.StatusCode/100 != 4 {
			t.Errorf("%.40s: status %d", body, resp.StatusCode)
		}
		clean(fmt.Sprintf("%.40s", body), e.Error.Message, want...)
	}
}
