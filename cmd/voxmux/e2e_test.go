package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run the real binary: `voxmux serve` with real instance subprocesses running the
// tiny model through ONNX Runtime on the CPU.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func voxmuxBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "voxmux-e2e")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "voxmux")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func ortLib(t *testing.T) string {
	if p := os.Getenv("ORT_LIB"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../../third_party/onnxruntime/libonnxruntime.so")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("ONNX Runtime not installed (make ort): %v", err)
	}
	return p
}

// freePort is a loopback address no process listens on. The kernel may hand a just-closed port
// out again, so one test calling it twice (a router and its admin API) could get the same port
// twice; ports given out before are never given again.
func freePort(t *testing.T) string {
	t.Helper()
	givenMu.Lock()
	defer givenMu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !given[addr] {
			given[addr] = true
			return addr
		}
	}
}

var (
	givenMu sync.Mutex
	given   = map[string]bool{}
)

type server struct {
	url  string
	cmd  *exec.Cmd
	logs *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// writeConfig writes a config for the tiny model into a temp dir and returns its path.
func writeConfig(t *testing.T, listen, groups string) string {
	t.Helper()
	model, _ := filepath.Abs("../../models/tiny/pipeline.yaml")
	cfg := fmt.Sprintf("listen: %s\nmodel: %s\nprovider: cpu\nonnxruntime: %s\ngroups:\n%s", listen, model, ortLib(t), groups)
	p := filepath.Join(t.TempDir(), "voxmux.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startServe runs `voxmux serve` and waits until /readyz answers 200.
func startServe(t *testing.T, cfgPath, listen string, env ...string) *server {
	t.Helper()
	return startServeArgs(t, cfgPath, listen, nil, env...)
}

// startServeArgs is startServe with more command-line arguments.
func startServeArgs(t *testing.T, cfgPath, listen string, args []string, env ...string) *server {
	t.Helper()
	cmd := exec.Command(voxmuxBinary(t), append([]string{"serve", "--config", cfgPath}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{url: "http://" + listen, cmd: cmd, logs: logs}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("serve logs:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if r, err := http.Get(s.url + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("serve did not become ready; logs:\n%s", logs.String())
	return nil
}

func TestEndToEndWAV(t *testing.T) {
	listen := freePort(t)
	// The router runs with CUDA_VISIBLE_DEVICES=7; the instance must see its group's list instead.
	cfg := writeConfig(t, listen, "  - name: g0\n    gpus: [3, 4]\n    instances: 1\n")
	s := startServe(t, cfg, listen, "CUDA_VISIBLE_DEVICES=7")

	resp, err := http.Post(s.url+"/v1/audio/speech", "application/json",
		strings.NewReader(`{"model":"tiny","input":"Hello world.","voice":"default","response_format":"wav"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d err %v: %s", resp.StatusCode, err, body)
	}
	if resp.Header.Get("Content-Type") != "audio/wav" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	if len(body) < 44 || string(body[:4]) != "RIFF" || string(body[8:16]) != "WAVEfmt " || string(body[36:40]) != "data" {
		t.Fatalf("not a WAV header: %q", body[:min(len(body), 44)])
	}
	format := binary.LittleEndian.Uint16(body[20:])
	channels := binary.LittleEndian.Uint16(body[22:])
	rate := binary.LittleEndian.Uint32(body[24:])
	bits := binary.LittleEndian.Uint16(body[34:])
	if format != 1 || channels != 1 || rate != 24000 || bits != 16 {
		t.Fatalf("format %d channels %d rate %d bits %d", format, channels, rate, bits)
	}
	samples := (len(body) - 44) / 2
	// "Hello world." is 12 characters at 2..4 speech tokens each, 25 tokens a second.
	secs := float64(samples) / 24000
	if secs < 12*2/25.0 || secs > 12*4/25.0 {
		t.Fatalf("%.2f s of audio for 12 characters, want %.2f..%.2f", secs, 12*2/25.0, 12*4/25.0)
	}
	var nonzero int
	for i := 44; i+1 < len(body); i += 2 {
		if body[i] != 0 || body[i+1] != 0 {
			nonzero++
		}
	}
	if nonzero < samples/2 {
		t.Fatalf("audio is mostly silence: %d of %d samples non-zero", nonzero, samples)
	}

	// What the instance saw.
	var seen string
	sc := bufio.NewScanner(strings.NewReader(s.logs.String()))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "instance ready" {
			seen, _ = line["cuda_visible_devices"].(string)
		}
	}
	if seen != "3,4" {
		t.Fatalf("instance saw CUDA_VISIBLE_DEVICES=%q, want \"3,4\" (router had 7)", seen)
	}
}

func TestEndToEndBadInputKeepsServing(t *testing.T) {
	listen := freePort(t)
	s := startServe(t, writeConfig(t, listen, "  - name: cpu\n    instances: 1\n"), listen)
	bad := map[string]int{
		`{"input":`:                                      400,
		`{"model":"tiny"}`:                               400,
		`{"input":""}`:                                   400,
		`{"input":"hi","response_format":"flv"}`:         400,
		`{"input":"hi","speed":9}`:                       400,
		`{"input":"` + strings.Repeat("x", 4097) + `"}`:  400,
		`{"input":"` + strings.Repeat("x", 1<<20) + `"}`: 413,
	}
	for body, want := range bad {
		resp, err := http.Post(s.url+"/v1/audio/speech", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if resp.StatusCode != want || json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			t.Errorf("%.40s: status %d, want %d; body %.200s", body, resp.StatusCode, want, b)
		}
	}
	resp, err := http.Post(s.url+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"Still here.","response_format":"pcm"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(b) == 0 || len(b)%2 != 0 {
		t.Fatalf("after bad input: status %d, %d bytes", resp.StatusCode, len(b))
	}
}

func TestServeFailsOnBrokenModel(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "pipeline.yaml")
	os.WriteFile(broken, []byte("kind: staged\nname: x\nbogus_key: 1\n"), 0o644)
	missing := filepath.Join(dir, "nothing.yaml")
	incomplete := filepath.Join(dir, "incomplete.yaml")
	os.WriteFile(incomplete, []byte("kind: staged\nname: x\nsample_rate: 24000\nlm: {file: nope.onnx}\n"), 0o644)
	for _, c := range []struct{ model, want string }{
		{broken, "bogus_key"},
		{missing, "nothing.yaml"},
		{incomplete, "nope.onnx"},
	} {
		cfg := filepath.Join(dir, "c.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("model: %s\ngroups:\n  - name: a\n", c.model)), 0o644)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, voxmuxBinary(t), "serve", "--config", cfg, "--listen", freePort(t)).CombinedOutput()
		cancel()
		if err == nil {
			t.Fatalf("serve with %s exited 0", c.model)
		}
		if !strings.Contains(string(out), c.want) || !strings.Contains(string(out), filepath.Base(c.model)) {
			t.Errorf("serve with %s: message does not name %q and the file:\n%s", c.model, c.want, out)
		}
	}
	// A config with an unknown key names the key and its line.
	cfg := filepath.Join(dir, "bad.yaml")
	os.WriteFile(cfg, []byte("model: x\nlisten_addr: 1\ngroups: []\n"), 0o644)
	out, err := exec.Command(voxmuxBinary(t), "serve", "--config", cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "listen_addr") || !strings.Contains(string(out), "bad.yaml") {
		t.Errorf("unknown config key: err %v, output:\n%s", err, out)
	}
	// An engine option of another family than the model's names the key, its line, the file and
	// the family it belongs to.
	voice, err := filepath.Abs("../../models/tiny-piper/en_US-tiny-x_low.onnx")
	if err != nil {
		t.Fatal(err)
	}
	cfg = filepath.Join(dir, "other-family.yaml")
	os.WriteFile(cfg, []byte("model: "+voice+"\ngroups:\n  - name: a\n    engine:\n      flow_workers: 2\n"), 0o644)
	out, err = exec.Command(voxmuxBinary(t), "serve", "--config", cfg, "--listen", freePort(t)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "other-family.yaml:5:") || !strings.Contains(string(out), "groups[0].engine.flow_workers") ||
		!strings.Contains(string(out), "option of the staged family") {
		t.Errorf("another family's engine option: err %v, output:\n%s", err, out)
	}
}

// Where the CUDA provider cannot load (no provider library, no GPU), serve says so and exits 1.
// On a GPU host with `make ort-gpu` done this test is skipped.
func TestServeFailsClearlyWithoutCUDAProvider(t *testing.T) {
	if _, err := os.Stat(filepath.Join(filepath.Dir(ortLib(t)), "libonnxruntime_providers_cuda.so")); err == nil {
		t.Skip("the CUDA provider is installed here")
	}
	listen := freePort(t)
	cfg := writeConfig(t, listen, "  - name: g0\n    gpus: [0]\n")
	cfg2 := strings.Replace(string(must(os.ReadFile(cfg))), "provider: cpu", "provider: cuda", 1)
	os.WriteFile(cfg, []byte(cfg2), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, voxmuxBinary(t), "serve", "--config", cfg).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("want exit 1, got %v:\n%s", err, out)
	}
	if !strings.Contains(string(out), "cuda provider cannot be loaded") || strings.Contains(string(out), "panic") {
		t.Fatalf("no clear message:\n%s", out)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestInstanceRefusesToRunByHand(t *testing.T) {
	out, err := exec.Command(voxmuxBinary(t), "instance").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "voxmux serve") {
		t.Fatalf("err %v, output %s", err, out)
	}
	out, err = exec.Command(voxmuxBinary(t), "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "voxmux ") {
		t.Fatalf("version: %v %s", err, out)
	}
}
