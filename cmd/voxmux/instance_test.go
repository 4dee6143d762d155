package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// go-plugin re-logs an instance's stderr line at its level only if it parses as an hclog entry.
func TestInstanceLogLinesParseAsHclog(t *testing.T) {
	var buf bytes.Buffer
	slog.New(instanceLogHandler(&buf, slog.LevelInfo)).Warn("engine stats", "flow", "runs=3")
	var entry map[string]any
	if err := json.Unmarshal(buf.Bytes(), &entry); err != nil {
		t.Fatal(err)
	}
	if entry["@message"] != "engine stats" || entry["@level"] != "warn" || entry["flow"] != "runs=3" {
		t.Fatalf("entry %v", entry)
	}
	if _, err := time.Parse(hclogTime, entry["@timestamp"].(string)); err != nil {
		t.Fatalf("go-plugin cannot parse the timestamp: %v", err)
	}
}
