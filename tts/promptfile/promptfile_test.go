package promptfile

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/voxmux/voxmux/tts"
)

// write puts a voice folder for p in a new directory, as a writer of folders does.
func write(t *testing.T, p *tts.VoicePrompt) (string, string) {
	t.Helper()
	f, files, err := FromPrompt(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Transcript, f.CreatedAt, f.Consent = "hello there", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "agreed"
	dir := t.TempDir()
	for _, ff := range files {
		if err := os.WriteFile(filepath.Join(dir, ff.Name), EncodeFloats(ff.Values), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	y, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, YAMLName), y, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, string(y)
}

// read reads a folder back as a reader of folders does.
func read(t *testing.T, dir string) (*tts.VoicePrompt, error) {
	t.Helper()
	path := filepath.Join(dir, YAMLName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(data, path)
	if err != nil {
		return nil, err
	}
	return f.Prompt(dir)
}

func TestRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name   string
		p      tts.VoicePrompt
		keys   []string // voice.yaml has these
		absent []string // and not these
	}{
		{"tokens", tts.VoicePrompt{Text: "<|endofprompt|>hello there", SpeechTokens: []int64{0, 7, 6560}, Mel: []float32{0.5, -1, 2, 3, 1e-30, float32(math.Copysign(0, -1))},
			MelBins: 2, Embedding: []float32{0.1, -0.2, 0.3}},
			[]string{"speech_tokens:", "mel: mel.f32", "mel_bins: 2", "embedding: embedding.f32"}, []string{"latents", "latent_dim"}},
		// A latent-space model's voice: its latents alone, no token family's keys.
		{"latents", tts.VoicePrompt{Text: "hello there", Latents: []float32{0, 1, -1, 0.25, math.MaxFloat32, -3.4e38, 0.1, 7}, LatentDim: 4},
			[]string{"latents: latents.f32", "latent_dim: 4"}, []string{"speech_tokens", "mel", "embedding"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, y := write(t, &c.p)
			for _, k := range c.keys {
				if !strings.Contains(y, k) {
					t.Errorf("voice.yaml has no %q:\n%s", k, y)
				}
			}
			for _, k := range c.absent {
				if strings.Contains(y, k) {
					t.Errorf("voice.yaml has %q:\n%s", k, y)
				}
			}
			got, err := read(t, dir)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, c.p) {
				t.Fatalf("read back\n%+v\nwant\n%+v", *got, c.p)
			}
		})
	}
}

// A folder written before voice.yaml had latent keys (an export's or the library's) still reads.
func TestOldFolderReads(t *testing.T) {
	dir := t.TempDir()
	yml := `text: <|endofprompt|>hello there
speech_tokens: [5, 0, 63]
mel: mel.f32
mel_bins: 2
embedding: embedding.f32
transcript: hello there
created_at: 2026-01-02T03:04:05Z
consent: Anna agreed
source:
  sample_rate: 16000
  seconds: 3.5
`
	mel := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	for name, data := range map[string][]byte{YAMLName: []byte(yml), MelName: EncodeFloats(mel), EmbeddingName: EncodeFloats([]float32{0.5, -1})} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := read(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := tts.VoicePrompt{Text: "<|endofprompt|>hello there", SpeechTokens: []int64{5, 0, 63}, Mel: mel, MelBins: 2, Embedding: []float32{0.5, -1}}
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("read\n%+v\nwant\n%+v", *got, want)
	}
}

func TestBadFolders(t *testing.T) {
	lat := &tts.VoicePrompt{Text: "hi", Latents: []float32{1, 2, 3, 4, 5, 6}, LatentDim: 3}
	for _, c := range []struct {
		name string
		edit func(dir, y string) string
		want string
	}{
		{"latents without latent_dim", func(_, y string) string { return strings.Replace(y, "latent_dim: 3\n", "", 1) }, "latent_dim: is required with latents"},
		{"latents of part frames", func(_, y string) string { return strings.Replace(y, "latent_dim: 3", "latent_dim: 4", 1) }, "latents: 6 values are not whole frames of latent_dim 4"},
		{"no prompt", func(_, y string) string { return strings.Replace(y, "latents: latents.f32\n", "", 1) }, "neither speech_tokens nor latents"},
		{"latents outside the folder", func(dir, y string) string {
			return strings.Replace(y, "latents: latents.f32", "latents: "+filepath.Join(dir, "latents.f32"), 1)
		}, "is not a file of the voice's folder"},
		{"missing latents file", func(_, y string) string { return strings.Replace(y, "latents.f32", "gone.f32", 1) }, "latents: open"},
		{"unknown key", func(_, y string) string { return y + "patches: 2\n" }, "unknown field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, y := write(t, lat)
			if err := os.WriteFile(filepath.Join(dir, YAMLName), []byte(c.edit(dir, y)), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := read(t, dir); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one that says %q", err, c.want)
			}
		})
	}
}

// A prompt that would not read back is refused before anything is written.
func TestFromPromptRefuses(t *testing.T) {
	for _, c := range []struct {
		p    tts.VoicePrompt
		want string
	}{
		{tts.VoicePrompt{Text: "hi", Latents: []float32{1, 2}}, "latent_dim: is required with latents"},
		{tts.VoicePrompt{Text: "hi", Latents: []float32{1, 2, 3}, LatentDim: 2}, "not whole frames of latent_dim 2"},
		{tts.VoicePrompt{Text: "hi", SpeechTokens: []int64{1}, Mel: []float32{1, 2, 3}, MelBins: 2}, "not whole frames of mel_bins 2"},
		{tts.VoicePrompt{Text: "hi", Embedding: []float32{1}}, "neither speech_tokens nor latents"},
	} {
		if _, _, err := FromPrompt(&c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want one that says %q", c.p, err, c.want)
		}
	}
}
