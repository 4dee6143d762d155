package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime/multipart"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// tinyCosyVoice3 is models/tiny-cosyvoice3's manifest; the test skips without it unless
// VOXMUX_REQUIRE_TINY_COSYVOICE3 is set (`make test`), where its absence fails.
func tinyCosyVoice3(t *testing.T) string {
	t.Helper()
	model, _ := filepath.Abs("../../models/tiny-cosyvoice3/pipeline.yaml")
	if _, err := os.Stat(model); err != nil {
		if os.Getenv("VOXMUX_REQUIRE_TINY_COSYVOICE3") != "" {
			t.Fatalf("%v, and VOXMUX_REQUIRE_TINY_COSYVOICE3 is set", err)
		}
		t.Skipf("%v: run make tiny-cosyvoice3", err)
	}
	return model
}

// voicedWAV is 5 s of 24 kHz 16-bit mono that has speech's broad shape: harmonics of a gliding
// pitch, shaped by three formants, in syllable-like bursts.
func voicedWAV() []byte {
	const rate, seconds = 24000, 5
	n := rate * seconds
	pcm := make([]byte, 2*n)
	phase := 0.0
	for i := range n {
		t := float64(i) / rate
		f0 := 120 + 20*math.Sin(2*math.Pi*0.7*t)
		phase += 2 * math.Pi * f0 / rate
		x := 0.0
		for k := 1; k*int(f0) < 4000; k++ {
			f := float64(k) * f0
			gain := 0.0
			for _, fm := range [][2]float64{{700, 1}, {1200, 0.6}, {2500, 0.3}} {
				gain += fm[1] / (1 + math.Pow((f-fm[0])/150, 2))
			}
			x += gain * math.Sin(float64(k)*phase) / float64(k)
		}
		env := math.Max(0, math.Sin(2*math.Pi*2*t)) // four bursts a second, with pauses
		binary.LittleEndian.PutUint16(pcm[2*i:], uint16(int16(6000*env*x)))
	}
	h := make([]byte, 44)
	copy(h, "RIFF")
	binary.LittleEndian.PutUint32(h[4:], uint32(36+len(pcm)))
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint16(h[20:], 1)
	binary.LittleEndian.PutUint16(h[22:], 1)
	binary.LittleEndian.PutUint32(h[24:], rate)
	binary.LittleEndian.PutUint32(h[28:], 2*rate)
	binary.LittleEndian.PutUint16(h[32:], 2)
	binary.LittleEndian.PutUint16(h[34:], 16)
	copy(h[36:], "data")
	binary.LittleEndian.PutUint32(h[40:], uint32(len(pcm)))
	return append(h, pcm...)
}

// voiceReq sends a voice-library request (token "" sends none) and returns its status and body.
func voiceReq(t *testing.T, method, url, token, contentType string, body io.Reader) (int, []byte) {
	t.Helper()
	resp, b := doRequest(t, method, url, token, contentType, body)
	return resp.StatusCode, b
}

// uploadVoice posts wav as multipart/form-data to POST /v1/audio/voices.
func uploadVoice(t *testing.T, url, token, name string, wav []byte) (int, []byte) {
	t.Helper()
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	f, _ := w.CreateFormFile("file", name+".wav")
	f.Write(wav)
	w.WriteField("name", name)
	w.WriteField("text", "Hello, this is a test of my voice.")
	w.WriteField("consent", "The speaker agreed to the cloning of this voice.")
	w.Close()
	return voiceReq(t, "POST", url+"/v1/audio/voices", token, w.FormDataContentType(), &body)
}

// voiceTypes lists GET /v1/audio/voices as id → type, and the ids in order.
func voiceTypes(t *testing.T, url string) (map[string]string, []string) {
	t.Helper()
	code, b := voiceReq(t, "GET", url+"/v1/audio/voices", "", "", nil)
	var l struct {
		Data []struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		} `json:"data"`
	}
	if code != 200 || json.Unmarshal(b, &l) != nil {
		t.Fatalf("GET /v1/audio/voices: %d %.300s", code, b)
	}
	types := map[string]string{}
	var ids []string
	for _, v := range l.Data {
		types[v.ID] = v.Type
		ids = append(ids, v.ID)
	}
	return types, ids
}

