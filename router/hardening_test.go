package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/voxmux/voxmux/tts"
)

// diedErr stands for plugin.DiedError, which the router knows only by its method.
type diedErr struct{}

func (diedErr) Error() string {
	return "instance a/0 died during the request: process exited (signal: killed)"
}
func (diedErr) InstanceDied() bool { return true }

// A request whose instance died under it is not retried on another instance (it may be what
// killed it) and gets 502 instance_error saying so.
func TestRequestThatKilledItsInstanceIsNotRetried(t *testing.T) {
	poisoned := &fakeSynth{fail: fmt.Errorf("stream: %w", diedErr{})}
	other := &fakeSynth{chunks: 2}
	url := serveTest(t, ready("a", poisoned, 100), ready("b", other, 1))
	// Idle, the two tie and either may be picked first: send requests until one meets a.
	for n := 0; poisoned.Calls() == 0 && n < 64; n++ {
		before := other.Calls()
		resp, body := post(t, url, `{"input":"hi","response_format":"pcm"}`)
		if poisoned.Calls() == 0 {
			if resp.StatusCode != 200 {
				t.Fatalf("served by b: status %d: %s", resp.StatusCode, body)
			}
			continue
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if resp.StatusCode != 502 || json.Unmarshal(body, &e) != nil || e.Error.Code != "instance_error" || !strings.Contains(e.Error.Message, "not retried") {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if other.Calls() != before {
			t.Fatalf("the request that killed a was retried on b")
		}
	}
	if poisoned.Calls() != 1 {
		t.Fatalf("a was never picked")
	}
}

// serveOpts runs a Server with a queue and write timeout of the test's choosing.
func serveOpts(t *testing.T, q QueueOptions, writeTimeout time.Duration, backends ...*Backend) string {
	t.Helper()
	pool := NewPool(Model{Name: "tiny", SampleRate: 24000, Voices: []string{"default"}}, q)
	for _, b := range backends {
		pool.Add(b)
	}
	srv := New(Options{Pool: pool, MaxInputChars: 50, RequestTimeout: time.Minute, WriteTimeout: writeTimeout})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return ln.Addr().String()
}

// rawRequest sends a speech request on a new connection and returns it unread.
func rawRequest(t *testing.T, addr, input string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"input":%q,"response_format":"pcm"}`, input)
	fmt.Fprintf(c, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return c
}

// recordingSynth records the inputs it was asked to speak; "hold" blocks until released.
type recordingSynth struct {
	mu      sync.Mutex
	inputs  []string
	release chan struct{}
}

func (r *recordingSynth) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	r.mu.Lock()
	r.inputs = append(r.inputs, req.Text)
	r.mu.Unlock()
	if req.Text == "hold" {
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return emit(tts.Chunk{PCM: make([]float32, 480), SampleRate: 24000})
}

func (r *recordingSynth) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.inputs...)
}

// A client that leaves while its request is queued gives up its place: the live request behind
// it is queued and served instead of refused, and the abandoned one is never synthesized.
func TestGhostClientLeavesTheQueue(t *testing.T) {
	synth := &recordingSynth{release: make(chan struct{})}
	pool := QueueOptions{Size: 1, Timeout: 30 * time.Second}
	addr := serveOpts(t, pool, 0, ready("a", synth, 1))
	busy := rawRequest(t, addr, "hold") // takes the only slot
	defer busy.Close()
	waitUntil(t, func() bool { return len(synth.seen()) == 1 })
	ghost := rawRequest(t, addr, "ghost") // takes the only queue place
	time.Sleep(200 * time.Millisecond)
	ghost.Close()
	time.Sleep(200 * time.Millisecond)
	live := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post("http://"+addr+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"live","response_format":"pcm"}`))
		if err != nil {
			t.Error(err)
			live <- nil
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		live <- resp
	}()
	time.Sleep(200 * time.Millisecond)
	close(synth.release)
	resp := <-live
	if resp == nil || resp.StatusCode != 200 {
		t.Fatalf("live request behind a ghost: %+v", resp)
	}
	if got := strings.Join(synth.seen(), ","); got != "hold,live" {
		t.Fatalf("synthesized %s, want hold,live (the ghost's request dropped)", got)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// endless emits large chunks until its stream is cancelled, then reports how many it emitted.
type endless struct{ cancelled chan int }

func (e *endless) Synthesize(ctx context.Context, _ tts.Request, emit func(tts.Chunk) error) error {
	pcm := make([]float32, 48000) // 96 kB of pcm
	for n := 0; ; n++ {
		if err := emit(tts.Chunk{PCM: pcm, SampleRate: 24000}); err != nil {
			e.cancelled <- n
			return err
		}
	}
}

// A client that never reads is cut after the write timeout and its slot freed (the synthesis is
// cancelled); a client that reads a stream longer than the write timeout gets all of it.
func TestSlowReaderIsCutAfterWriteTimeout(t *testing.T) {
	e := &endless{cancelled: make(chan int, 1)}
	addr := serveOpts(t, QueueOptions{Size: 0, Timeout: time.Second}, 300*time.Millisecond, ready("a", e, 1))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	body := `{"input":"never read","response_format":"pcm"}`
	fmt.Fprintf(c, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	select {
	case n := <-e.cancelled:
		// The kernel's send buffer is capped: megabytes (minutes of compressed audio) would keep
		// the slot busy long before a write blocked.
		if n > 20 {
			t.Errorf("%d chunks (%d kB) left before the writes blocked", n, n*96)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the synthesis for a client that never reads was not cancelled")
	}

	// Pieces 200 ms apart for over a second, with a 300 ms write timeout: all arrive.
	gate := make(chan struct{})
	slow := &fakeSynth{chunks: 8, gate: gate}
	addr = serveOpts(t, QueueOptions{Size: 0, Timeout: time.Second}, 300*time.Millisecond, ready("b", slow, 1))
	go func() {
		for i := 0; i < 7; i++ {
			time.Sleep(200 * time.Millisecond)
			gate <- struct{}{}
		}
	}()
	resp, err := http.Post("http://"+addr+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"hi","response_format":"pcm"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(bufio.NewReader(resp.Body))
	if err != nil || len(b) != 8*480*2 {
		t.Fatalf("long stream: %d bytes, %v", len(b), err)
	}
}

// A WebSocket client that stops reading is cut after the write timeout, as an HTTP client is:
// its segment's synthesis is cancelled and the slot freed, long before request_timeout.
func TestRealtimeNonReaderIsCutAfterWriteTimeout(t *testing.T) {
	e := &endless{cancelled: make(chan int, 1)}
	addr := serveOpts(t, QueueOptions{Size: 0, Timeout: time.Second}, 300*time.Millisecond, ready("a", e, 1))
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, NetDialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, a)
		if err == nil {
			c.(*net.TCPConn).SetReadBuffer(4096)
		}
		return c, err
	}}
	c, _, err := d.Dial("ws://"+addr+RealtimePath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wsSend(t, c, obj{"type": "session.config"})
	wsSend(t, c, obj{"type": "input.text", "text": "never read.", "flush": true})
	start := time.Now()
	select {
	case n := <-e.cancelled:
		t.Logf("cut after %v, %d chunks of 96 kB emitted", time.Since(start).Round(10*time.Millisecond), n)
		// The session's queue holds wsSendQueue messages; beyond it, the stream's own buffer and
		// the capped kernel buffers.
		if n > wsSendQueue+64 {
			t.Errorf("%d chunks (%d kB) left before the writes blocked", n, n*96)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("cut after %v with a write timeout of 300ms", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the synthesis for a WebSocket client that never reads was not cancelled")
	}
}

// While the server shuts down, a request whose instance was stopped under it (a second signal
// stops the instances at once) is answered 503, which clients retry elsewhere, not 502; before
// the shutdown the same failure is the instance's (502).
func TestStoppedInstanceDuringShutdownIs503(t *testing.T) {
	stopped := &fakeSynth{fail: &tts.Error{Kind: tts.ErrNotReady, Msg: "instance g0/0 was stopped"}}
	pool := NewPool(Model{Name: "tiny", SampleRate: 24000, Voices: []string{"default"}}, QueueOptions{})
	pool.Add(ready("a", stopped, 4))
	srv := New(Options{Pool: pool, MaxInputChars: 50, RequestTimeout: time.Minute})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	url := "http://" + ln.Addr().String()
	if resp, body := post(t, url, `{"input":"hi"}`); resp.StatusCode != 502 {
		t.Fatalf("serving: %d %s, want 502", resp.StatusCode, body)
	}
	srv.SetDraining()
	if resp, body := post(t, url, `{"input":"hi"}`); resp.StatusCode != 503 || !strings.Contains(string(body), "shutting down") {
		t.Fatalf("shutting down: %d %s, want 503", resp.StatusCode, body)
	}
}
