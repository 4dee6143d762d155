package library

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
	"github.com/voxmux/voxmux/tts/promptfile"
)

func testPrompt(n int) *tts.VoicePrompt {
	p := &tts.VoicePrompt{Text: "<|endofprompt|>hello there", MelBins: 4, Embedding: []float32{0.5, -1, 2}}
	for i := range n {
		p.SpeechTokens = append(p.SpeechTokens, int64(i*7))
		p.Mel = append(p.Mel, float32(i), float32(-i), 0.25, 1e-3, 1, 2, 3, 4)
	}
	return p
}

func open(t *testing.T, dir string, entries int, bytes int64) *Library {
	t.Helper()
	l, err := Open(Options{Dir: dir, MaxEntries: entries, MaxBytes: bytes})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestCreateReadDelete(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, 8, 1<<20)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := testPrompt(5)
	if err := l.Create("anna_1", p, Meta{Text: "hello there", Consent: "Anna agreed", CreatedAt: at, SampleRate: 16000, Seconds: 3.5}); err != nil {
		t.Fatal(err)
	}
	if err := l.Create("anna_1", p, Meta{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	if err := l.Create("../x", p, Meta{}); !errors.Is(err, ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
	for _, f := range []string{"voice.yaml", "mel.f32", "embedding.f32"} {
		if _, err := os.Stat(filepath.Join(dir, "anna_1", f)); err != nil {
			t.Fatal(err)
		}
	}
	// A new library over the folder (a restart) reads it all from disk.
	l = open(t, dir, 8, 1<<20)
	m, err := l.Get("anna_1")
	want := Meta{Name: "anna_1", Text: "hello there", Consent: "Anna agreed", CreatedAt: at, SampleRate: 16000, Seconds: 3.5, Tokens: 5, Family: "staged"}
	if err != nil || !reflect.DeepEqual(m, want) {
		t.Fatalf("meta %+v %v, want %+v", m, err, want)
	}
	got, err := l.Prompt("anna_1")
	if err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("prompt %+v %v, want %+v", got, err, p)
	}
	if n, b := l.CacheStats(); n != 1 || b != int64(p.Bytes()) {
		t.Fatalf("cache %d %d", n, b)
	}
	if len(l.List()) != 1 {
		t.Fatalf("list %v", l.List())
	}
	if err := l.Delete("anna_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Prompt("anna_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := l.Delete("anna_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}

// TestLatentVoice: a latent-space model's voice (latents, no speech tokens, mel or embedding) is
// stored, read back after a restart and counted in the cache by its latents.
func TestLatentVoice(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, 8, 1<<20)
	p := &tts.VoicePrompt{Text: "hello there", LatentDim: 4}
	for i := range 6 * 4 {
		p.Latents = append(p.Latents, float32(i)/3-2)
	}
	if err := l.Create("vox", p, Meta{Text: "hello there", Consent: "agreed"}); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "vox")); len(ents) != 2 {
		t.Fatalf("files %v, want voice.yaml and latents.f32", ents)
	}
	l = open(t, dir, 8, 1<<20)
	m, err := l.Get("vox")
	if err != nil || m.LatentFrames != 6 || m.Tokens != 0 || m.Family != "voxcpm" {
		t.Fatalf("meta %+v %v, want 6 latent frames of the voxcpm family", m, err)
	}
	got, err := l.Prompt("vox")
	if err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("prompt %+v %v, want %+v", got, err, p)
	}
	if _, b := l.CacheStats(); b != int64(len(p.Text)+4*len(p.Latents)) {
		t.Fatalf("cache bytes %d", b)
	}
	// A prompt that would not read back is not stored.
	if err := l.Create("bad", &tts.VoicePrompt{Text: "x", Latents: []float32{1, 2, 3}, LatentDim: 2}, Meta{}); err == nil {
		t.Fatal("stored latents of part frames")
	}
	if _, err := l.Get("bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get bad: %v", err)
	}
}

