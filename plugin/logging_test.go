package plugin

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// go-plugin's lines, and the instance lines it relays, come out as the router's own: slog's keys
// and level names, the instance named, the relayed timestamp dropped, durations as strings.
func TestHCLoggerWritesThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: DurationsAsStrings}))
	h := NewHCLogger(l.With("instance", "g0/0")).Named("voxmux")
	h.Debug("waiting for RPC address") // below the level
	h.Warn("engine stats", "flow", "runs=3", "timestamp", "2026-01-01T00:00:00.000Z")
	l.Info("instance restarting", "in", 1500*time.Millisecond)
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	var e map[string]any
	if err := json.Unmarshal(lines[0], &e); err != nil {
		t.Fatal(err)
	}
	if e["msg"] != "engine stats" || e["level"] != "WARN" || e["instance"] != "g0/0" || e["logger"] != "voxmux" || e["flow"] != "runs=3" || e["time"] == nil {
		t.Fatalf("relayed line %v", e)
	}
	if _, ok := e["timestamp"]; ok {
		t.Fatalf("relayed timestamp kept: %v", e)
	}
	if err := json.Unmarshal(lines[1], &e); err != nil || e["in"] != "1.5s" {
		t.Fatalf("duration written as %v (%v)", e["in"], err)
	}
	if h.IsDebug() || !h.IsInfo() {
		t.Fatal("levels do not follow the handler")
	}
}
