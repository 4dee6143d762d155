package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"mime/multipart"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tinyExport is the manifest of models/DIR, a tiny export `make DIR` writes; the test skips
// without it unless the environment variable require is set (`make test` sets it), where its
// absence fails.
func tinyExport(t *testing.T, dir, require string) string {
	t.Helper()
	model, _ := filepath.Abs(filepath.Join("../../models", dir, "pipeline.yaml"))
	if _, err := os.Stat(model); err != nil {
		if os.Getenv(require) != "" {
			t.Fatalf("%v, and %s is set", err, require)
		}
		t.Skipf("%v: run make %s", err, dir)
	}
	return model
}

// tinyCosyVoice3 is models/tiny-cosyvoice3's manifest (VOXMUX_REQUIRE_TINY_COSYVOICE3).
func tinyCosyVoice3(t *testing.T) string {
	t.Helper()
	return tinyExport(t, "tiny-cosyvoice3", "VOXMUX_REQUIRE_TINY_COSYVOICE3")
}

// voicedWAV is 16-bit mono at rate that has speech's broad shape: harmonics of a gliding pitch,
// shaped by three formants, in syllable-like bursts (two a second, with pauses), over white noise
// of the given peak (in 16-bit steps; 0: none, so the pauses are silence).
func voicedWAV(rate int, seconds, noise float64) []byte {
	n := int(float64(rate) * seconds)
	pcm := make([]byte, 2*n)
	rng := rand.New(rand.NewPCG(1, 2))
	phase := 0.0
	for i := range n {
		t := float64(i) / float64(rate)
		f0 := 120 + 20*math.Sin(2*math.Pi*0.7*t)
		phase += 2 * math.Pi * f0 / float64(rate)
		x := 0.0
		for k := 1; k*int(f0) < 4000; k++ {
			f := float64(k) * f0
			gain := 0.0
			for _, fm := range [][2]float64{{700, 1}, {1200, 0.6}, {2500, 0.3}} {
				gain += fm[1] / (1 + math.Pow((f-fm[0])/150, 2))
			}
			x += gain * math.Sin(float64(k)*phase) / float64(k)
		}
		env := math.Max(0, math.Sin(2*math.Pi*2*t))
		v := 6000 * env * x
		if noise > 0 {
			v += noise * (2*rng.Float64() - 1)
		}
		binary.LittleEndian.PutUint16(pcm[2*i:], uint16(int16(max(-32768, min(32767, v)))))
	}
	h := make([]byte, 44)
	copy(h, "RIFF")
	binary.LittleEndian.PutUint32(h[4:], uint32(36+len(pcm)))
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint16(h[20:], 1)
	binary.LittleEndian.PutUint16(h[22:], 1)
	binary.LittleEndian.PutUint32(h[24:], uint32(rate))
	binary.LittleEndian.PutUint32(h[28:], uint32(2*rate))
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

// clonedVoice is the answer to a voice's creation.
type clonedVoice struct {
	ID, Type     string
	SampleRate   int     `json:"sample_rate"`
	Seconds      float64 `json:"seconds"`
	Tokens       int     `json:"tokens"`
	LatentFrames int     `json:"latent_frames"`
}

// libraryModel is a model that makes voices from clips, as walkVoiceLibrary takes it.
type libraryModel struct {
	manifest string   // its pipeline.yaml
	name     string   // the model's name
	voices   []string // its built-in voices, in order
	rate     int      // its sample rate
	clip     []byte   // a 5 s WAV to clone a voice from
	clipRate int      // clip's sample rate
	short    []byte   // a 2 s WAV: too short for a voice
	// prompt checks what the created voice holds (a token model's speech tokens, a latent
	// model's latent frames).
	prompt func(clonedVoice) bool
}

// wavPCM checks that body is a mono 16-bit WAV at rate and returns its samples' bytes.
func wavPCM(t *testing.T, what string, body []byte, rate int) []byte {
	t.Helper()
	if len(body) < 44 || string(body[:4]) != "RIFF" || string(body[8:16]) != "WAVEfmt " || string(body[36:40]) != "data" {
		t.Fatalf("%s: not a WAV: %d bytes: %.200q", what, len(body), body)
	}
	channels, r, bits := binary.LittleEndian.Uint16(body[22:]), binary.LittleEndian.Uint32(body[24:]), binary.LittleEndian.Uint16(body[34:])
	if channels != 1 || int(r) != rate || bits != 16 {
		t.Fatalf("%s: %d channels at %d Hz, %d bits; want mono %d Hz as 16-bit", what, channels, r, bits, rate)
	}
	return body[44:]
}

// sameWithin1 fails unless 16-bit PCM a and b are as long and differ by at most one step.
func sameWithin1(t *testing.T, what string, a, b []byte) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d bytes, against %d", what, len(b), len(a))
	}
	for i := 0; i+1 < len(a); i += 2 {
		x, y := int16(binary.LittleEndian.Uint16(a[i:])), int16(binary.LittleEndian.Uint16(b[i:]))
		if d := int(x) - int(y); d < -1 || d > 1 {
			t.Fatalf("%s: sample %d is %d, against %d", what, i/2, y, x)
		}
	}
}