// TestOldFolder: a folder written before voice.yaml had latent keys is served as before.
func TestOldFolder(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "anna")
	os.Mkdir(old, 0o755)
	os.WriteFile(filepath.Join(old, "voice.yaml"), []byte(`text: <|endofprompt|>hello there
speech_tokens: [0, 7]
mel: mel.f32
mel_bins: 4
embedding: embedding.f32
transcript: hello there
created_at: 2026-01-02T03:04:05Z
consent: Anna agreed
source:
  sample_rate: 16000
  seconds: 3.5
`), 0o644)
	want := testPrompt(2)
	os.WriteFile(filepath.Join(old, "mel.f32"), promptfile.EncodeFloats(want.Mel), 0o644)
	os.WriteFile(filepath.Join(old, "embedding.f32"), promptfile.EncodeFloats(want.Embedding), 0o644)
	l := open(t, dir, 8, 1<<20)
	if m, err := l.Get("anna"); err != nil || m.Tokens != 2 || m.Consent != "Anna agreed" || m.LatentFrames != 0 {
		t.Fatalf("meta %+v %v", m, err)
	}
	if got, err := l.Prompt("anna"); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("prompt %+v %v, want %+v", got, err, want)
	}
}

// TestDiedMidWrite: a process that died while writing leaves a working folder; the next start
// removes it, and there is no voice.
func TestDiedMidWrite(t *testing.T) {
	dir := t.TempDir()
	half := filepath.Join(dir, tempPrefix+"bob-123")
	os.Mkdir(half, 0o755)
	os.WriteFile(filepath.Join(half, "mel.f32"), []byte{1, 2, 3, 4}, 0o644)
	os.Mkdir(filepath.Join(dir, deletedPrefix+"old-1"), 0o755)
	l := open(t, dir, 8, 1<<20)
	if len(l.List()) != 0 {
		t.Fatalf("voices %v", l.List())
	}
	if _, err := l.Get("bob"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("not removed: %v", ents)
	}
}

// TestBrokenFolderSkipped: a folder whose voice.yaml cannot be read is not served.
func TestBrokenFolderSkipped(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "broken"), 0o755)
	os.WriteFile(filepath.Join(dir, "broken", "voice.yaml"), []byte("text: [unclosed\n"), 0o644)
	l := open(t, dir, 8, 1<<20)
	if len(l.List()) != 0 {
		t.Fatalf("voices %v", l.List())
	}
	if _, err := l.Prompt("broken"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("prompt of a broken voice: %v", err)
	}
}

// TestFolderCopiedIn: a voice folder copied into the library while it runs is found on demand.
func TestFolderCopiedIn(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	a := open(t, src, 8, 1<<20)
	if err := a.Create("carol", testPrompt(2), Meta{}); err != nil {
		t.Fatal(err)
	}
	l := open(t, dir, 8, 1<<20)
	os.Rename(filepath.Join(src, "carol"), filepath.Join(dir, "carol"))
	if p, err := l.Prompt("carol"); err != nil || len(p.SpeechTokens) != 2 {
		t.Fatalf("%v %v", p, err)
	}
}

func TestCacheBounds(t *testing.T) {
	dir := t.TempDir()
	size := int64(testPrompt(4).Bytes())
	l := open(t, dir, 2, 1<<20)
	for _, n := range []string{"a", "b", "c"} {
		if err := l.Create(n, testPrompt(4), Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	if n, b := l.CacheStats(); n != 2 || b != 2*size {
		t.Fatalf("by entries: %d %d", n, b)
	}
	// By bytes: room for one prompt and a half.
	l = open(t, dir, 10, size+size/2)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := l.Prompt(n); err != nil {
			t.Fatal(err)
		}
	}
	if n, b := l.CacheStats(); n != 1 || b != size {
		t.Fatalf("by bytes: %d %d", n, b)
	}
	if l.cache.get("c") == nil || l.cache.get("a") != nil {
		t.Fatal("the least recently used prompt must go first")
	}
	// A prompt larger than the whole cache is served, not kept.
	l = open(t, dir, 10, size-1)
	if _, err := l.Prompt("a"); err != nil {
		t.Fatal(err)
	}
	if n, _ := l.CacheStats(); n != 0 {
		t.Fatalf("kept %d", n)
	}
}

func TestValidName(t *testing.T) {
	for name, ok := range map[string]bool{"a": true, "Anna-2_b": true, "": false, ".tmp-x": false, "a/b": false, "é": false,
		"x123456789x123456789x123456789x123456789x123456789x123456789abcd": true, "x123456789x123456789x123456789x123456789x123456789x123456789abcde": false} {
		if ValidName(name) != ok {
			t.Errorf("ValidName(%q) != %v", name, ok)
		}
	}
}
