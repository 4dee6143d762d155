package voxcpm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts/promptfile"
)

// onnxIO writes an ONNX model with the given inputs and outputs (name → element type, rank 2)
// and no nodes: enough for ort.ReadGraphIO.
func onnxIO(t *testing.T, path string, ins, outs map[string]int32) {
	t.Helper()
	value := func(name string, elem int32) []byte {
		var dims []byte
		for range 2 {
			dims = protowire.AppendTag(dims, 1, protowire.BytesType)
			dims = protowire.AppendBytes(dims, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1))
		}
		var tensor []byte
		tensor = protowire.AppendTag(tensor, 1, protowire.VarintType)
		tensor = protowire.AppendVarint(tensor, uint64(elem))
		tensor = protowire.AppendTag(tensor, 2, protowire.BytesType)
		tensor = protowire.AppendBytes(tensor, dims)
		typ := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), tensor)
		var v []byte
		v = protowire.AppendTag(v, 1, protowire.BytesType)
		v = protowire.AppendString(v, name)
		v = protowire.AppendTag(v, 2, protowire.BytesType)
		return protowire.AppendBytes(v, typ)
	}
	var graph []byte
	for _, name := range sortedKeys(ins) {
		graph = protowire.AppendBytes(protowire.AppendTag(graph, 11, protowire.BytesType), value(name, ins[name]))
	}
	for _, name := range sortedKeys(outs) {
		graph = protowire.AppendBytes(protowire.AppendTag(graph, 12, protowire.BytesType), value(name, outs[name]))
	}
	model := protowire.AppendBytes(protowire.AppendTag(nil, 7, protowire.BytesType), graph)
	if err := os.WriteFile(path, model, 0o644); err != nil {
		t.Fatal(err)
	}
}

const testManifest = `kind: voxcpm
name: test
sample_rate: 44100
dtype: float16
patch_size: 2
feat_dim: 3
chunk_size: 5
dit_hidden: 4
tokenizer:
  file: tokenizer.json
  audio_start: 101
  split_chinese: true
lm:
  layers: 2
  residual_layers: 1
  kv_heads: 1
  head_dim: 2
  max_positions: 64
generation:
  timesteps: 3
  cfg_value: 2.0
  min_len: 2
  max_len: 50
  len_ratio: 6.0
graphs:
  prefill: prefill.onnx
  step: step.onnx
  vae_decoder: vae_decoder.onnx
  vae_encoder: vae_encoder.onnx
vae:
  state_size: 3
  context_patches: 2
voices: voices
`

// writeExport writes an export's files (graphs with the contract's inputs and outputs, no nodes)
// into a folder of its own; edit changes the manifest's text and graphs each graph's contract
// before they are written. It returns the manifest's path.
func writeExport(t *testing.T, edit func(string) string, graphs func(key string, g *graphIO)) string {
	t.Helper()
	dir := t.TempDir()
	text := edit(testManifest)
	path := filepath.Join(dir, "pipeline.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Dir: dir, DType: "float16", LM: LMSpec{Layers: 2, ResidualLayers: 1},
		Graphs: GraphsSpec{Prefill: "prefill.onnx", Step: "step.onnx", VAEDecoder: "vae_decoder.onnx", VAEEncoder: "vae_encoder.onnx"}}
	for _, g := range m.contract() {
		if graphs != nil {
			graphs(g.key, &g)
		}
		onnxIO(t, m.Path(g.file), g.in, g.out)
	}
	vdir := filepath.Join(dir, "voices", "amy")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeVoice(t, vdir, "text: Said in the clip.\nlatents: latents.f32\nlatent_dim: 3\n", 3*6)
	return path
}

