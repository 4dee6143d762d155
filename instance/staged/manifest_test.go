package staged

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// writeManifest writes models/tiny/pipeline.yaml with its graphs' paths made absolute and the
// given edits applied to its text, in a folder of its own, and returns its path.
func writeManifest(t *testing.T, dir string, edit func(string) string) string {
	t.Helper()
	data, err := os.ReadFile("../../models/tiny/pipeline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tiny, err := filepath.Abs("../../models/tiny")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for _, f := range []string{"lm.onnx", "flow_encoder.onnx", "flow_estimator.onnx", "vocoder.onnx"} {
		s = strings.Replace(s, " "+f, " "+filepath.Join(tiny, f), 1)
	}
	path := filepath.Join(dir, "pipeline.yaml")
	if err := os.WriteFile(path, []byte(edit(s)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// unzstd decompresses src into dst.
func unzstd(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dec, err := zstd.NewReader(in)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	out, err := os.Create(dst)
	if err == nil {
		_, err = io.Copy(out, dec)
	}
	if err == nil {
		err = out.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// tokenizer.type: qwen2 loads the model's own tokenizer files (paths relative to the manifest)
// and frames the reference's ids as the LM prompt.
func TestManifestQwen2Tokenizer(t *testing.T) {
	dir := t.TempDir()
	td := "../text/testdata/qwen2/"
	if err := os.Mkdir(filepath.Join(dir, "tok"), 0o755); err != nil {
		t.Fatal(err)
	}
	unzstd(t, td+"vocab.json.zst", filepath.Join(dir, "tok/vocab.json"))
	unzstd(t, td+"merges.txt.zst", filepath.Join(dir, "tok/merges.txt"))
	cfg, err := os.ReadFile(td + "tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tok/tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeManifest(t, dir, func(s string) string {
		return strings.Replace(s, "  type: bytes\n  offset: 3\n", "  type: qwen2\n  offset: 3\n  vocab: tok/vocab.json\n  merges: tok/merges.txt\n  config: tok/tokenizer_config.json\n  special_tokens: cosyvoice3\n", 1)
	})
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Cases []struct {
			Text string  `json:"text"`
			IDs  []int64 `json:"ids"`
		} `json:"cases"`
	}
	data, err := os.ReadFile(td + "ref_ids.json")
	if err == nil {
		err = json.Unmarshal(data, &ref)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ref.Cases {
		want := []int64{m.Tokenizer.BOS}
		for _, id := range c.IDs {
			want = append(want, id+3)
		}
		want = append(want, m.LM.SOS)
		if got := m.Tokenize(c.Text); !slices.Equal(got, want) {
			t.Errorf("%q: %v, want %v", c.Text, got, want)
		}
	}
}

func TestManifestRefusesBadTextKeys(t *testing.T) {
	for edit, want := range map[string]string{
		"  type: bytes\n":                    "tokenizer.vocab: is required",
		"  vocab: v.json\n":                  "apply only to tokenizer.type: qwen2",
		"  max_prompt_tokens: 2\n":           "lm.max_prompt_tokens: must be more than 2",
		"  sampling: {top_p: 0, top_k: 1}\n": "lm.sampling.top_p",
		"  sampling: {top_p: 1, top_k: 0}\n": "lm.sampling.top_k",
		"  max_tokens_per_text_token: 0\n  min_tokens_per_text_token: 3\n": "lm.max_tokens_per_text_token: must be positive",
	} {
		path := writeManifest(t, t.TempDir(), func(s string) string {
			switch {
			case strings.HasPrefix(edit, "  type"):
				return strings.Replace(s, "  type: bytes\n", "  type: qwen2\n", 1)
			case strings.HasPrefix(edit, "  vocab"):
				return strings.Replace(s, "  type: bytes\n", "  type: bytes\n"+edit, 1)
			}
			return strings.Replace(s, "  max_tokens: 4000\n", "  max_tokens: 4000\n"+edit, 1)
		})
		if _, err := LoadManifest(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", edit, err, want)
		}
	}
	// text.split in a manifest of its own.
	path := writeManifest(t, t.TempDir(), func(s string) string {
		return s + "text:\n  split: {max_tokens: 10, min_tokens: 20}\n"
	})
	if _, err := LoadManifest(path); err == nil || !strings.Contains(err.Error(), "text.split") {
		t.Errorf("min_tokens above max_tokens: %v", err)
	}
	// Defaults: the bound on prompts is there when a manifest names none.
	m, err := LoadManifest(writeManifest(t, t.TempDir(), func(s string) string { return s }))
	if err != nil {
		t.Fatal(err)
	}
	if m.LM.MaxPromptTokens != DefaultMaxPromptTokens || m.LM.Sampling != nil {
		t.Errorf("defaults: max_prompt_tokens %d, sampling %v", m.LM.MaxPromptTokens, m.LM.Sampling)
	}
}

// voice_encoder's keys are checked at load, each error naming its key (and the file).
func TestManifestVoiceEncoderErrors(t *testing.T) {
	path := writeManifest(t, t.TempDir(), func(s string) string {
		return s + "\nvoice_encoder:\n  speech_tokenizer: missing_tokenizer.onnx\n  speaker: \"\"\n  prompt_text: \"\"\n  min_seconds: 3\n  max_seconds: 40\n"
	})
	_, err := LoadManifest(path)
	if err == nil {
		t.Fatal("a bad voice_encoder loaded")
	}
	for _, want := range []string{path, "voice_encoder.speech_tokenizer: stat", "missing_tokenizer.onnx", "voice_encoder.speaker: is required",
		"voice_encoder.prompt_text: is required", "voice_encoder.max_seconds: 40 must be in [min_seconds, 30]",
		"voice_encoder: needs flow.embedding_dim > 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
