package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// A published voice (jenny, from its Go module) through the whole path: `voxmux voices fetch`,
// `voxmux serve` (router → instance → WAV encoder), transcribed by Debian's pocketsphinx
// (pocketsphinx + pocketsphinx-en-us). The same bound must reject the tiny random voice's output.

// asrSentences are fixed, everyday sentences: pocketsphinx's general English model recognizes them
// from a real voice with few errors.
var asrSentences = []string{
	"The weather is nice today, so we will walk to the park.",
	"Please call me back when you get home tonight.",
	"I would like a cup of coffee and a glass of water.",
	"The children are playing in the garden after school.",
}

// maxWER is the word error rate real speech must stay within: jenny measured 0.07 to 0.19 here
// (the voice samples noise, so runs differ); the tiny voice's tones give 1.0 (nothing heard).
const maxWER = 0.5

// fetchJenny unpacks the jenny voice module (from the Go module cache) with `voxmux voices fetch`.
func fetchJenny(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command(voxmuxBinary(t), "voices", "fetch", "--dir", dir, "jenny").CombinedOutput()
	if err != nil {
		t.Fatalf("voxmux voices fetch jenny: %v\n%s", err, out)
	}
	return filepath.Join(dir, "en_GB-jenny_dioco-medium.onnx")
}

// transcribe asks the server for each sentence as WAV and returns pocketsphinx's transcripts.
func transcribe(t *testing.T, url, voice string) []string {
	t.Helper()
	hyps, _ := transcribeAt(t, url, voice, 1)
	return hyps
}

// transcribeAt is transcribe at a speed; seconds is the audio's length, all sentences together.
func transcribeAt(t *testing.T, url, voice string, speed float64) (hyps []string, seconds float64) {
	t.Helper()
	dir := t.TempDir()
	for i, s := range asrSentences {
		body, _ := json.Marshal(map[string]any{"input": s, "voice": voice, "response_format": "wav", "speed": speed})
		code, _, wav := speech(t, url, string(body))
		if code != http.StatusOK || len(wav) < 44 {
			t.Fatalf("%q: status %d: %.200s", s, code, wav)
		}
		seconds += float64(len(wav)-44) / 2 / float64(binary.LittleEndian.Uint32(wav[24:28])) // 16-bit mono
		in := filepath.Join(dir, fmt.Sprintf("%d.wav", i))
		os.WriteFile(in, wav, 0o644)
		hyps = append(hyps, pocketsphinx(t, in))
	}
	return hyps, seconds
}

// pocketsphinx transcribes a WAV file.
func pocketsphinx(t *testing.T, in string) string {
	t.Helper()
	if _, err := exec.LookPath("pocketsphinx_continuous"); err != nil {
		t.Fatal("pocketsphinx_continuous is not installed (Debian: pocketsphinx pocketsphinx-en-us; make deps)")
	}
	// pocketsphinx's acoustic model wants 16 kHz mono.
	out := filepath.Join(t.TempDir(), "16k.wav")
	if b, err := exec.Command("ffmpeg", "-loglevel", "error", "-y", "-i", in, "-ar", "16000", "-ac", "1", out).CombinedOutput(); err != nil {
		t.Fatalf("ffmpeg: %v\n%s", err, b)
	}
	hyp, err := exec.Command("pocketsphinx_continuous", "-infile", out, "-logfn", os.DevNull).Output()
	if err != nil {
		t.Fatalf("pocketsphinx: %v", err)
	}
	return strings.TrimSpace(string(hyp))
}

