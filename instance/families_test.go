package instance_test

import (
	"context"
	"os"
	"testing"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Behind the instance's service, with every family and the staged one (which claims any path)
// last, the tiny VoxCPM export is served by its own family: it loads, speaks and reports its
// stages.
func TestServiceServesTinyVoxCPM(t *testing.T) {
	path := "../models/tiny-voxcpm/pipeline.yaml"
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("VOXMUX_REQUIRE_TINY_VOXCPM") == "1" {
			t.Fatalf("the tiny VoxCPM export is required (make tiny-voxcpm): %v", err)
		}
		t.Skipf("no tiny VoxCPM export (make tiny-voxcpm): %v", err)
	}
	lib, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	fams := families()
	d, err := fams.Describe(path)
	if err != nil || d.Kind != "voxcpm" {
		t.Fatalf("describe: %+v, %v", d, err)
	}
	s := instance.NewService(fams, func(string) string { return "" })
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Load(ctx, tts.LoadConfig{Manifest: path, Provider: "cpu", ORTLibrary: lib, MaxInflight: 2}); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.Synthesize(ctx, tts.Request{Text: "Through the service.", Seed: 1}, func(tts.Chunk) error { n++; return nil }); err != nil || n == 0 {
		t.Fatalf("synthesize: %v, %d chunks", err, n)
	}
	h, err := s.Health(ctx)
	if err != nil || !h.Ready || len(h.Stages) != 3 || h.Stages[1].Stage != "step" || h.Stages[1].Batches == 0 {
		t.Fatalf("health %+v, %v", h, err)
	}
}
