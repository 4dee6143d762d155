package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

type spec struct {
	Kind string `yaml:"kind"`
	Name string `yaml:"name"`
}

// A manifest decodes into the family's struct; an unknown or repeated key is refused, naming the
// file, the key and its line; a missing file names the manifest.
func TestRead(t *testing.T) {
	var s spec
	if err := Read(write(t, "ok.yaml", "kind: x\nname: y\n"), "test manifest", &s); err != nil || s != (spec{"x", "y"}) {
		t.Fatalf("Read: %+v, %v", s, err)
	}
	for _, c := range []struct{ text, want string }{
		{"kind: x\nnmae: y\n", "nmae"},
		{"kind: x\nkind: y\n", "kind"},
	} {
		p := write(t, "bad.yaml", c.text)
		err := Read(p, "test manifest", &spec{})
		if err == nil || !strings.Contains(err.Error(), "test manifest "+p) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "[2:") {
			t.Errorf("%q: %v, want an error naming the file, %s and line 2", c.text, err, c.want)
		}
	}
	if err := Read(filepath.Join(t.TempDir(), "none.yaml"), "test manifest", &spec{}); err == nil || !strings.HasPrefix(err.Error(), "test manifest: ") {
		t.Errorf("missing file: %v", err)
	}
}

// Kind reads a manifest's kind alone; anything else has none.
func TestKind(t *testing.T) {
	for _, c := range []struct {
		path, want string
	}{
		{write(t, "a.yaml", "kind: voxcpm\nname: whatever\nextra: [1, 2]\n"), "voxcpm"},
		{write(t, "b.yaml", "name: no kind\n"), ""},
		{write(t, "c.onnx", "kind: piper\x00\x01"), ""},
		{write(t, "d.yaml", "kind: [unclosed\n"), ""},
		{t.TempDir(), ""},
		{filepath.Join(t.TempDir(), "none.yaml"), ""},
	} {
		if got := Kind(c.path); got != c.want {
			t.Errorf("Kind(%s) = %q, want %q", c.path, got, c.want)
		}
	}
}
