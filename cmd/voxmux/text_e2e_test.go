package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The real server on models/tiny/sampling.yaml (sampling, text frontend, lm.max_prompt_tokens
// 256): input within max_input_chars but over the model's token limit is a 400 naming the limit
// in tokens and the instance serves on; the same seed gives the same bytes, another seed other
// audio; long text comes back as one response.
func TestEndToEndSeedAndTokenLimit(t *testing.T) {
	listen := freePort(t)
	model, _ := filepath.Abs("../../models/tiny/sampling.yaml")
	cfg := filepath.Join(t.TempDir(), "voxmux.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("listen: %s\nmodel: %s\nprovider: cpu\nonnxruntime: %s\nmax_input_chars: 4096\ngroups:\n  - name: cpu\n    instances: 1\n",
		listen, model, ortLib(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, cfg, listen)

	resp, body := speechReq(t, s.url, "", `{"input":"`+strings.Repeat("é", 4096)+`"}`)
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 400 || e.Error.Param == nil || *e.Error.Param != "input" ||
		!strings.Contains(e.Error.Message, "8195 prompt tokens; the limit is 256 tokens (lm.max_prompt_tokens)") {
		t.Fatalf("4096 × é: %d %s, want a 400 naming the limit in tokens", resp.StatusCode, body)
	}

	pcm := func(body string) []byte {
		t.Helper()
		resp, b := speechReq(t, s.url, "", body)
		if resp.StatusCode != 200 || len(b) == 0 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return b
	}
	a := pcm(`{"input":"Hello world.","response_format":"pcm","seed":7}`)
	if b := pcm(`{"input":"Hello world.","response_format":"pcm","seed":7}`); !bytes.Equal(a, b) {
		t.Error("the same request and seed gave different audio")
	}
	if c := pcm(`{"input":"Hello world.","response_format":"pcm","seed":8}`); bytes.Equal(a, c) {
		t.Error("seeds 7 and 8 gave the same audio")
	}
	long := strings.Repeat("This sentence is one of many that make a long input. ", 8)
	if b := pcm(`{"input":"` + long + `","response_format":"pcm","seed":1}`); len(b) <= len(a) {
		t.Errorf("long input: %d bytes of audio, no more than a short one's %d", len(b), len(a))
	}
}
