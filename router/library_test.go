package router

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/voxmux/voxmux/router/library"
	"github.com/voxmux/voxmux/tts"
)

var cloningModel = Model{Name: "clone", SampleRate: 24000, Voices: []string{"default", "other"}, Cloning: true}

// fixedPrompt is what the mock instance computes from any clip.
var fixedPrompt = tts.VoicePrompt{Text: "<|endofprompt|>hello", SpeechTokens: []int64{1, 2, 3}, Mel: []float32{0.5, 1, 1.5, 2, 2.5, 3}, MelBins: 2, Embedding: []float32{0.1, 0.2}}

// cloner is a mock instance that clones: it records the clips it was given and the prompts
// requests carried.
type cloner struct {
	tts.MockInstance
	clips   atomic.Int32
	prompts chan *tts.VoicePrompt
}

func newCloner(extractErr error) *cloner {
	c := &cloner{prompts: make(chan *tts.VoicePrompt, 16)}
	c.ExtractF = func(_ context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
		c.clips.Add(1)
		if clip.SampleRate != 16000 || len(clip.PCM) != 48000 || clip.Text == "" {
			return tts.VoicePrompt{}, tts.Invalid("unexpected clip")
		}
		return fixedPrompt, extractErr
	}
	c.SynthesizeF = func(_ context.Context, req tts.Request, emit func(tts.Chunk) error) error {
		c.prompts <- req.Prompt
		return emit(tts.Chunk{PCM: make([]float32, 240), SampleRate: 24000})
	}
	return c
}

