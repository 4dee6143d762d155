package voxcpm

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/engine/enginetest"
	"github.com/voxmux/voxmux/tts"
)

// The runner counts cancelled requests and its stages' runs, as the family opens it (one engine)
// and as replicas over two engines (a group on two GPUs; on the CPU both are device 0's), which
// report as one.
func TestRunnerReports(t *testing.T) {
	req := tts.Request{Text: "Hello world, this is a test of a longer request.", Seed: 1}
	path := longTiny(t)
	t.Run("one", func(t *testing.T) {
		enginetest.CheckCancelReport(t, tinyEngineAt(t, path, 4, Options{}), req, 2)
	})
	t.Run("replicas", func(t *testing.T) {
		r, err := engine.OpenReplicas(2, func(int) (*Engine, error) { return tinyEngineAt(t, path, 4, Options{}), nil })
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.(*engine.Replicas[*Engine]); !ok {
			t.Fatalf("two devices opened %T, want replicas", r)
		}
		enginetest.CheckCancelReport(t, r, req, 2)
	})
}

// longTiny is the tiny export with generation.min_len 40: the random weights may draw the stop
// token after min_len's 2 patches, and a request must still be running when its first chunk
// cancels it (on a loaded machine the engine could otherwise finish it first, and a request whose
// audio is complete is not a cancel the engine pays for).
func longTiny(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs(tinyPath())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); err != nil {
		tinyEngine(t, 1) // skips, or fails where the export is required
	}
	dir := t.TempDir()
	entries, err := os.ReadDir(filepath.Dir(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != filepath.Base(src) {
			if err := os.Symlink(filepath.Join(filepath.Dir(src), e.Name()), filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	b = regexp.MustCompile(`(?m)^  min_len: \d+$`).ReplaceAll(b, []byte("  min_len: 40"))
	dst := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}
