package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// `voxmux serve` on models/tiny-cosyvoice3: CosyVoice3's published format with random weights,
// exported by scripts/cosyvoice3/export.py with a random voice bench (`make tiny-cosyvoice3`;
// `make test` makes it first and sets VOXMUX_REQUIRE_TINY_COSYVOICE3, so that its absence fails).
func TestEndToEndTinyCosyVoice3(t *testing.T) {
	model := tinyCosyVoice3(t)
	listen := freePort(t)
	cfg := filepath.Join(t.TempDir(), "voxmux.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("listen: %s\nmodel: %s\nprovider: cpu\nonnxruntime: %s\ngroups:\n  - name: cpu\n    gpus: []\n    instances: 1\n",
		listen, model, ortLib(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, cfg, listen)

	if model, ids := listVoices(t, s.url); model != "cosyvoice3" || !slices.Equal(ids, []string{"default", "bench"}) {
		t.Fatalf("voices: model %q, %v; want cosyvoice3 with default and bench", model, ids)
	}

	wav := func(voice string) []byte {
		t.Helper()
		code, h, body := speech(t, s.url, `{"model":"cosyvoice3","voice":"`+voice+`","input":"Hello world. This is voxmux.","response_format":"wav","seed":1}`)
		if code != 200 || h.Get("Content-Type") != "audio/wav" || len(body) < 44 || string(body[:4]) != "RIFF" || string(body[36:40]) != "data" {
			t.Fatalf("%s: status %d, %q, %d bytes: %.200q", voice, code, h.Get("Content-Type"), len(body), body)
		}
		channels, rate, bits := binary.LittleEndian.Uint16(body[22:]), binary.LittleEndian.Uint32(body[24:]), binary.LittleEndian.Uint16(body[34:])
		if channels != 1 || rate != 24000 || bits != 16 {
			t.Fatalf("%s: %d channels at %d Hz, %d bits; want CosyVoice3's mono 24 kHz as 16-bit", voice, channels, rate, bits)
		}
		// The engine's audio is whole vocoder hops of 480 samples.
		pcm := body[44:]
		if n := len(pcm) / 2; n == 0 || n%480 != 0 {
			t.Fatalf("%s: %d samples, not a whole number of hops", voice, n)
		}
		nonzero := 0
		for i := 0; i+1 < len(pcm); i += 2 {
			if pcm[i] != 0 || pcm[i+1] != 0 {
				nonzero++
			}
		}
		if nonzero < len(pcm)/4 {
			t.Fatalf("%s: audio is mostly silence: %d of %d samples non-zero", voice, nonzero, len(pcm)/2)
		}
		return pcm
	}
	// The voice reaches the instance: bench's prompt changes the audio.
	if bytes.Equal(wav("bench"), wav("default")) {
		t.Error("voices bench and default gave the same audio")
	}
}