// `voxmux serve` on models/tiny-cosyvoice3 with a voice library: a voice cloned from a clip over
// HTTP is listed, spoken, kept across a restart (with the same audio), and deleted; a clip in a
// single request speaks too.
func TestEndToEndTinyCosyVoice3Library(t *testing.T) {
	model := tinyCosyVoice3(t)
	const token = "admin-e2e-token-5d1c8b7a"
	listen, adminListen, dir := freePort(t), freePort(t), t.TempDir()
	cfg := filepath.Join(t.TempDir(), "voxmux.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: %s
model: %s
provider: cpu
onnxruntime: %s
groups:
  - name: cpu
    gpus: []
    instances: 1
admin: {listen: %s, token: %s}
voices: {dir: %s}
shutdown: {grace: 50ms}
`, listen, model, ortLib(t), adminListen, token, filepath.Join(dir, "voices"))), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, cfg, listen)
	wav := voicedWAV()

	// Without the token: refused, and nothing is written.
	if code, b := uploadVoice(t, s.url, "", "alice", wav); code != 401 && code != 403 {
		t.Fatalf("create without the token: %d %.300s; want 401 or 403", code, b)
	}
	if code, b := uploadVoice(t, s.url, "not-the-token", "alice", wav); code != 401 && code != 403 {
		t.Fatalf("create with a wrong token: %d %.300s; want 401 or 403", code, b)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "voices")); len(ents) != 0 {
		t.Fatalf("refused creates left %d entries in the library's folder", len(ents))
	}
	if types, _ := voiceTypes(t, s.url); types["alice"] != "" {
		t.Fatal("alice is listed after refused creates")
	}

	code, b := uploadVoice(t, s.url, token, "alice", wav)
	var created struct {
		ID, Type   string
		SampleRate int     `json:"sample_rate"`
		Seconds    float64 `json:"seconds"`
		Tokens     int     `json:"tokens"`
	}
	if code != 201 || json.Unmarshal(b, &created) != nil || created.ID != "alice" || created.Type != "cloned" ||
		created.SampleRate != 24000 || math.Abs(created.Seconds-5) > 0.01 || created.Tokens == 0 {
		t.Fatalf("create alice: %d %.300s", code, b)
	}
	types, ids := voiceTypes(t, s.url)
	if !slices.Equal(ids, []string{"default", "bench", "alice"}) || types["default"] != "builtin" || types["bench"] != "builtin" || types["alice"] != "cloned" {
		t.Fatalf("voices after create: %v %v", ids, types)
	}

	pcm := func(url, body string) []byte {
		t.Helper()
		code, _, out := speech(t, url, body)
		if code != 200 || len(out) == 0 || len(out)%2 != 0 {
			t.Fatalf("speech %.120s: status %d, %d bytes: %.300s", body, code, len(out), out)
		}
		return out
	}
	const req = `"model":"cosyvoice3","input":"Hello world. This is voxmux.","response_format":"pcm","seed":1`
	alice := pcm(s.url, `{`+req+`,"voice":"alice"}`)
	if bytes.Equal(alice, pcm(s.url, `{`+req+`,"voice":"default"}`)) {
		t.Error("voices alice and default gave the same audio")
	}

	// Names taken by a cloned or a built-in voice.
	for _, name := range []string{"alice", "Bench"} {
		if code, b := uploadVoice(t, s.url, token, name, wav); code != 409 {
			t.Fatalf("create %s again: %d %.300s; want 409", name, code, b)
		}
	}

	// A restart through the normal shutdown keeps the voice, and its audio.
	s.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("serve exited with %v; logs:\n%s", err, s.logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop after SIGTERM")
	}
	s = startServe(t, cfg, listen)
	if types, _ := voiceTypes(t, s.url); types["alice"] != "cloned" {
		t.Fatalf("alice is not listed after the restart: %v", types)
	}
	again := pcm(s.url, `{`+req+`,"voice":"alice"}`)
	if len(again) != len(alice) {
		t.Fatalf("alice after the restart: %d bytes, before %d", len(again), len(alice))
	}
	for i := 0; i < len(alice); i += 2 {
		x, y := int16(binary.LittleEndian.Uint16(alice[i:])), int16(binary.LittleEndian.Uint16(again[i:]))
		if d := int(x) - int(y); d < -1 || d > 1 {
			t.Fatalf("alice after the restart: sample %d is %d, before %d", i/2, y, x)
		}
	}

	// A voice for one request.
	ref := fmt.Sprintf(`{%s,"voice":"alloy","ref_audio":"%s","ref_text":"Hello, this is a test of my voice."}`, req, base64.StdEncoding.EncodeToString(wav))
	pcm(s.url, ref)

	// Deleted: gone from the list, and a request for it is one for an unknown voice.
	if code, b := voiceReq(t, "DELETE", s.url+"/v1/audio/voices/alice", token, "", nil); code != 200 {
		t.Fatalf("delete alice: %d %.300s", code, b)
	}
	if types, _ := voiceTypes(t, s.url); types["alice"] != "" {
		t.Fatal("alice is listed after delete")
	}
	code, _, b = speech(t, s.url, `{`+req+`,"voice":"alice"}`)
	var e struct {
		Error struct{ Code, Param string }
	}
	if code != 400 || json.Unmarshal(b, &e) != nil || e.Error.Code != "invalid_value" || e.Error.Param != "voice" {
		t.Fatalf("speech in a deleted voice: %d %.300s; want 400 invalid_value on voice", code, b)
	}
}
