package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/bench"
	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/instance/staged"
)

// `voxmux bench` against a real `voxmux serve` running the tiny model on the CPU.
func TestBenchCommandAgainstServe(t *testing.T) {
	listen := freePort(t)
	s := startServe(t, writeConfig(t, listen, "  - name: cpu\n    instances: 1\n"), listen)
	out := t.TempDir()
	cmd := benchCmd(nil)
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--url", s.url, "--concurrency", "1,2", "--requests-per-level", "4", "--warmup", "1",
		"--model", "tiny", "--format", "wav", "--out", out, "--label", "tiny on CPU", "--quiet"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "# voxmux bench: tiny on CPU") || !strings.Contains(stdout.String(), "TTFB P95 (ms)") {
		t.Errorf("stdout is not the markdown report:\n%s", stdout.String())
	}
	js, err := os.ReadFile(filepath.Join(out, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatal(err)
	}
	wantChars := 0
	for _, s := range bench.Corpus[:4] {
		wantChars += s.Chars()
	}
	if len(rep.Targets) != 1 || len(rep.Targets[0].Levels) != 2 {
		t.Fatalf("report targets %+v", rep.Targets)
	}
	for _, l := range rep.Targets[0].Levels {
		if l.Requests != 4 || l.Succeeded != 4 || l.Chars != wantChars {
			t.Errorf("c=%d: %d requests, %d ok, %d chars; want 4, 4, %d (errors %v)", l.Concurrency, l.Requests, l.Succeeded, l.Chars, wantChars, l.Errors)
		}
		// The tiny model speaks 2 to 4 speech tokens per character at 25 tokens a second.
		if lo, hi := float64(wantChars)*2/25, float64(wantChars)*4/25; l.AudioSeconds < lo || l.AudioSeconds > hi {
			t.Errorf("c=%d: %.2f s of audio for %d characters, want %.2f..%.2f", l.Concurrency, l.AudioSeconds, wantChars, lo, hi)
		}
	}
	for _, f := range []string{"bench.md", "bench.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestBenchCommandFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--format", "mp3"}, "--format"},
		{[]string{"--concurrency", "1,0"}, "--concurrency"},
		{[]string{"--compare-concurrency", "1"}, "--compare-concurrency"},
		{[]string{"--requests-per-level", "-1"}, "--requests-per-level"},
	} {
		cmd := benchCmd(nil)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(append(c.args, "--out", t.TempDir()))
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s", c.args, err, c.want)
		}
	}
}

func TestBenchStages(t *testing.T) {
	cfg := writeConfig(t, "127.0.0.1:0", "  - name: cpu\n    instances: 1\n")
	out := filepath.Join(t.TempDir(), "stages.json")
	var stdout, stderr bytes.Buffer
	run := func(args ...string) error {
		stdout.Reset()
		stderr.Reset()
		cmd := stagesCmd()
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		cmd.SetArgs(append([]string{"--config", cfg}, args...))
		return cmd.Execute()
	}
	if err := run("--batch", "1,2", "--tokens", "5", "--runs", "1", "--json", out); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, want := range []string{"| lm_decode | 1 | 5 |", "| flow | 2 | 5 |", "| vocoder | 2 | 5 |"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	var res []staged.StageTiming
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res) != 6 {
		t.Fatalf("--json: %d timings, err %v; want 6", len(res), err)
	}
	// Bad flags are named.
	if err := run("--runs", "0"); err == nil || !strings.Contains(err.Error(), "--runs") {
		t.Errorf("--runs 0: err %v, want one naming --runs", err)
	}
	if err := run("--group", "nope"); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("--group nope: err %v, want one naming the group", err)
	}
	// A shape the model cannot run (flow.max_batch_frames) is a row that says why.
	var table bytes.Buffer
	writeStages(&table, []staged.StageTiming{{Stage: "flow", Batch: 256, Tokens: 115, Skipped: "too large"}})
	if got := table.String(); got != "| flow | 256 | 115 | skipped: too large | | | |\n" {
		t.Errorf("skipped shape printed as %q", got)
	}
	// The pipeline has room for the largest batch asked for, past the group's max_inflight.
	c, err := config.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := stagesLoad(c, c.Groups[0], "", []int{8, 64}).MaxInflight; got != 64 {
		t.Errorf("batches up to 64 with max_inflight %d: the pipeline takes %d sequences, want 64", c.Groups[0].MaxInflight, got)
	}
	if got := stagesLoad(c, c.Groups[0], "", []int{1}).MaxInflight; got != c.Groups[0].MaxInflight {
		t.Errorf("batch 1: the pipeline takes %d sequences, want the group's %d", got, c.Groups[0].MaxInflight)
	}
}

// TestBenchCommandFailsWhenNothingAnswers: a server that is not there makes `voxmux bench` fail
// (exit status 1), naming the URL, after writing the report.
func TestBenchCommandFailsWhenNothingAnswers(t *testing.T) {
	url := "http://" + freePort(t) // nothing listens there
	for _, warmup := range []string{"0", "1"} {
		out := t.TempDir()
		cmd := benchCmd(nil)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs([]string{"--url", url, "--concurrency", "1", "--requests-per-level", "2", "--warmup", warmup, "--out", out, "--quiet"})
		err := cmd.Execute()
		if !errors.Is(err, bench.ErrAllFailed) || !strings.Contains(err.Error(), url) {
			t.Errorf("--warmup %s: error %v, want one saying no request succeeded at %s", warmup, err, url)
		}
		if _, err := os.Stat(filepath.Join(out, "bench.json")); err != nil {
			t.Errorf("--warmup %s: no report: %v", warmup, err)
		}
	}
}
