package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type elevenSDKResults struct {
	Files []struct {
		Mode   string `json:"mode"`
		Format string `json:"format"`
		File   string `json:"file"`
		Bytes  int    `json:"bytes"`
	} `json:"files"`
	Alignments []struct {
		Mode       string    `json:"mode"`
		Chunks     int       `json:"chunks"`
		Characters []string  `json:"characters"`
		Starts     []float64 `json:"characterStartTimesSeconds"`
		Ends       []float64 `json:"characterEndTimesSeconds"`
	} `json:"alignments"`
	Voices []struct {
		VoiceID  string `json:"voiceId"`
		Category string `json:"category"`
	} `json:"voices"`
	Models []string `json:"models"`
	Errors map[string]struct {
		Status int `json:"status"`
		Body   struct {
			Detail struct {
				Status string `json:"status"`
			} `json:"detail"`
		} `json:"body"`
	} `json:"errors"`
}

// The official ElevenLabs JavaScript SDK (scripts/elevenlabs-sdk-test, pinned in its
// package-lock.json) against the real server, unchanged but for its base URL: convert, stream and
// both with-timestamps calls decode with ffmpeg to the same speech (±10%), the alignments spell
// the text with times that never go back, voices and models list, and errors carry their status.
func TestElevenLabsNodeSDK(t *testing.T) {
	needCommand(t, "node", "npm", "ffmpeg", "ffprobe")
	dir, ctx := npmCI(t, "elevenlabs-sdk-test")
	const key = "sk-eleven-sdk-7"
	s := serveWithKey(t, "VOXMUX_EL_SDK_KEYS", key)

	out := t.TempDir()
	node := exec.CommandContext(ctx, "node", filepath.Join(dir, "sdk-test.mjs"), s.url, out)
	node.Env = append(os.Environ(), "ELEVENLABS_API_KEY="+key)
	if b, err := node.CombinedOutput(); err != nil {
		t.Fatalf("sdk-test.mjs: %v\n%s", err, b)
	}
	var res elevenSDKResults
	if b, err := os.ReadFile(filepath.Join(out, "results.json")); err != nil || json.Unmarshal(b, &res) != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(res.Files) != 7 {
		t.Fatalf("%d files, want 7", len(res.Files))
	}
	const text = "The quick brown fox jumps over the lazy dog."
	var want float64
	for _, f := range res.Files {
		if f.Mode == "convert" && f.Format == "pcm_24000" {
			want = float64(f.Bytes) / 2 / 24000
		}
	}
	if n := float64(len(text)); want < n*2/25 || want > n*4/25 {
		t.Fatalf("pcm_24000: %.2f s for %d characters", want, len(text))
	}
	in := map[string][]string{
		"pcm_24000": {"-f", "s16le", "-ar", "24000", "-ac", "1"},
		"pcm_16000": {"-f", "s16le", "-ar", "16000", "-ac", "1"},
		"ulaw_8000": {"-f", "mulaw", "-ar", "8000", "-ac", "1"},
	}
	for _, f := range res.Files {
		args := append(append([]string{"-v", "error"}, in[f.Format]...), "-i", f.File, "-f", "s16le", "-ar", "24000", "-ac", "1", "pipe:1")
		dec, err := exec.Command("ffmpeg", args...).Output()
		if err != nil {
			t.Errorf("%s %s: ffmpeg cannot decode it: %v", f.Mode, f.Format, err)
			continue
		}
		w := want
		if f.Mode == "stream" {
			w = want / 1.1 // voice_settings.speed 1.1
		}
		got := float64(len(dec)) / 2 / 24000
		if got < 0.9*w || got > 1.1*w+0.06 {
			t.Errorf("%s %s: decodes to %.3f s, want %.3f s", f.Mode, f.Format, got, w)
		}
		t.Logf("%-22s %-14s %6d bytes, %.3f s", f.Mode, f.Format, f.Bytes, got)
	}
	if len(res.Alignments) != 2 {
		t.Fatalf("%d alignments, want 2", len(res.Alignments))
	}
	for _, a := range res.Alignments {
		if strings.Join(a.Characters, "") != text || len(a.Starts) != len(a.Characters) || len(a.Ends) != len(a.Characters) {
			t.Errorf("%s: alignment spells %q with %d starts and %d ends", a.Mode, strings.Join(a.Characters, ""), len(a.Starts), len(a.Ends))
			continue
		}
		for i := range a.Starts {
			if a.Ends[i] < a.Starts[i] || i > 0 && a.Starts[i] < a.Starts[i-1] || a.Ends[i] > want+0.01 {
				t.Errorf("%s: character %d at %.3f..%.3f s of %.3f s", a.Mode, i, a.Starts[i], a.Ends[i], want)
				break
			}
		}
		if a.Mode == "stream-with-timestamps" && a.Chunks < 2 {
			t.Errorf("stream-with-timestamps came in %d chunk(s): not streamed", a.Chunks)
		}
	}
	if len(res.Voices) == 0 || res.Voices[0].VoiceID != "default" || res.Voices[0].Category != "premade" {
		t.Errorf("voices.getAll: %+v", res.Voices)
	}
	if !slices.Contains(res.Models, "tiny") || !slices.Contains(res.Models, "eleven_multilingual_v2") {
		t.Errorf("models.list: %v", res.Models)
	}
	for name, w := range map[string]struct {
		status int
		code   string
	}{"unknown_voice": {400, "voice_not_found"}, "bad_format": {400, "invalid_output_format"}, "wrong_key": {401, ""}} {
		e := res.Errors[name]
		if e.Status != w.status || w.code != "" && e.Body.Detail.Status != w.code {
			t.Errorf("%s: status %d, detail.status %q; want %d %q", name, e.Status, e.Body.Detail.Status, w.status, w.code)
		}
	}
}
