package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/router/audio"
)

// tinyVoxCPM is models/tiny-voxcpm's manifest: VoxCPM 1.5's published format with random
// weights, exported by scripts/voxcpm/export.py in float32 with a random voice bench (`make
// tiny-voxcpm`; `make test` makes it first and sets VOXMUX_REQUIRE_TINY_VOXCPM=1, so that its
// absence fails).
func tinyVoxCPM(t *testing.T) string {
	t.Helper()
	return tinyExport(t, "tiny-voxcpm", "VOXMUX_REQUIRE_TINY_VOXCPM")
}

// VoxCPM's audio is whole patches: patch_size (4) latent frames of chunk_size (1764) samples.
const voxcpmPatchSamples = 4 * 1764

// `voxmux serve` on models/tiny-voxcpm on the CPU: its voices; WAV at 44.1 kHz in whole patches,
// streamed (chunked) and whole with the same samples; equal seeds give equal audio, other seeds
// and voices other audio; instructions are dropped; pcm, mp3 and speed through FFmpeg where the
// build has it; input over the model's cache is a 400 that says so.
func TestEndToEndTinyVoxCPM(t *testing.T) {
	model := tinyVoxCPM(t)
	listen := freePort(t)
	cfg := filepath.Join(t.TempDir(), "voxmux.yaml")
	// max_input_chars above the model's 4096 cache positions, so the model's own limit answers.
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("listen: %s\nmodel: %s\nprovider: cpu\nonnxruntime: %s\nmax_input_chars: 30000\ngroups:\n  - name: cpu\n    gpus: []\n    instances: 1\n",
		listen, model, ortLib(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, cfg, listen)

	if model, ids := listVoices(t, s.url); model != "voxcpm1.5" || !slices.Equal(ids, []string{"default", "bench"}) {
		t.Fatalf("voices: model %q, %v; want voxcpm1.5 with default and bench", model, ids)
	}

	const text = `"model":"voxcpm1.5","input":"Hello world. This is voxmux."`
	// wav asks for fields (JSON members after model and input) as WAV and returns its samples.
	wav := func(fields string) []byte {
		t.Helper()
		resp, body := speechReq(t, s.url, "", `{`+text+`,"response_format":"wav",`+fields+`}`)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/wav" {
			t.Fatalf("%s: status %d, %q: %.300s", fields, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		pcm := wavPCM(t, fields, body, 44100)
		if n := len(pcm) / 2; n == 0 || n%voxcpmPatchSamples != 0 {
			t.Fatalf("%s: %d samples, not a whole number of patches of %d", fields, n, voxcpmPatchSamples)
		}
		nonzero := 0
		for i := 0; i+1 < len(pcm); i += 2 {
			if pcm[i] != 0 || pcm[i+1] != 0 {
				nonzero++
			}
		}
		if nonzero < len(pcm)/4 {
			t.Fatalf("%s: audio is mostly silence: %d of %d samples non-zero", fields, nonzero, len(pcm)/2)
		}
		return pcm
	}

	// Streamed (the default): chunked, no length, the WAV header's sizes "unknown".
	resp, body := speechReq(t, s.url, "", `{`+text+`,"response_format":"wav","voice":"default","seed":1}`)
	if resp.StatusCode != 200 || resp.ContentLength != -1 || !slices.Equal(resp.TransferEncoding, []string{"chunked"}) ||
		len(body) < 44 || binary.LittleEndian.Uint32(body[40:44]) != audio.StreamingSize {
		t.Fatalf("streamed: status %d, Content-Length %d, transfer encoding %v, %d bytes", resp.StatusCode, resp.ContentLength, resp.TransferEncoding, len(body))
	}
	streamed := wavPCM(t, "streamed", body, 44100)
	// Whole: the same seed, the same samples.
	def := wav(`"voice":"default","seed":1,"stream":false`)
	if !bytes.Equal(def, streamed) {
		t.Fatalf("seed 1 streamed (%d bytes) and whole (%d bytes) differ", len(streamed), len(def))
	}
	if bytes.Equal(def, wav(`"voice":"default","seed":2`)) {
		t.Error("seeds 1 and 2 gave the same audio")
	}
	if bytes.Equal(def, wav(`"voice":"bench","seed":1`)) {
		t.Error("voices bench and default gave the same audio")
	}
	// VoxCPM 1.5 takes no instructions: the router drops them, the audio is the same.
	if !bytes.Equal(def, wav(`"voice":"default","seed":1,"instructions":"Whisper, slowly."`)) {
		t.Error("instructions changed the audio of a model that takes none")
	}

	// Input whose prompt fills the model's cache (lm.max_positions, 4096): a 400 that says so.
	long := strings.Repeat("word ", 4096)
	resp, body = speechReq(t, s.url, "", `{"input":"`+long+`","response_format":"wav"}`)
	var e struct {
		Error struct{ Message, Param string }
	}
	if resp.StatusCode != 400 || json.Unmarshal(body, &e) != nil || e.Error.Param != "input" ||
		!strings.Contains(e.Error.Message, "input is too long") || !strings.Contains(e.Error.Message, "lm.max_positions") {
		t.Fatalf("over-long input: %d %.300s; want a 400 on input naming lm.max_positions", resp.StatusCode, body)
	}

	if !withFFmpeg {
		t.Log("built without FFmpeg (-tags noffmpeg): pcm, mp3 and speed not checked")
		return
	}
	// pcm: 16-bit at 24 kHz, resampled from the model's 44.1 kHz.
	resp, pcm := speechReq(t, s.url, "", `{`+text+`,"response_format":"pcm","voice":"default","seed":1}`)
	want := float64(len(def)/2) * 24000 / 44100
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/pcm" || len(pcm)%2 != 0 || math.Abs(float64(len(pcm)/2)-want) > 0.01*want {
		t.Fatalf("pcm: status %d, %q, %d samples; want about %.0f at 24 kHz", resp.StatusCode, resp.Header.Get("Content-Type"), len(pcm)/2, want)
	}
	// mp3: MPEG audio frames.
	resp, mp3 := speechReq(t, s.url, "", `{`+text+`,"response_format":"mp3","voice":"default","seed":1}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/mpeg" || len(mp3) < 4 || mp3[0] != 0xFF || mp3[1]&0xE0 != 0xE0 {
		t.Fatalf("mp3: status %d, %q, %d bytes: %.16x", resp.StatusCode, resp.Header.Get("Content-Type"), len(mp3), mp3)
	}
	secs := float64(len(def)/2) / 44100
	if _, err := exec.LookPath("ffmpeg"); err == nil {
		f := filepath.Join(t.TempDir(), "speech.mp3")
		if err := os.WriteFile(f, mp3, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := decodedSeconds(t, f, "mp3"); math.Abs(got-secs) > 0.1 {
			t.Errorf("mp3 decodes to %.3f s; the wav is %.3f s", got, secs)
		}
	}
	// speed 2: the router halves the audio's length (pitch kept).
	resp, body = speechReq(t, s.url, "", `{`+text+`,"response_format":"wav","voice":"default","seed":1,"speed":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("speed 2: status %d: %.300s", resp.StatusCode, body)
	}
	if fast := wavPCM(t, "speed 2", body, 44100); math.Abs(float64(len(fast))/float64(len(def))-0.5) > 0.02 {
		t.Errorf("speed 2: %d samples against %d at speed 1; want half", len(fast)/2, len(def)/2)
	}
}

// `voxmux serve` on models/tiny-voxcpm with a voice library (walkVoiceLibrary). The clip is at
// the model's rate over a noise floor, so none of it is trimmed as silence: 5 s left-padded to
// 32 whole patches, 128 latent frames.
func TestEndToEndTinyVoxCPMLibrary(t *testing.T) {
	walkVoiceLibrary(t, libraryModel{manifest: tinyVoxCPM(t), name: "voxcpm1.5", voices: []string{"default", "bench"}, rate: 44100,
		clip: voicedWAV(44100, 5, 500), clipRate: 44100, short: voicedWAV(44100, 2, 500),
		prompt: func(v clonedVoice) bool { return v.Tokens == 0 && v.LatentFrames == 128 }})
}
