package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/staged"
	"github.com/voxmux/voxmux/router"
	"github.com/voxmux/voxmux/tts"
)

// The router and the staged engine in one process, as serve composes them without the plugin
// layer between: a client's barge-in or departure reaches the engine, which counts the cancel and
// drops the request before its next decode step.

// A voice agent on the tiny staged model: an LLM's tokens stream in over the socket, the agent
// barges in (close_context) while its context speaks. Nothing of the context arrives after
// context.closed, the engine drops the request from the LM's batch before its next decode step
// and ends up holding nothing, and a second context on the same connection is spoken whole.
func TestRealtimeBargeInFreesEngine(t *testing.T) {
	e, ln := serveTinyEngine(t, router.Options{MaxInputChars: 400, RequestTimeout: time.Minute, Realtime: router.RealtimeOptions{MinChars: 10, MaxChars: 200}})
	c := engineWSDial(t, ln.Addr().String())
	engineWSSend(t, c, map[string]any{"type": "session.config", "seed": 42})
	if m := engineWSRead(t, c); m.Type != "session.created" {
		t.Fatalf("session.config answered %+v", m)
	}

	// LLM-sized deltas; the agent's reply is long enough to be interrupted mid-segment.
	reply := "Sure, I can help with that. The first thing to check is whether the engine batches every stage across requests, which it does, so many agents share one GPU without waiting for each other in turn."
	for _, tok := range strings.SplitAfter(reply, " ") {
		engineWSSend(t, c, map[string]any{"type": "input.text", "context_id": "agent", "text": tok})
	}
	engineWSSend(t, c, map[string]any{"type": "input.text", "context_id": "other", "text": "A short aside.", "flush": true})
	engineWSSend(t, c, map[string]any{"type": "input.done", "context_id": "other"})

	// Barge in once the agent's second segment is under way.
	otherDone := false
	for {
		m := engineWSRead(t, c)
		if m.Type == "error" {
			t.Fatalf("%+v", m)
		}
		if m.Type == "context.closed" && m.ContextID == "other" {
			otherDone = true
		}
		if m.Type == "audio.delta" && m.ContextID == "agent" && m.SegmentIndex == 1 {
			break
		}
	}
	engineWSSend(t, c, map[string]any{"type": "close_context", "context_id": "agent"})
	closed := false
	for !closed || !otherDone {
		m := engineWSRead(t, c)
		switch {
		case m.ContextID == "agent" && closed:
			t.Fatalf("context agent sent %s after context.closed", m.Type)
		case m.Type == "context.closed" && m.ContextID == "agent":
			if m.Reason != "cancelled" {
				t.Fatalf("context.closed %+v", m)
			}
			closed = true
		case m.Type == "context.closed" && m.ContextID == "other":
			otherDone = true
		case m.Type == "error":
			t.Fatalf("%+v", m)
		}
	}
	// The engine lets go of the cancelled segments (bounded wait, not a speed target).
	engineWaitFor(t, func() bool { return e.Active() == 0 }, "the engine to hold nothing")
	if n := e.CancelSteps(); n > 1 {
		t.Errorf("a cancelled request stayed in the LM's batch for %d decode steps, want at most the one under way", n)
	}
	st := e.CancelStats()
	if st.Count == 0 {
		t.Error("the barge-in cancelled nothing the engine held")
	}
	t.Logf("cancels %d, cancel to freed: mean %v, max %v", st.Count, st.Freeing/time.Duration(max(st.Count, 1)), st.MaxFreeing)
	engineWSSend(t, c, map[string]any{"type": "close"})
	if m := engineWSRead(t, c); m.Type != "session.done" {
		t.Fatalf("close answered %+v", m)
	}
}

// An HTTP client that goes away mid-stream cancels its request in the engine as a closed context
// does: the engine counts the cancel and ends up holding nothing.
func TestHTTPClientGoneFreesEngine(t *testing.T) {
	e, ln := serveTinyEngine(t, router.Options{MaxInputChars: 1000, RequestTimeout: time.Minute})

	// The tiny model on the CPU can finish a whole request before the router notices its client
	// left, and then there is nothing to cancel: abandon requests until one is cancelled mid-way.
	body := `{"input":"` + strings.Repeat("A long answer nobody waits for. ", 20) + `","response_format":"pcm"}`
	for try := 0; e.CancelStats().Count == 0 && try < 10; try++ {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		buf := make([]byte, 4096)
		if _, err := conn.Read(buf); err != nil { // the headers and the first audio
			t.Fatal(err)
		}
		conn.Close()
		engineWaitFor(t, func() bool { return e.Active() == 0 }, "the engine to let go of the abandoned request")
	}
	if st := e.CancelStats(); st.Count != 1 {
		t.Fatalf("%d cancels counted, want 1", st.Count)
	}
	if n := e.CancelSteps(); n > 1 {
		t.Errorf("the abandoned request stayed in the LM's batch for %d decode steps", n)
	}
}

// serveTinyEngine serves the tiny staged model's engine, in this process, behind a router with
// opts (its Pool set here) on a loopback listener.
func serveTinyEngine(t *testing.T, opts router.Options) (*staged.Engine, net.Listener) {
	t.Helper()
	lib, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	p, err := staged.LoadPipeline(tts.LoadConfig{Manifest: "../../models/tiny/pipeline.yaml", Provider: "cpu", ORTLibrary: lib})
	if err != nil {
		t.Fatal(err)
	}
	e := staged.NewEngine(p)
	t.Cleanup(func() { e.Close() })
	opts.Pool = router.NewPool(router.Model{Name: "tiny", SampleRate: 24000, Voices: []string{"default"}}, router.QueueOptions{Size: 8, Timeout: 30 * time.Second})
	b := &router.Backend{Name: "tiny/0", Synth: e, Capacity: 8}
	b.SetReady(true)
	opts.Pool.Add(b)
	srv := router.New(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return e, ln
}

// engineMsg is the part of the WebSocket API's server messages these tests read.
type engineMsg struct {
	Type         string `json:"type"`
	ContextID    string `json:"context_id"`
	SegmentIndex int    `json:"segment_index"`
	Reason       string `json:"reason"`
	Code         string `json:"code"`
	Message      string `json:"message"`
}

func engineWSDial(t *testing.T, addr string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.DefaultDialer.Dial("ws://"+addr+router.RealtimePath, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// engineWSRead reads the next JSON message, skipping audio frames.
func engineWSRead(t *testing.T, c *websocket.Conn) engineMsg {
	t.Helper()
	for {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		mt, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if mt != websocket.TextMessage {
			continue
		}
		var m engineMsg
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
}

func engineWSSend(t *testing.T, c *websocket.Conn, v any) {
	t.Helper()
	if err := c.WriteJSON(v); err != nil {
		t.Fatal(err)
	}
}

// engineWaitFor waits for cond (a bound for the test, not a speed target).
func engineWaitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
