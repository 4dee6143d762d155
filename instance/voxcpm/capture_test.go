package voxcpm

import (
	"math"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// The capture checks on the CPU, where the bound runs are not captured: a bound run and an
// uncaptured one of the same inputs agree, for the step and the VAE decoder, and a run whose
// inputs differ from the other's is reported.
func TestCaptureCheck(t *testing.T) {
	m, rt := tinyRuntime(t)
	g, err := openGraphs(m, rt, 4, graphModes{step: StepGraphFixed})
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	for _, b := range g.sg.buckets {
		if err := g.checkStepCapture(b); err != nil {
			t.Errorf("step, %d rows: %v", b.B, err)
		}
	}
	for _, b := range g.v.buckets {
		if err := g.v.checkCapture(b); err != nil {
			t.Errorf("vae_decoder, %d rows: %v", b.B, err)
		}
	}
	b := g.v.buckets[0]
	calls := 0
	set := func() error {
		calls++
		return iobind.Upload(b.latent, randomFloats(b.B*m.patchFloats(), 1, uint64(calls)))
	}
	err = checkCapture("vae_decoder, changing inputs", g.v.thread, g.v.s, b.run[0], set, compared{"audio", b.audio})
	if err == nil || !strings.Contains(err.Error(), "differs from an uncaptured run (relative rms: audio ") {
		t.Fatalf("runs of different inputs: %v", err)
	}
}

// nonFinite counts NaN and infinities, which the capture check reports per side.
func TestNonFinite(t *testing.T) {
	x := []float32{1, float32(math.NaN()), float32(math.Inf(1)), -2, float32(math.Inf(-1))}
	if n := nonFinite(x); n != 3 {
		t.Fatalf("nonFinite = %d, want 3", n)
	}
}