// TestPiperWAVsWER reports (VOXMUX_WER_WAVS=DIR; a report, not a check) the word error rate of
// WAV files made elsewhere, as instance/piper's TestPiperFloat16OnGPU writes them:
// VOICE-I.VARIANT.wav, the text it speaks in VOICE-I.txt. It logs one line per voice and variant,
//
//	WER VOICE VARIANT: W over N sentences; heard [...]
//
// scripts/piper-fp16-wer.sh runs it.
func TestPiperWAVsWER(t *testing.T) {
	dir := os.Getenv("VOXMUX_WER_WAVS")
	if dir == "" {
		t.Skip("a measurement: VOXMUX_WER_WAVS=DIR runs it on DIR's WAV files")
	}
	wavs, err := filepath.Glob(filepath.Join(dir, "*.wav"))
	if err != nil || len(wavs) == 0 {
		t.Fatalf("no WAV files in %s (%v)", dir, err)
	}
	slices.Sort(wavs)
	type key struct{ voice, variant string }
	refs, hyps := map[key][]string{}, map[key][]string{}
	var keys []key
	for _, w := range wavs {
		stem, variant, ok := strings.Cut(strings.TrimSuffix(filepath.Base(w), ".wav"), ".")
		i := strings.LastIndex(stem, "-")
		if !ok || i < 0 {
			t.Fatalf("%s: not named VOICE-I.VARIANT.wav", w)
		}
		ref, err := os.ReadFile(filepath.Join(dir, stem+".txt"))
		if err != nil {
			t.Fatalf("%s: its text: %v", w, err)
		}
		k := key{stem[:i], variant}
		if _, seen := refs[k]; !seen {
			keys = append(keys, k)
		}
		refs[k] = append(refs[k], strings.TrimSpace(string(ref)))
		hyps[k] = append(hyps[k], pocketsphinx(t, w))
	}
	for _, k := range keys {
		t.Logf("WER %s %s: %.3f over %d sentences; heard %q", k.voice, k.variant, wer(refs[k], hyps[k]), len(refs[k]), hyps[k])
	}
}

// wer is the word error rate of hyps against refs: word edits (substitutions, insertions,
// deletions) over reference words, case and punctuation ignored.
func wer(refs, hyps []string) float64 {
	edits, words := 0, 0
	for i := range refs {
		r, h := asrWords(refs[i]), asrWords(hyps[i])
		words += len(r)
		d := make([]int, len(h)+1)
		for j := range d {
			d[j] = j
		}
		for a := 1; a <= len(r); a++ {
			prev := d[0]
			d[0] = a
			for b := 1; b <= len(h); b++ {
				cur := d[b]
				cost := 1
				if r[a-1] == h[b-1] {
					cost = 0
				}
				d[b] = min(d[b]+1, d[b-1]+1, prev+cost)
				prev = cur
			}
		}
		edits += d[len(h)]
	}
	return float64(edits) / float64(words)
}

func asrWords(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && r != '\'' })
}

func TestWER(t *testing.T) {
	for _, c := range []struct {
		ref, hyp string
		want     float64
	}{
		{"The cat sat.", "the cat sat", 0},
		{"the cat sat", "the hat sat", 1.0 / 3},
		{"the cat sat", "", 1},
		{"the cat sat", "a the cat sat down", 2.0 / 3},
	} {
		if got := wer([]string{c.ref}, []string{c.hyp}); got != c.want {
			t.Errorf("wer(%q, %q) = %g, want %g", c.ref, c.hyp, got, c.want)
		}
	}
}