// walkVoiceLibrary runs `voxmux serve` on m with a voice library: creates without the admin
// token are refused; a voice cloned from m.clip over HTTP is listed, speaks otherwise than
// default, is kept across a restart with its audio (within one 16-bit step), and is deleted; the
// same clip as a request's ref_audio speaks as that voice; a clip too short is a 400 naming its
// length.
func walkVoiceLibrary(t *testing.T, m libraryModel) {
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
`, listen, m.manifest, ortLib(t), adminListen, token, filepath.Join(dir, "voices"))), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, cfg, listen)
	wav := m.clip

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

	// Too short a clip: a 400 naming its length and the minimum (the router's, which is the
	// instances').
	code, b := uploadVoice(t, s.url, token, "shorty", m.short)
	var e struct {
		Error struct{ Message, Code, Param string }
	}
	if code != 400 || json.Unmarshal(b, &e) != nil || e.Error.Param != "file" || !strings.Contains(e.Error.Message, "2.00 seconds; use 3 to 30") {
		t.Fatalf("create from a 2 s clip: %d %.300s; want 400 on file naming its length", code, b)
	}

	code, b = uploadVoice(t, s.url, token, "alice", wav)
	var created clonedVoice
	if code != 201 || json.Unmarshal(b, &created) != nil || created.ID != "alice" || created.Type != "cloned" ||
		created.SampleRate != m.clipRate || math.Abs(created.Seconds-5) > 0.01 || !m.prompt(created) {
		t.Fatalf("create alice: %d %.300s", code, b)
	}
	types, ids := voiceTypes(t, s.url)
	if !slices.Equal(ids, append(slices.Clone(m.voices), "alice")) || types["alice"] != "cloned" {
		t.Fatalf("voices after create: %v %v", ids, types)
	}
	for _, v := range m.voices {
		if types[v] != "builtin" {
			t.Fatalf("voices after create: %s is %q, not builtin", v, types[v])
		}
	}

	speak := func(url, body string) []byte {
		t.Helper()
		code, _, out := speech(t, url, body)
		if code != 200 {
			t.Fatalf("speech %.120s: status %d: %.300s", body, code, out)
		}
		pcm := wavPCM(t, "speech", out, m.rate)
		if len(pcm) == 0 {
			t.Fatalf("speech %.120s: no audio", body)
		}
		return pcm
	}
	req := `"model":"` + m.name + `","input":"Hello world. This is voxmux.","response_format":"wav","seed":1`
	alice := speak(s.url, `{`+req+`,"voice":"alice"}`)
	if bytes.Equal(alice, speak(s.url, `{`+req+`,"voice":"default"}`)) {
		t.Error("voices alice and default gave the same audio")
	}

	// Names taken by a cloned or a built-in voice (but for case).
	for _, name := range []string{"alice", strings.ToUpper(m.voices[len(m.voices)-1])} {
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
	sameWithin1(t, "alice after the restart", alice, speak(s.url, `{`+req+`,"voice":"alice"}`))

	// The clip for one request: the voice it makes is alice's.
	ref := fmt.Sprintf(`{%s,"voice":"alloy","ref_audio":"%s","ref_text":"Hello, this is a test of my voice."}`, req, base64.StdEncoding.EncodeToString(wav))
	sameWithin1(t, "ref_audio with alice's clip", alice, speak(s.url, ref))

	// Deleted: gone from the list, and a request for it is one for an unknown voice.
	if code, b := voiceReq(t, "DELETE", s.url+"/v1/audio/voices/alice", token, "", nil); code != 200 {
		t.Fatalf("delete alice: %d %.300s", code, b)
	}
	if types, _ := voiceTypes(t, s.url); types["alice"] != "" {
		t.Fatal("alice is listed after delete")
	}
	code, _, b = speech(t, s.url, `{`+req+`,"voice":"alice"}`)
	if code != 400 || json.Unmarshal(b, &e) != nil || e.Error.Code != "invalid_value" || e.Error.Param != "voice" {
		t.Fatalf("speech in a deleted voice: %d %.300s; want 400 invalid_value on voice", code, b)
	}
}

// `voxmux serve` on models/tiny-cosyvoice3 with a voice library (walkVoiceLibrary).
func TestEndToEndTinyCosyVoice3Library(t *testing.T) {
	walkVoiceLibrary(t, libraryModel{manifest: tinyCosyVoice3(t), name: "cosyvoice3", voices: []string{"default", "bench"}, rate: 24000,
		clip: voicedWAV(24000, 5, 0), clipRate: 24000, short: voicedWAV(24000, 2, 0),
		prompt: func(v clonedVoice) bool { return v.Tokens > 0 }})
}
