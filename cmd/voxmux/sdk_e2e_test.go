package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// needCommand skips a test whose tool is missing, except in CI (CI=true), where it fails: there
// `make test` has installed it.
func needCommand(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is missing (scripts/debian-packages.txt lists it): %v", n, err)
			}
			t.Skipf("%s is missing; make deps installs it", n)
		}
	}
}

type sdkResults struct {
	Files []struct {
		Format      string `json:"format"`
		Mode        string `json:"mode"`
		File        string `json:"file"`
		Bytes       int    `json:"bytes"`
		ContentType string `json:"contentType"`
		Deltas      int    `json:"deltas"`
		Usage       *struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	} `json:"files"`
	Models []string `json:"models"`
	Errors map[string]struct {
		Status int    `json:"status"`
		Type   string `json:"type"`
		Param  string `json:"param"`
		Code   string `json:"code"`
	} `json:"errors"`
}

// The official OpenAI Node SDK (scripts/sdk-test, pinned in its package-lock.json) against the
// real server: every response_format, whole, streamed and as SSE, decodes with ffmpeg to the
// duration of the same speech as raw pcm (±10%).
func TestOpenAINodeSDK(t *testing.T) {
	needCommand(t, "node", "npm", "ffmpeg", "ffprobe")
	dir, ctx := npmCI(t, "sdk-test")
	const key = "sk-sdk-test-5b1e"
	s := serveWithKey(t, "VOXMUX_SDK_KEYS", key)

	out := t.TempDir()
	node := exec.CommandContext(ctx, "node", filepath.Join(dir, "sdk-test.mjs"), s.url+"/v1", out)
	node.Env = append(os.Environ(), "OPENAI_API_KEY="+key)
	if b, err := node.CombinedOutput(); err != nil {
		t.Fatalf("sdk-test.mjs: %v\n%s", err, b)
	}
	var res sdkResults
	if b, err := os.ReadFile(filepath.Join(out, "results.json")); err != nil || json.Unmarshal(b, &res) != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(res.Files) != 18 {
		t.Fatalf("%d files, want 6 formats × whole, stream, sse", len(res.Files))
	}

	const input = "The quick brown fox jumps over the lazy dog."
	var want float64
	for _, f := range res.Files {
		if f.Format == "pcm" && f.Mode == "whole" {
			want = float64(f.Bytes) / 2 / 24000
		}
	}
	// The tiny model speaks 2 to 4 speech tokens a character at 25 tokens a second.
	n := float64(utf8.RuneCountInString(input))
	if want < n*2/25 || want > n*4/25 {
		t.Fatalf("pcm: %.2f s for %d characters, want %.2f..%.2f", want, int(n), n*2/25, n*4/25)
	}
	codecs := map[string]string{"mp3": "mp3", "opus": "opus", "aac": "aac", "flac": "flac", "wav": "pcm_s16le"}
	types := map[string]string{"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
	for _, f := range res.Files {
		name := f.Mode + " " + f.Format
		wantType := types[f.Format]
		if f.Mode == "sse" {
			wantType = "text/event-stream"
		}
		if f.ContentType != wantType {
			t.Errorf("%s: Content-Type %q, want %q", name, f.ContentType, wantType)
		}
		if c := codecs[f.Format]; c != "" {
			if got := probeCodec(t, f.File); got != c {
				t.Errorf("%s: ffprobe finds codec %q, want %q", name, got, c)
			}
		}
		got := decodedSeconds(t, f.File, f.Format)
		if got < 0.9*want || got > 1.1*want {
			t.Errorf("%s: decodes to %.3f s, want %.3f s ±10%%", name, got, want)
		}
		if f.Mode == "sse" {
			if f.Usage == nil || f.Usage.InputTokens != int(n) || f.Deltas == 0 ||
				float64(f.Usage.OutputTokens) < 900*want || float64(f.Usage.OutputTokens) > 1100*want ||
				f.Usage.TotalTokens != f.Usage.InputTokens+f.Usage.OutputTokens {
				t.Errorf("%s: usage %+v after %d deltas, want %d characters in and about %.0f ms out", name, f.Usage, f.Deltas, int(n), 1000*want)
			}
		}
		t.Logf("%-6s %-5s %6d bytes, %.3f s", f.Mode, f.Format, f.Bytes, got)
	}
	if !slices.Contains(res.Models, "tiny") || !slices.Contains(res.Models, "gpt-4o-mini-tts") {
		t.Errorf("models.list: %v", res.Models)
	}
	if e := res.Errors["bad_request"]; e.Status != 400 || e.Type != "invalid_request_error" || e.Param != "voice" {
		t.Errorf("BadRequestError %+v", e)
	}
	if e := res.Errors["authentication"]; e.Status != 401 || e.Code != "invalid_api_key" {
		t.Errorf("AuthenticationError %+v", e)
	}
}

func probeCodec(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries", "stream=codec_name", "-of", "csv=p=0", file).Output()
	if err != nil {
		t.Errorf("ffprobe %s: %v", file, err)
	}
	return strings.TrimSpace(string(out))
}

// decodedSeconds decodes file with ffmpeg to 24 kHz mono and measures it.
func decodedSeconds(t *testing.T, file, format string) float64 {
	t.Helper()
	args := []string{"-v", "error"}
	if format == "pcm" {
		args = append(args, "-f", "s16le", "-ar", "24000", "-ac", "1")
	}
	args = append(args, "-i", file, "-f", "s16le", "-ar", "24000", "-ac", "1", "pipe:1")
	cmd := exec.Command("ffmpeg", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Errorf("ffmpeg cannot decode %s cleanly: %v %s", file, err, stderr.String())
	}
	return float64(len(out)) / 2 / 24000
}

// npmCI installs the packages pinned in scripts/NAME (npm ci) and returns that folder and a
// context that bounds the test's npm and node runs.
func npmCI(t *testing.T, name string) (string, context.Context) {
	t.Helper()
	dir, _ := filepath.Abs("../../scripts/" + name)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	npm := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	npm.Dir = dir
	if out, err := npm.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return dir, ctx
}

// serveWithKey runs `voxmux serve` on the tiny model, one CPU instance, accepting the API key
// key from the environment variable env.
func serveWithKey(t *testing.T, env, key string) *server {
	t.Helper()
	listen := freePort(t)
	cfg := writeConfig(t, listen, "  - name: cpu\n    instances: 1\n")
	appendConfig(t, cfg, "api_keys:\n  env: "+env+"\n")
	return startServe(t, cfg, listen, env+"="+key)
}
