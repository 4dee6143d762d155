package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/bench"
)

// `voxmux bench --ws` against a real `voxmux serve` running the tiny model on the CPU: agents
// stream tokens, some are interrupted, and the report has every level with no error and no audio
// after a context.closed, and the engines' cancel counters read through /metrics.
func TestBenchWSAgainstServe(t *testing.T) {
	listen := freePort(t)
	s := startServe(t, writeConfig(t, listen, "  - name: cpu\n    instances: 1\n"), listen)
	out := t.TempDir()
	cmd := benchCmd(nil)
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--ws", "--url", s.url, "--concurrency", "1,3", "--duration-per-level", "4s",
		"--token-rate", "40", "--barge-in", "0.5", "--out", out})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("bench --ws: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "first text → first audio") {
		t.Errorf("stdout is not the markdown report:\n%s", stdout.String())
	}
	js, err := os.ReadFile(filepath.Join(out, "ws.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.WSReport
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Levels) != 2 {
		t.Fatalf("levels %+v", rep.Levels)
	}
	for _, l := range rep.Levels {
		if l.Turns == 0 || l.Errors != 0 || l.LateAudio != 0 || !l.FirstAudioP50.Known() || !l.EngineCancels.Known() {
			t.Errorf("%d sessions: %+v", l.Sessions, l)
		}
	}
	t.Logf("\n%s", stdout.String())
}

func TestBenchWSFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ws", "--barge-in", "2"}, "--barge-in"},
		{[]string{"--ws", "--token-rate", "0"}, "--token-rate"},
		{[]string{"--ws", "--concurrency", "0"}, "--concurrency"},
	} {
		cmd := benchCmd(nil)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(append(c.args, "--out", t.TempDir()))
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s", c.args, err, c.want)
		}
	}
}