// serveLibrary serves cloningModel over one cloner, with a library in dir.
func serveLibrary(t *testing.T, dir string, c *cloner, tweak func(*Options)) string {
	t.Helper()
	lib, err := library.Open(library.Options{Dir: dir, MaxEntries: 4, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	url, _ := serveWith(t, cloningModel, func(o *Options) {
		o.Voices = lib
		if tweak != nil {
			tweak(o)
		}
	}, ready("i0", c, 4))
	return url
}

// wav16 is a 16-bit mono WAV of a tone.
func wav16(rate int, seconds float64) []byte {
	n := int(float64(rate) * seconds)
	var b bytes.Buffer
	b.WriteString("RIFF")
	binary.Write(&b, binary.LittleEndian, uint32(36+2*n))
	b.WriteString("WAVEfmt ")
	binary.Write(&b, binary.LittleEndian, []uint32{16})
	binary.Write(&b, binary.LittleEndian, []uint16{1, 1})
	binary.Write(&b, binary.LittleEndian, []uint32{uint32(rate), uint32(2 * rate)})
	binary.Write(&b, binary.LittleEndian, []uint16{2, 16})
	b.WriteString("data")
	binary.Write(&b, binary.LittleEndian, uint32(2*n))
	for i := range n {
		binary.Write(&b, binary.LittleEndian, int16(8000*math.Sin(float64(i)/10)))
	}
	return b.Bytes()
}

// multipartVoice builds a POST /v1/audio/voices body; empty fields are left out.
func multipartVoice(t *testing.T, fields map[string]string, file []byte) (string, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for k, v := range fields {
		if v != "" {
			w.WriteField(k, v)
		}
	}
	if file != nil {
		f, _ := w.CreateFormFile("file", "clip.wav")
		f.Write(file)
	}
	w.Close()
	return b.String(), w.FormDataContentType()
}

func createVoice(t *testing.T, url string, fields map[string]string, file []byte, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	body, ct := multipartVoice(t, fields, file)
	h := map[string]string{"Content-Type": ct}
	for k, v := range header {
		h[k] = v
	}
	return do(t, "POST", url+"/v1/audio/voices", body, h)
}

func anna() map[string]string {
	return map[string]string{"name": "anna", "text": "Hello, this is Anna.", "consent": "Anna agreed on 2026-01-05, recorded."}
}

func speak(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	return do(t, "POST", url+"/v1/audio/speech", body, map[string]string{"Content-Type": "application/json"})
}

func TestVoiceLibraryLifecycle(t *testing.T) {
	dir := t.TempDir()
	c := newCloner(nil)
	url := serveLibrary(t, dir, c, nil)

	resp, body := createVoice(t, url, anna(), wav16(16000, 3), nil)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	var v voiceView
	json.Unmarshal(body, &v)
	if v.Name != "anna" || v.Type != "cloned" || v.Text != "Hello, this is Anna." || v.Seconds != 3 || v.Tokens != 3 || v.SampleRate != 16000 || v.CreatedAt.IsZero() {
		t.Fatalf("created %s", body)
	}

	resp, body = do(t, "GET", url+"/v1/audio/voices", "", nil)
	var l struct {
		Data []struct {
			ID, Type string
		} `json:"data"`
		Voices []namedEntry `json:"voices"`
	}
	json.Unmarshal(body, &l)
	if len(l.Data) != 3 || l.Data[0].Type != "builtin" || l.Data[2].ID != "anna" || l.Data[2].Type != "cloned" || len(l.Voices) != 3 {
		t.Fatalf("list %s", body)
	}

	resp, body = do(t, "GET", url+"/v1/audio/voices/anna", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"consent":"Anna agreed on 2026-01-05, recorded."`) {
		t.Fatalf("get: %d %s", resp.StatusCode, body)
	}

	use := func(url string) {
		t.Helper()
		resp, body := speak(t, url, `{"input":"hi","voice":"anna","response_format":"pcm"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("speak: %d %s", resp.StatusCode, body)
		}
		if p := <-c.prompts; p == nil || !reflect.DeepEqual(*p, fixedPrompt) {
			t.Fatalf("the instance got prompt %+v", p)
		}
	}
	use(url)
	// A built-in voice carries no prompt.
	if resp, _ := speak(t, url, `{"input":"hi","voice":"other","response_format":"pcm"}`); resp.StatusCode != 200 || <-c.prompts != nil {
		t.Fatal("a built-in voice must not carry a prompt")
	}

	// A restart: a new server over the same folder has the voice.
	url2 := serveLibrary(t, dir, c, nil)
	use(url2)

	if resp, body := do(t, "DELETE", url2+"/v1/audio/voices/anna", "", nil); resp.StatusCode != 200 || !strings.Contains(string(body), `"deleted":true`) {
		t.Fatalf("delete: %d %s", resp.StatusCode, body)
	}
	if resp, _ := do(t, "GET", url2+"/v1/audio/voices/anna", "", nil); resp.StatusCode != 404 {
		t.Fatalf("get after delete: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "DELETE", url2+"/v1/audio/voices/anna", "", nil); resp.StatusCode != 404 {
		t.Fatalf("second delete: %d", resp.StatusCode)
	}
	if resp, _ := speak(t, url2, `{"input":"hi","voice":"anna"}`); resp.StatusCode != 400 {
		t.Fatalf("speak in a deleted voice: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "DELETE", url2+"/v1/audio/voices/default", "", nil); resp.StatusCode != 400 {
		t.Fatalf("delete a built-in voice: %d", resp.StatusCode)
	}
}

func TestCreateVoiceJSON(t *testing.T) {
	c := newCloner(nil)
	url := serveLibrary(t, t.TempDir(), c, nil)
	body, _ := json.Marshal(map[string]string{"name": "bob-2", "text": "Hi there.", "consent": "Bob agreed.",
		"audio": base64.StdEncoding.EncodeToString(wav16(16000, 3))})
	resp, b := do(t, "POST", url+"/v1/audio/voices", string(body), map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(b), `"name":"bob-2"`) {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	// A data: URL is taken too.
	body, _ = json.Marshal(map[string]string{"name": "bob-3", "text": "Hi there.", "consent": "Bob agreed.",
		"audio": "data:audio/wav;base64," + base64.StdEncoding.EncodeToString(wav16(16000, 3))})
	if resp, b := do(t, "POST", url+"/v1/audio/voices", string(body), map[string]string{"Content-Type": "application/json"}); resp.StatusCode != http.StatusCreated {
		t.Fatalf("data URL: %d %s", resp.StatusCode, b)
	}
}

func TestCreateVoiceErrors(t *testing.T) {
	dir := t.TempDir()
	c := newCloner(nil)
	url := serveLibrary(t, dir, c, func(o *Options) { o.MaxUploadBytes = 100 << 10 })
	if resp, b := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	with := func(k, v string) map[string]string {
		f := anna()
		f[k] = v
		return f
	}
	for _, tc := range []struct {
		name   string
		fields map[string]string
		file   []byte
		status int
		want   string
	}{
		{"clash", anna(), wav16(16000, 3), 409, "exists"},
		{"clash with a built-in voice", with("name", "Default"), wav16(16000, 3), 409, "built-in"},
		{"clash with an OpenAI name", with("name", "alloy"), wav16(16000, 3), 409, "built-in"},
		{"bad name", with("name", "a b"), wav16(16000, 3), 400, "name"},
		{"no consent", with("consent", ""), wav16(16000, 3), 400, "consent is required"},
		{"no text", with("text", ""), wav16(16000, 3), 400, "text is required"},
		{"no file", with("name", "x1"), nil, 400, "file is required"},
		{"oversized", with("name", "x2"), wav16(16000, 4), 413, "limit is 102400"},
		{"not audio", with("name", "x3"), []byte("RIFF....WAVEjunkjunkjunk"), 400, "cannot be read"},
		{"too short", with("name", "x4"), wav16(16000, 0.5), 400, "0.50 seconds"},
		{"shorter than the instances take", with("name", "x5"), wav16(16000, 2.5), 400, "the clip is 2.50 seconds; use 3 to 30 seconds"},
	} {
		resp, b := createVoice(t, url, tc.fields, tc.file, nil)
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, resp.StatusCode, b, tc.status, tc.want)
		}
	}
	if n := c.clips.Load(); n != 1 {
		t.Errorf("%d extractions; refused uploads must not reach an instance", n)
	}
	// An instance that refuses the clip: 400, and nothing is saved.
	bad := newCloner(tts.Invalid("the clip has no speech"))
	url = serveLibrary(t, dir, bad, nil)
	resp, b := createVoice(t, url, with("name", "quiet"), wav16(16000, 3), nil)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "the clip has no speech") {
		t.Fatalf("refused clip: %d %s", resp.StatusCode, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "quiet")); !os.IsNotExist(err) {
		t.Fatalf("a failed create left files: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("library folder holds %v", ents)
	}
}

func TestCloningNeedsAModelThatClones(t *testing.T) {
	lib, _ := library.Open(library.Options{Dir: t.TempDir(), MaxEntries: 4, MaxBytes: 1 << 20})
	url, _ := serveWith(t, tinyModel, func(o *Options) { o.Voices = lib }, ready("i0", newCloner(nil), 4))
	if resp, b := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 501 || !strings.Contains(string(b), "cannot clone") {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	ref := base64.StdEncoding.EncodeToString(wav16(16000, 3))
	if resp, b := speak(t, url, `{"input":"hi","ref_audio":"`+ref+`","ref_text":"hello"}`); resp.StatusCode != 501 || !strings.Contains(string(b), "cannot clone") {
		t.Fatalf("ref_audio: %d %s", resp.StatusCode, b)
	}
}

func TestVoiceAuth(t *testing.T) {
	c := newCloner(nil)
	url := serveLibrary(t, t.TempDir(), c, func(o *Options) {
		o.AdminToken = "admin-token-0123456789"
		o.APIKeys = map[string]struct{}{"sk-speak": {}, "sk-voices": {}}
		o.VoiceKeys = map[string]struct{}{"sk-voices": {}}
	})
	bearer := func(k string) map[string]string { return map[string]string{"Authorization": "Bearer " + k} }
	if resp, _ := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 401 {
		t.Fatalf("no key: %d", resp.StatusCode)
	}
	if resp, _ := createVoice(t, url, anna(), wav16(16000, 3), bearer("sk-speak")); resp.StatusCode != 403 {
		t.Fatalf("a key without the right: %d", resp.StatusCode)
	}
	if resp, b := createVoice(t, url, anna(), wav16(16000, 3), bearer("admin-token-0123456789")); resp.StatusCode != 201 {
		t.Fatalf("admin token: %d %s", resp.StatusCode, b)
	}
	f := anna()
	f["name"] = "anna2"
	if resp, b := createVoice(t, url, f, wav16(16000, 3), bearer("sk-voices")); resp.StatusCode != 201 {
		t.Fatalf("a key with the right: %d %s", resp.StatusCode, b)
	}
	// Every key may list, read and speak; only the admin token and voices keys delete.
	if resp, _ := do(t, "GET", url+"/v1/audio/voices/anna", "", bearer("sk-speak")); resp.StatusCode != 200 {
		t.Fatalf("get: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "DELETE", url+"/v1/audio/voices/anna", "", bearer("sk-speak")); resp.StatusCode != 403 {
		t.Fatalf("delete with a speech key: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "DELETE", url+"/v1/audio/voices/anna", "", bearer("admin-token-0123456789")); resp.StatusCode != 200 {
		t.Fatalf("delete with the admin token: %d", resp.StatusCode)
	}
	// The admin token is no speech key.
	if resp, _ := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi"}`, bearer("admin-token-0123456789")); resp.StatusCode != 401 {
		t.Fatalf("speech with the admin token: %d", resp.StatusCode)
	}

	// Only an admin token, no API keys: speech is open, voices need the token.
	url = serveLibrary(t, t.TempDir(), c, func(o *Options) { o.AdminToken = "admin-token-0123456789" })
	if resp, _ := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 401 {
		t.Fatalf("no token: %d", resp.StatusCode)
	}
	if resp, _ := createVoice(t, url, anna(), wav16(16000, 3), bearer("admin-token-0123456789")); resp.StatusCode != 201 {
		t.Fatalf("token: %d", resp.StatusCode)
	}
}

// TestDiedMidWriteLeavesNoVoice: a create that died midway leaves a working folder; the next
// start removes it and serves no such voice.
func TestDiedMidWriteLeavesNoVoice(t *testing.T) {
	dir := t.TempDir()
	half := filepath.Join(dir, ".tmp-anna-0a1b2c")
	os.MkdirAll(half, 0o755)
	os.WriteFile(filepath.Join(half, "mel.f32"), make([]byte, 8), 0o644)
	url := serveLibrary(t, dir, newCloner(nil), nil)
	if resp, _ := do(t, "GET", url+"/v1/audio/voices/anna", "", nil); resp.StatusCode != 404 {
		t.Fatalf("get: %d", resp.StatusCode)
	}
	if _, b := do(t, "GET", url+"/v1/audio/voices", "", nil); strings.Contains(string(b), "anna") {
		t.Fatalf("list: %s", b)
	}
	if _, err := os.Stat(half); !os.IsNotExist(err) {
		t.Fatalf("working folder kept: %v", err)
	}
	if resp, b := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 201 {
		t.Fatalf("create after: %d %s", resp.StatusCode, b)
	}
}

func TestRefAudio(t *testing.T) {
	dir := t.TempDir()
	c := newCloner(nil)
	url := serveLibrary(t, dir, c, nil)
	ref := base64.StdEncoding.EncodeToString(wav16(16000, 3))
	resp, b := speak(t, url, `{"input":"hi","voice":"alloy","response_format":"pcm","ref_audio":"`+ref+`","ref_text":"Hello, this is Anna."}`)
	if resp.StatusCode != 200 {
		t.Fatalf("ad hoc: %d %s", resp.StatusCode, b)
	}
	if p := <-c.prompts; p == nil || !reflect.DeepEqual(*p, fixedPrompt) {
		t.Fatalf("the instance got prompt %+v", p)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("an ad hoc voice was saved: %v", ents)
	}
	if resp, b := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"input":"hi","ref_audio":"` + ref + `"}`, "ref_audio needs ref_text"},
		{`{"input":"hi","ref_text":"hello"}`, "ref_text needs ref_audio"},
		{`{"input":"hi","voice":"anna","ref_audio":"` + ref + `","ref_text":"hello"}`, "send one of them"},
		{`{"input":"hi","ref_audio":"%%%","ref_text":"hello"}`, "not base64"},
		{`{"input":"hi","ref_audio":"` + base64.StdEncoding.EncodeToString([]byte("not audio")) + `","ref_text":"hello"}`, "cannot be read"},
	} {
		if resp, b := speak(t, url, tc.body); resp.StatusCode != 400 || !strings.Contains(string(b), tc.want) {
			t.Errorf("%.60s: %d %s, want 400 with %q", tc.body, resp.StatusCode, b, tc.want)
		}
	}
}

func TestNoLibrary(t *testing.T) {
	url, _ := serveWith(t, cloningModel, nil, ready("i0", newCloner(nil), 4))
	if resp, b := createVoice(t, url, anna(), wav16(16000, 3), nil); resp.StatusCode != 501 || !strings.Contains(string(b), "voices.dir") {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, "GET", url+"/v1/audio/voices/anna", "", nil); resp.StatusCode != 404 {
		t.Fatalf("get: %d", resp.StatusCode)
	}
	if resp, b := do(t, "GET", url+"/v1/audio/voices/default", "", nil); resp.StatusCode != 200 || !strings.Contains(string(b), `"type":"builtin"`) {
		t.Fatalf("get a built-in voice: %d %s", resp.StatusCode, b)
	}
}
