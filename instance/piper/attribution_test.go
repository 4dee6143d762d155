package piper

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The jenny voice's description carries the credit its dataset's licence asks for, found from
// its .onnx.json's dataset; a voice whose dataset asks none (the tiny voices) carries none, and a
// folder of both carries jenny's once.
func TestPiperAttribution(t *testing.T) {
	jenny := reference(t).voice
	d, err := (Family{}).Describe(jenny)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.Attribution, "Jenny (Dioco)") {
		t.Errorf("jenny's attribution %q does not call the voice \"Jenny (Dioco)\"", d.Attribution)
	}
	if d, err := (Family{}).Describe(tinyPiperEN); err != nil || d.Attribution != "" {
		t.Errorf("tiny voice: attribution %q, %v; want none", d.Attribution, err)
	}
	dir := t.TempDir()
	for stem, src := range map[string]string{"a": jenny, "b": jenny, "c": tinyPiperEN} {
		for _, ext := range []string{".onnx", ".onnx.json"} {
			abs, _ := filepath.Abs(src + strings.TrimPrefix(ext, ".onnx"))
			if err := os.Symlink(abs, filepath.Join(dir, stem+ext)); err != nil {
				t.Fatal(err)
			}
		}
	}
	both, err := (Family{}).Describe(dir)
	if err != nil {
		t.Fatal(err)
	}
	if both.Attribution != d.Attribution {
		t.Errorf("folder %s: attribution %q, want jenny's once: %q", filepath.Base(dir), both.Attribution, d.Attribution)
	}
}
