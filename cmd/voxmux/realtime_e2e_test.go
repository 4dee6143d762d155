package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

// The WebSocket API against a real `voxmux serve` (the tiny model in an instance process): the
// realtime config loads, a barge-in reaches the instance through gRPC and its engine counts the
// cancel, nothing of the closed context arrives after context.closed, and the next context is
// spoken whole.
func TestRealtimeAgainstServe(t *testing.T) {
	listen := freePort(t)
	s := startServe(t, writeConfig(t, listen, "  - name: cpu\n    instances: 1\nrealtime:\n  min_chars: 10\n  idle_flush: 0s\n"), listen)
	c, _, err := websocket.DefaultDialer.Dial("ws://"+listen+"/v1/audio/speech/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	type msg struct{ Type, ContextID, Reason string }
	read := func() msg {
		t.Helper()
		for {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			mt, b, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if mt == websocket.BinaryMessage {
				continue
			}
			var m struct {
				Type      string `json:"type"`
				ContextID string `json:"context_id"`
				Reason    string `json:"reason"`
				Code      string `json:"code"`
				Message   string `json:"message"`
			}
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			if m.Type == "error" {
				t.Fatalf("error %s: %s", m.Code, m.Message)
			}
			return msg{Type: m.Type, ContextID: m.ContextID, Reason: m.Reason}
		}
	}
	send := func(v map[string]any) {
		t.Helper()
		if err := c.WriteJSON(v); err != nil {
			t.Fatal(err)
		}
	}
	send(map[string]any{"type": "session.config", "model": "tiny"})
	if m := read(); m.Type != "session.created" {
		t.Fatalf("session.config answered %+v", m)
	}
	// Long enough that its synthesis is still running when the barge-in arrives, however fast the
	// machine: a reply of 160 characters was at times synthesized whole before the cancel arrived, on
	// a loaded 2-core machine.
	long := strings.Repeat("A long reply that the user interrupts before it ends ", 25)
	for _, tok := range strings.SplitAfter(long, " ") {
		send(map[string]any{"type": "input.text", "context_id": "reply", "text": tok})
	}
	send(map[string]any{"type": "flush", "context_id": "reply"})
	for m := read(); m.Type != "audio.delta"; m = read() {
	}
	send(map[string]any{"type": "close_context", "context_id": "reply"})
	for {
		m := read()
		if m.Type == "context.closed" {
			if m.ContextID != "reply" || m.Reason != "cancelled" {
				t.Fatalf("context.closed %+v", m)
			}
			break
		}
	}
	// Nothing more of it: the next message is the next context's.
	send(map[string]any{"type": "input.text", "context_id": "next", "text": "Short answer."})
	send(map[string]any{"type": "input.done", "context_id": "next"})
	for {
		m := read()
		if m.ContextID == "reply" {
			t.Fatalf("context reply sent %s after context.closed", m.Type)
		}
		if m.Type == "context.closed" && m.ContextID == "next" {
			if m.Reason != "done" {
				t.Fatalf("context.closed %+v", m)
			}
			break
		}
	}
	// The instance counted the cancel (its counters reach the router every 2 s) and holds nothing.
	deadline := time.Now().Add(20 * time.Second)
	for {
		fams := scrapeMetrics(t, s.url)
		cancels, inflight := 0.0, -1.0
		for _, m := range fams["voxmux_engine_cancels_total"].GetMetric() {
			cancels += m.GetCounter().GetValue()
		}
		for _, m := range fams["voxmux_inflight_requests"].GetMetric() {
			inflight = max(inflight, 0) + m.GetGauge().GetValue()
		}
		if cancels >= 1 && inflight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine cancels %v, in-flight %v: the barge-in never reached the instance's engine", cancels, inflight)
		}
		time.Sleep(200 * time.Millisecond)
	}
	send(map[string]any{"type": "close"})
	if m := read(); m.Type != "session.done" {
		t.Fatalf("close answered %+v", m)
	}
}
