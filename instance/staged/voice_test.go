package staged

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/voxmux/voxmux/tts"
	"github.com/voxmux/voxmux/tts/promptfile"
)

// writeFloats writes values as little-endian float32.
func writeFloats(t *testing.T, path string, v []float32) {
	t.Helper()
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// voiceManifest writes the tiny manifest with voices default, alice and bob in voice_dir
// voices, flow.step and flow.embedding_dim 4, and alice's prompt: 3 speech tokens, their mel
// (frame-major, value 100·frame + bin) and an embedding. edit changes alice's voice.yaml.
func voiceManifest(t *testing.T, edit func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	tiny, err := filepath.Abs("../../models/tiny/flow_step.onnx")
	if err != nil {
		t.Fatal(err)
	}
	path := writeManifest(t, dir, func(s string) string {
		s = strings.Replace(s, "voices: [default]", "voices: [default, alice, bob]\nvoice_dir: voices", 1)
		return strings.Replace(s, "  mel_bins: 80", "  step: "+tiny+"\n  embedding_dim: 4\n  mel_bins: 80", 1)
	})
	alice := filepath.Join(dir, "voices", "alice")
	if err := os.MkdirAll(alice, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "voices", "bob"), 0o755); err != nil {
		t.Fatal(err)
	}
	mel := make([]float32, 6*80)
	for f := range 6 {
		for c := range 80 {
			mel[f*80+c] = float32(100*f + c)
		}
	}
	writeFloats(t, filepath.Join(alice, "mel.f32"), mel)
	writeFloats(t, filepath.Join(alice, "embedding.f32"), []float32{1, 2, 3, 4})
	yml := "text: \"Hi.\"\nspeech_tokens: [5, 0, 63]\nmel: mel.f32\nembedding: embedding.f32\n"
	if err := os.WriteFile(filepath.Join(alice, "voice.yaml"), []byte(edit(yml)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "voices", "bob", "voice.yaml"), []byte("text: \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVoicesLoad(t *testing.T) {
	m, err := LoadManifest(voiceManifest(t, func(s string) string { return s }))
	if err != nil {
		t.Fatal(err)
	}
	a := m.voices["alice"]
	if a == nil {
		t.Fatal("alice has no prompt")
	}
	if !slices.Equal(a.SpeechTokens, []int64{5, 0, 63}) || !slices.Equal(a.Embedding, []float32{1, 2, 3, 4}) {
		t.Fatalf("alice: tokens %v, embedding %v", a.SpeechTokens, a.Embedding)
	}
	// Channel-major: bin c, frame f at c·6+f.
	if len(a.Mel) != 6*80 || a.Mel[0] != 0 || a.Mel[1] != 100 || a.Mel[6] != 1 || a.Mel[79*6+5] != 579 {
		t.Fatalf("alice's mel is not the file's, channel-major: %v", a.Mel[:8])
	}
	// The voice's text in LM ids (bytes + offset 3).
	if !slices.Equal(a.textIDs, []int64{'H' + 3, 'i' + 3, '.' + 3}) {
		t.Fatalf("alice's text ids %v", a.textIDs)
	}
	// default has no folder: no prompt; bob has an empty one, with a zero embedding.
	if m.voices["default"] != nil {
		t.Fatal("default has a prompt")
	}
	if b := m.voices["bob"]; b == nil || len(b.SpeechTokens) != 0 || !slices.Equal(b.Embedding, make([]float32, 4)) {
		t.Fatalf("bob: %+v", b)
	}
	// A request's voice: its own; the first listed for a name the manifest does not list.
	if m.voice("alice") != a || m.voice("") != nil || m.voice("alloy") != nil || m.voice("bob") != m.voices["bob"] {
		t.Fatal("voice() does not pick the request's voice")
	}
	if got := m.promptLens(); !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("prompt lengths %v, want [0 3]", got)
	}
}

// A voice folder in the shared prompt format (tts/promptfile) with the keys the voice library
// writes beside the prompt (transcript, created_at, consent, source), as an operator copies one
// from the library into voice_dir, loads: its voice.yaml's mel_bins is checked and the keys that
// tell where the voice came from are ignored.
func TestVoicesLoadLibraryFolder(t *testing.T) {
	mel := make([]float32, 6*80)
	for f := range 6 {
		for c := range 80 {
			mel[f*80+c] = float32(100*f + c)
		}
	}
	p := &tts.VoicePrompt{Text: "Hi.", SpeechTokens: []int64{5, 0, 63}, Mel: mel, MelBins: 80, Embedding: []float32{1, 2, 3, 4}}
	f, files, err := promptfile.FromPrompt(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Transcript, f.CreatedAt, f.Consent = "hi", time.Now().UTC(), "recorded by alice"
	f.Source = promptfile.Source{SampleRate: 24000, Seconds: 5}
	path := voiceManifest(t, func(s string) string { return s })
	to := filepath.Join(filepath.Dir(path), "voices", "alice")
	for _, ff := range files {
		if err := os.WriteFile(filepath.Join(to, ff.Name), promptfile.EncodeFloats(ff.Values), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	yb, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(to, promptfile.YAMLName), yb, 0o644); err != nil {
		t.Fatal(err)
	}
	y, _ := os.ReadFile(filepath.Join(to, "voice.yaml"))
	for _, key := range []string{"mel_bins:", "transcript:", "created_at:", "consent:", "source:"} {
		if !strings.Contains(string(y), key) {
			t.Fatalf("the library's voice.yaml has no %s key; the test no longer covers it:\n%s", key, y)
		}
	}
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	a := m.voices["alice"]
	if a == nil || a.Text != "Hi." || !slices.Equal(a.SpeechTokens, p.SpeechTokens) || !slices.Equal(a.Embedding, p.Embedding) ||
		!slices.Equal(a.Mel, frameMajorToChannels(mel, 6, 80)) {
		t.Fatalf("alice from the library: %+v", a)
	}
}

// Every bad voice file gives an error that names the voice, its file and the key.
func TestVoicesRefuseBadFiles(t *testing.T) {
	for _, c := range []struct {
		name       string
		edit       func(string) string
		key, words string
	}{
		{"token out of range", func(s string) string { return strings.Replace(s, "63]", "64]", 1) }, "speech_tokens", "outside [0, lm.speech_vocab = 64)"},
		{"negative token", func(s string) string { return strings.Replace(s, "[5,", "[-1,", 1) }, "speech_tokens", "outside"},
		{"mel of other tokens", func(s string) string { return strings.Replace(s, "[5, 0, 63]", "[5, 0]", 1) }, "mel", "want flow.frames_per_token × 2 speech tokens × flow.mel_bins = 320"},
		{"no mel", func(s string) string { return strings.Replace(s, "mel: mel.f32\n", "", 1) }, "mel", "is required with speech_tokens"},
		{"missing mel file", func(s string) string { return strings.Replace(s, "mel.f32", "nothing.f32", 1) }, "mel", "no such file"},
		{"embedding size", func(s string) string { return strings.Replace(s, "embedding.f32", "mel.f32", 1) }, "embedding", "want flow.embedding_dim = 4"},
		{"unknown key", func(s string) string { return s + "speed: 2\n" }, "speed", "unknown field"},
		{"mel_bins not the flow's", func(s string) string { return s + "mel_bins: 40\n" }, "mel_bins", "is 40, the model's flow.mel_bins is 80"},
		{"latents", func(s string) string { return s + "latents: mel.f32\nlatent_dim: 4\n" }, "latents", "a latent-space model's voice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadManifest(voiceManifest(t, c.edit))
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range []string{"voice alice", filepath.Join("alice", "voice.yaml"), c.key, c.words} {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("err %q does not say %q", err, w)
				}
			}
		})
	}
	// A folder without voice.yaml.
	path := voiceManifest(t, func(s string) string { return s })
	if err := os.Remove(filepath.Join(filepath.Dir(path), "voices", "bob", "voice.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadManifest(path); err == nil || !strings.Contains(err.Error(), "voice bob") || !strings.Contains(err.Error(), "voice.yaml") {
		t.Fatalf("bob without voice.yaml: err %v", err)
	}
}

// A prompt's mel reaches the flow only through the step graph's cond and embedding inputs.
func TestVoicesNeedEmbeddingDim(t *testing.T) {
	dir := t.TempDir()
	path := writeManifest(t, dir, func(s string) string {
		return strings.Replace(s, "voices: [default]", "voices: [default]\nvoice_dir: voices", 1)
	})
	if err := os.MkdirAll(filepath.Join(dir, "voices", "default"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFloats(t, filepath.Join(dir, "voices", "default", "mel.f32"), make([]float32, 160))
	if err := os.WriteFile(filepath.Join(dir, "voices", "default", "voice.yaml"), []byte("text: hi\nspeech_tokens: [1]\nmel: mel.f32\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadManifest(path); err == nil || !strings.Contains(err.Error(), "speech_tokens") || !strings.Contains(err.Error(), "flow.embedding_dim") {
		t.Fatalf("speech tokens without flow.embedding_dim: err %v", err)
	}
	// Text alone is a prompt for the LM only, and loads.
	if err := os.WriteFile(filepath.Join(dir, "voices", "default", "voice.yaml"), []byte("text: hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	if v := m.voice("default"); v == nil || v.Text != "hi" || v.Embedding != nil {
		t.Fatalf("default: %+v", v)
	}
	// embedding_dim needs the step graph.
	m.Flow.EmbeddingDim = 4
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "flow.embedding_dim: needs flow.step") {
		t.Fatalf("embedding_dim without flow.step: err %v", err)
	}
}

// The prompt: [bos, voice text, segment text, sos, voice speech tokens + offset]; the speech
// token bounds count the segment's text alone.
func TestPromptWithVoice(t *testing.T) {
	m := tinyManifest(t)
	off, so := m.Tokenizer.Offset, m.LM.SpeechTokenOffset
	v := &Voice{Text: "ab", textIDs: []int64{'a' + off, 'b' + off}, SpeechTokens: []int64{7, 0}}
	got, seg := m.Prompt(v, "xyz")
	want := []int64{m.Tokenizer.BOS, 'a' + off, 'b' + off, 'x' + off, 'y' + off, 'z' + off, m.LM.SOS, 7 + so, 0 + so}
	if !slices.Equal(got, want) || seg != 3 {
		t.Fatalf("prompt %v (%d segment tokens), want %v (3)", got, seg, want)
	}
	// Without a voice: as Tokenize always made it.
	if got, seg := m.Prompt(nil, "xyz"); !slices.Equal(got, m.Tokenize("xyz")) || len(got) != 5 || seg != 3 {
		t.Fatalf("prompt without a voice %v", got)
	}
	m.LM.MinTokensPerTextToken, m.LM.MaxTokensPerTextToken = 2, 20
	if lo, hi := m.TokenBounds("xyz", seg); lo != 6 || hi != 60 {
		t.Fatalf("bounds %d..%d, want 6..60 (3 segment tokens)", lo, hi)
	}
}

// lm.endofprompt: lm.default_prompt_text goes before the segment's text unless the voice's text
// or the segment's holds the id.
func TestPromptEndOfPrompt(t *testing.T) {
	m := tinyManifest(t)
	off := m.Tokenizer.Offset
	m.LM.EndOfPrompt, m.LM.DefaultPromptText = '#'+off, "s#"
	if err := m.checkEndOfPrompt(); err != nil {
		t.Fatal(err)
	}
	sys := []int64{'s' + off, '#' + off}
	bos, sos := m.Tokenizer.BOS, m.LM.SOS
	v := &Voice{textIDs: []int64{'a' + off}}
	for _, c := range []struct {
		voice *Voice
		seg   string
		want  []int64
	}{
		{v, "xy", slices.Concat([]int64{bos, 'a' + off}, sys, []int64{'x' + off, 'y' + off, sos})},
		{nil, "x", slices.Concat([]int64{bos}, sys, []int64{'x' + off, sos})},
		{&Voice{textIDs: []int64{'#' + off}}, "x", []int64{bos, '#' + off, 'x' + off, sos}},
		{v, "x#", []int64{bos, 'a' + off, 'x' + off, '#' + off, sos}},
	} {
		got, seg := m.Prompt(c.voice, c.seg)
		if !slices.Equal(got, c.want) || seg != len(c.seg) {
			t.Errorf("%q: prompt %v (%d segment tokens), want %v", c.seg, got, seg, c.want)
		}
	}
	m.LM.DefaultPromptText = "no marker"
	if err := m.checkEndOfPrompt(); err == nil || !strings.Contains(err.Error(), "lm.default_prompt_text") {
		t.Fatalf("a default text without the id: err %v", err)
	}
	m.LM.DefaultPromptText = ""
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "lm.default_prompt_text: is required") {
		t.Fatalf("endofprompt without a default text: err %v", err)
	}
}
