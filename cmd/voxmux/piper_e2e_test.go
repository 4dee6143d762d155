package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// `voxmux serve` with model: pointing at a folder of Piper-format voices (models/tiny-piper, made
// by scripts/piper/make_tiny.py), instances running them through espeak-ng and ONNX Runtime.

func writePiperConfig(t *testing.T, listen, model string) string {
	t.Helper()
	cfg := fmt.Sprintf("listen: %s\nmodel: %s\nprovider: cpu\nonnxruntime: %s\ngroups:\n  - name: cpu\n    instances: 1\n", listen, model, ortLib(t))
	p := filepath.Join(t.TempDir(), "voxmux.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func speech(t *testing.T, url, body string) (int, http.Header, []byte) {
	t.Helper()
	resp, b := speechReq(t, url, "", body)
	return resp.StatusCode, resp.Header, b
}

func TestEndToEndPiper(t *testing.T) {
	listen := freePort(t)
	model, _ := filepath.Abs("../../models/tiny-piper")
	s := startServe(t, writePiperConfig(t, listen, model), listen)

	if model, ids := listVoices(t, s.url); model != "tiny-piper" || !slices.Equal(ids, []string{"en_US-tiny-x_low", "alice", "bob"}) {
		t.Fatalf("voices: model %q, %v", model, ids)
	}

	// A multi-speaker voice, as WAV at the voice's sample rate.
	code, h, body := speech(t, s.url, `{"model":"tiny-piper","input":"Hola, mundo. ¿Qué tal?","voice":"bob","response_format":"wav"}`)
	if code != 200 || h.Get("Content-Type") != "audio/wav" || len(body) < 44 || string(body[:4]) != "RIFF" {
		t.Fatalf("bob: status %d, %q, %d bytes: %.200s", code, h.Get("Content-Type"), len(body), body)
	}
	if rate := binary.LittleEndian.Uint32(body[24:]); rate != 22050 {
		t.Fatalf("WAV rate %d, want the voice's 22050", rate)
	}

	// speed reaches the graph as length_scale: the tiny voice's audio is exactly half as long at 2.
	_, _, normal := speech(t, s.url, `{"input":"Hello world.","voice":"en_US-tiny-x_low","response_format":"pcm"}`)
	_, _, fast := speech(t, s.url, `{"input":"Hello world.","voice":"en_US-tiny-x_low","response_format":"pcm","speed":2}`)
	if len(normal) == 0 || len(fast)*2 != len(normal) {
		t.Fatalf("speed 1: %d bytes, speed 2: %d bytes; want exactly half", len(normal), len(fast))
	}
	// An OpenAI voice name is the first voice.
	if _, _, alloy := speech(t, s.url, `{"input":"Hello world.","voice":"alloy","response_format":"pcm"}`); string(alloy) != string(normal) {
		t.Fatal("voice alloy did not give the first voice")
	}

	// Nothing espeak-ng can pronounce: 400 with a message, not an empty WAV.
	code, _, body = speech(t, s.url, `{"input":"🫠🫥","voice":"en_US-tiny-x_low"}`)
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if code != 400 || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error.Message, "nothing to pronounce") {
		t.Fatalf("emoji only: status %d: %s", code, body)
	}
	// An unknown voice is refused by the router.
	if code, _, body = speech(t, s.url, `{"input":"Hi.","voice":"carol"}`); code != 400 || !strings.Contains(string(body), "alice") {
		t.Fatalf("unknown voice: status %d: %s", code, body)
	}
}

// A voice whose .onnx.json does not match its graph stops serve before any instance starts, with a
// message that names the file and the mismatch.
func TestServeFailsOnMismatchedPiperVoice(t *testing.T) {
	dir := t.TempDir()
	g, _ := os.ReadFile("../../models/tiny-piper/en_US-tiny-x_low.onnx")
	os.WriteFile(filepath.Join(dir, "en_US-bad-low.onnx"), g, 0o644)
	cfg, _ := os.ReadFile("../../models/tiny-piper/en_US-tiny-x_low.onnx.json")
	os.WriteFile(filepath.Join(dir, "en_US-bad-low.onnx.json"), []byte(strings.Replace(string(cfg), `"num_speakers": 1`, `"num_speakers": 3`, 1)), 0o644)
	os.WriteFile(filepath.Join(dir, "no_config.onnx"), g, 0o644)
	for model, want := range map[string][]string{
		filepath.Join(dir, "en_US-bad-low.onnx"): {"en_US-bad-low.onnx", "num_speakers is 3", "no sid input"},
		filepath.Join(dir, "no_config.onnx"):     {"no_config.onnx.json", "missing"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, voxmuxBinary(t), "serve", "--config", writePiperConfig(t, freePort(t), model)).CombinedOutput()
		cancel()
		if err == nil {
			t.Fatalf("serve with %s exited 0", model)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("serve with %s: output does not say %q:\n%s", model, w, out)
			}
		}
	}
}

// listVoices is GET /v1/audio/voices: the model it names and its voices' ids, in order.
func listVoices(t *testing.T, url string) (model string, ids []string) {
	t.Helper()
	resp, err := http.Get(url + "/v1/audio/voices")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var voices struct {
		Model string `json:"model"`
		Data  []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&voices); err != nil {
		t.Fatalf("voices: %v", err)
	}
	for _, v := range voices.Data {
		ids = append(ids, v.ID)
	}
	return voices.Model, ids
}