func writeVoice(t *testing.T, dir, yaml string, floats int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, promptfile.YAMLName), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, promptfile.LatentsName), promptfile.EncodeFloats(make([]float32, floats)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func same(s string) string { return s }

func TestManifestLoads(t *testing.T) {
	path := writeExport(t, same, nil)
	if !(Family{}).Claims(path) {
		t.Fatal("the family does not claim a voxcpm manifest")
	}
	d, err := Family{}.Describe(path)
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind != "voxcpm" || d.Name != "test" || d.SampleRate != 44100 || !d.Cloning || strings.Join(d.Voices, ",") != "default,amy" {
		t.Fatalf("description %+v", d)
	}
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	if v := m.voice("amy"); v == nil || v.patches != 3 || v.text != "Said in the clip." {
		t.Fatalf("voice amy: %+v", v)
	}
	if m.voice("default") != nil || m.voice("alloy") != nil {
		t.Fatal("default and unknown names must have no prompt")
	}
	// Without vae_encoder the model clones no voices.
	path = writeExport(t, func(s string) string { return strings.Replace(s, "  vae_encoder: vae_encoder.onnx\n", "", 1) }, nil)
	if d, err := (Family{}).Describe(path); err != nil || d.Cloning {
		t.Fatalf("without vae_encoder: %+v, %v", d, err)
	}
}

func TestClaims(t *testing.T) {
	dir := t.TempDir()
	staged := filepath.Join(dir, "staged.yaml")
	os.WriteFile(staged, []byte("kind: staged\nname: x\n"), 0o644)
	none := filepath.Join(dir, "none.yaml")
	os.WriteFile(none, []byte("name: x\n"), 0o644)
	onnx := filepath.Join(dir, "voice.onnx")
	os.WriteFile(onnx, []byte("kind: voxcpm\n"), 0o644)
	for _, p := range []string{staged, none, onnx, filepath.Join(dir, "missing.yaml"), dir} {
		if (Family{}).Claims(p) {
			t.Errorf("claims %s", p)
		}
	}
}

func TestManifestErrors(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(string) string
		graphs func(string, *graphIO)
		want   []string
	}{
		{"unknown key", func(s string) string {
			return strings.Replace(s, "  cfg_value: 2.0\n", "  cfg_value: 2.0\n  top_p: 0.9\n", 1)
		}, nil,
			[]string{"pipeline.yaml", "top_p"}},
		{"missing graph", func(s string) string { return strings.Replace(s, "step: step.onnx", "step: nothere.onnx", 1) }, nil,
			[]string{"graphs.step", "nothere.onnx"}},
		{"no graph key", func(s string) string { return strings.Replace(s, "  vae_decoder: vae_decoder.onnx\n", "", 1) }, nil,
			[]string{"graphs.vae_decoder: is required"}},
		{"wrong input name", same, func(key string, g *graphIO) {
			if key == "graphs.step" {
				delete(g.in, "noise")
				g.in["z"] = ort.ONNXFloat
			}
		}, []string{`graphs.step`, `no input "noise"`, `input "z", which the contract does not name`}},
		{"missing output", same, func(key string, g *graphIO) {
			if key == "graphs.prefill" {
				delete(g.out, "res_present_value.0")
			}
		}, []string{`graphs.prefill`, `no output "res_present_value.0"`}},
		{"cache dtype", func(s string) string { return strings.Replace(s, "dtype: float16", "dtype: float32", 1) }, nil,
			[]string{`"past_key.0" is float16, want float32`}},
		{"bad values", func(s string) string {
			s = strings.Replace(s, "patch_size: 2", "patch_size: 0", 1)
			s = strings.Replace(s, "kind: voxcpm", "kind: voxcpm\n", 1)
			return strings.Replace(s, "  audio_start: 101\n", "", 1)
		}, nil, []string{"patch_size: must be positive", "tokenizer.audio_start: is required"}},
		{"wrong kind", func(s string) string { return strings.Replace(s, "kind: voxcpm", "kind: staged", 1) }, nil,
			[]string{`kind: "staged" is not supported`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeExport(t, c.edit, c.graphs)
			_, err := LoadManifest(path)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestVoiceErrors(t *testing.T) {
	cases := []struct {
		yaml   string
		floats int
		want   string
	}{
		{"text: x\nlatents: latents.f32\nlatent_dim: 3\n", 15, "not a positive whole number of patches"},
		{"text: x\nlatents: latents.f32\nlatent_dim: 8\n", 16, "latent_dim: is 8, the model's feat_dim is 3"},
		{"text: x\nmel: mel.f32\n", 18, "mel"},
		{"latents: latents.f32\nlatent_dim: 3\n", 18, "text is empty"},
		{"text: x\nlatents: ../x.f32\nlatent_dim: 3\n", 18, "not a file of the voice's folder"},
	}
	for _, c := range cases {
		path := writeExport(t, same, nil)
		writeVoice(t, filepath.Join(filepath.Dir(path), "voices", "amy"), c.yaml, c.floats)
		_, err := LoadManifest(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "voice amy") {
			t.Errorf("voice.yaml %q: %v, want an error saying %q", c.yaml, err, c.want)
		}
	}
	// A voice library's folder (latents, latent_dim and where it came from) reads too.
	path := writeExport(t, same, nil)
	writeVoice(t, filepath.Join(filepath.Dir(path), "voices", "amy"),
		"text: x\nlatents: latents.f32\nlatent_dim: 3\ntranscript: x\nconsent: yes\nsource:\n  sample_rate: 48000\n  seconds: 4.5\n", 12)
	m, err := LoadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	if v := m.voice("amy"); v.patches != 2 {
		t.Fatalf("library voice: %d patches, want 2", v.patches)
	}
}