func TestPiperRealVoiceIsIntelligible(t *testing.T) {
	voice := fetchJenny(t)
	listen := freePort(t)
	s := startServe(t, writePiperConfig(t, listen, voice), listen)

	// The voices list shows the real voice.
	if model, ids := listVoices(t, s.url); model != "en_GB-jenny_dioco-medium" || !slices.Equal(ids, []string{"en_GB-jenny_dioco-medium"}) {
		t.Fatalf("voices: model %q, %v", model, ids)
	}

	// So does the status page's model line (router/status/app.js reads it from /status.json), with
	// the credit the voice's licence asks for.
	resp, err := http.Get(s.url + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Model struct {
			Name        string `json:"name"`
			Attribution string `json:"attribution"`
		} `json:"model"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Model.Name != "en_GB-jenny_dioco-medium" || !strings.Contains(st.Model.Attribution, "Jenny (Dioco)") {
		t.Fatalf("status.json model: %+v %v", st, err)
	}

	hyps := transcribe(t, s.url, "en_GB-jenny_dioco-medium")
	w := wer(asrSentences, hyps)
	t.Logf("WER %.3f; heard %q", w, hyps)
	if w > maxWER {
		t.Errorf("word error rate %.2f over the bound %.2f: pocketsphinx heard %q", w, maxWER, hyps)
	}
}

// TestPiperSpeedIntelligibility measures (VOXMUX_SPEED_WER=1; a report, not a check) jenny's
// word error rate and audio length at several speeds, three runs each: docs/piper.md, Speed.
func TestPiperSpeedIntelligibility(t *testing.T) {
	if os.Getenv("VOXMUX_SPEED_WER") != "1" {
		t.Skip("a measurement: VOXMUX_SPEED_WER=1 runs it")
	}
	voice := fetchJenny(t)
	listen := freePort(t)
	s := startServe(t, writePiperConfig(t, listen, voice), listen)
	for _, speed := range []float64{0.5, 0.6, 1, 1.5, 1.8, 2, 3} {
		var secs, w float64
		const runs = 3
		for range runs {
			hyps, n := transcribeAt(t, s.url, "en_GB-jenny_dioco-medium", speed)
			secs += n / runs
			w += wer(asrSentences, hyps) / runs
		}
		t.Logf("speed %g: %.2f s of audio, WER %.3f", speed, secs, w)
	}
}

// The tiny voice (random tones) fails the bound the real voice passes: the test can tell speech
// from noise.
func TestPiperASRRejectsTinyVoice(t *testing.T) {
	listen := freePort(t)
	model, _ := filepath.Abs("../../models/tiny-piper/en_US-tiny-x_low.onnx")
	s := startServe(t, writePiperConfig(t, listen, model), listen)
	hyps := transcribe(t, s.url, "en_US-tiny-x_low")
	w := wer(asrSentences, hyps)
	t.Logf("WER %.3f; heard %q", w, hyps)
	if w <= maxWER {
		t.Errorf("the tiny voice's tones pass the intelligibility bound: WER %.2f <= %.2f, heard %q", w, maxWER, hyps)
	}
}

// A voice that was never fetched, or whose graph is truncated, stops serve with the voice named and why.
func TestServeFailsOnMissingOrBrokenModuleVoice(t *testing.T) {
	dir := t.TempDir()
	cfg, _ := os.ReadFile("../../models/tiny-piper/en_US-tiny-x_low.onnx.json")
	g, _ := os.ReadFile("../../models/tiny-piper/en_US-tiny-x_low.onnx")
	os.WriteFile(filepath.Join(dir, "en_GB-cut-medium.onnx.json"), cfg, 0o644)
	os.WriteFile(filepath.Join(dir, "en_GB-cut-medium.onnx"), g[:len(g)/3], 0o644)
	for model, want := range map[string][]string{
		filepath.Join(dir, "en_GB-jenny_dioco-medium.onnx"): {"en_GB-jenny_dioco-medium.onnx is missing", "voxmux voices fetch"},
		filepath.Join(dir, "en_GB-cut-medium.onnx"):         {"en_GB-cut-medium.onnx"},
	} {
		out, err := exec.Command(voxmuxBinary(t), "serve", "--config", writePiperConfig(t, freePort(t), model)).CombinedOutput()
		if err == nil {
			t.Fatalf("serve with %s exited 0", model)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("serve with %s: output does not say %q:\n%s", model, w, out)
			}
		}
	}
}

// `voxmux voices unpack` writes the same voice from a module folder on disk, for hosts without Go,
// and names the folder when it holds no voice archive.
func TestVoicesUnpackModuleFolder(t *testing.T) {
	mod, err := exec.Command("go", "mod", "download", "-json", "github.com/amitybell/piper-voice-jenny@v0.0.0-20231118093224-dcf0d49e46b7").Output()
	if err != nil {
		t.Fatalf("go mod download: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(mod, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download: %v %s", err, mod)
	}
	dir := t.TempDir()
	out, err := exec.Command(voxmuxBinary(t), "voices", "unpack", "--dir", dir, m.Dir).CombinedOutput()
	if err != nil {
		t.Fatalf("voices unpack: %v\n%s", err, out)
	}
	for _, f := range []string{"en_GB-jenny_dioco-medium.onnx", "en_GB-jenny_dioco-medium.onnx.json", "en_GB-jenny_dioco-medium.MODEL_CARD", "en_GB-jenny_dioco-medium.LICENSE"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	empty := t.TempDir()
	out, err = exec.Command(voxmuxBinary(t), "voices", "unpack", "--dir", dir, empty).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unpack "+empty) || !strings.Contains(string(out), "dist.tzst") {
		t.Errorf("unpack of a folder without dist.tzst: %v\n%s", err, out)
	}
}
