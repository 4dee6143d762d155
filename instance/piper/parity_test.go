package piper

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"

	"github.com/voxmux/voxmux/instance/piper/voicemod"
)

// parityTolerance bounds each sample's difference from Piper's, of full scale: measured 0.00005
// (under 2 steps of 16 bits) on an x86-64 CPU; the bound leaves room for other CPUs' kernels.
const parityTolerance = 0.001

// Parity with Piper's reference executable (github.com/amitybell/piper-bin-linux, pinned in
// voicemod.PiperBin) on a published voice (jenny, voicemod.Known): both come from the Go module cache.

// parityText has numbers, abbreviations and punctuation; each line is one request.
var parityText = []string{
	"Dr. Smith paid $3.50 on Jan. 5th, 2023 - at 10:30!",
	"Mr. Jones, 42 years old, lives at 221B Baker St.; isn't that odd?",
	"The meeting is at 3 p.m. (not 4), e.g. in room 12.",
	"It costs 1,234,567 pounds: about 45% more than in 1999.",
	"Hello world. This is a real voice, served by voxmux on the CPU.",
	"What? No! Yes, maybe; I'll see.",
	"NASA's CEO met the U.K. team on Friday the 13th.",
	"She said \"call 555-1234\" at 7:45 a.m.; it's 20°C and 3.5 km away.",
	"Version 2.0 shipped on 1/2/2024, i.e. 2 days late (sorry!)",
	"Wait... who's there?",
}

type piperRef struct {
	exe, dir string // the executable and its folder (libraries, espeak-ng-data)
	voice    string // jenny's .onnx
}

var (
	refOnce sync.Once
	ref     piperRef
	refErr  error
)

// reference fetches Piper's executable and the jenny voice once per test binary.
func reference(t *testing.T) piperRef {
	t.Helper()
	refOnce.Do(func() {
		dir, err := os.MkdirTemp("", "voxmux-piper-ref-")
		if err != nil {
			refErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		exe, err := voicemod.FetchPiper(ctx, os.Getenv("GO"), filepath.Join(dir, "piper"))
		if err != nil {
			refErr = err
			return
		}
		u, err := voicemod.Fetch(ctx, os.Getenv("GO"), "jenny", filepath.Join(dir, "voices"))
		if err != nil {
			refErr = err
			return
		}
		ref = piperRef{exe: exe, dir: filepath.Dir(exe), voice: u.ONNX}
	})
	if refErr != nil {
		t.Fatal(refErr)
	}
	return ref
}

// run feeds lines of text to Piper's executable (--json-input, one WAV per line) and returns the
// phoneme ids of each sentence, in order, from its --debug log, and each line's audio.
func (p piperRef) run(t *testing.T, lines []string, args ...string) (ids [][]int64, audio [][]int16) {
	t.Helper()
	out := t.TempDir()
	var in bytes.Buffer
	for i, l := range lines {
		json.NewEncoder(&in).Encode(map[string]string{"text": l, "output_file": filepath.Join(out, fmt.Sprintf("%d.wav", i))})
	}
	cmd := exec.Command(p.exe, append([]string{"-m", p.voice, "--espeak_data", filepath.Join(p.dir, "espeak-ng-data"), "--json-input", "--debug"}, args...)...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+p.dir)
	cmd.Stdin = &in
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("piper: %v\n%s", err, log)
	}
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		_, list, ok := strings.Cut(sc.Text(), " phoneme id(s): ")
		if !ok {
			continue
		}
		var row []int64
		for _, f := range strings.Split(strings.TrimRight(list, ", "), ", ") {
			id, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("piper's log: %q: %v", sc.Text(), err)
			}
			row = append(row, id)
		}
		ids = append(ids, row)
	}
	for i := range lines {
		audio = append(audio, readWAV16(t, filepath.Join(out, fmt.Sprintf("%d.wav", i))))
	}
	return ids, audio
}

// readWAV16 reads the samples of a 16-bit mono WAV as Piper writes it (a 44-byte header).
func readWAV16(t *testing.T, path string) []int16 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 44 || string(b[:4]) != "RIFF" || string(b[36:40]) != "data" {
		t.Fatalf("%s: not a plain 16-bit WAV", path)
	}
	s := make([]int16, (len(b)-44)/2)
	binary.Read(bytes.NewReader(b[44:]), binary.LittleEndian, s)
	return s
}

// voxmux's phoneme ids equal those of Piper's executable for every sentence of parityText.
func TestPiperParityPhonemeIDs(t *testing.T) {
	p := reference(t)
	// A tiny length_scale: Piper synthesizes every sentence, and only its ids are wanted here.
	want, _ := p.run(t, parityText, "--length_scale", "0.05", "--sentence_silence", "0")
	f, err := loadPiperFile(p.voice)
	if err != nil {
		t.Fatal(err)
	}
	ph := testPhonemizer(t)
	var got [][]int64
	var phon []string
	for _, l := range parityText {
		ss, err := f.sentences(ph, l)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			got = append(got, s.IDs)
			phon = append(phon, strings.Join(s.Phonemes, ""))
		}
	}
	if len(want) < len(parityText) {
		t.Fatalf("Piper's log gave the ids of %d sentences for %d lines", len(want), len(parityText))
	}
	if len(got) != len(want) {
		t.Errorf("voxmux makes %d sentences of the text, Piper %d", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if !slicesEqual(got[i], want[i]) {
			t.Errorf("sentence %d (%s):\n voxmux %v\n piper  %v", i, phon[i], got[i], want[i])
		}
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// With the noise scales at 0 both are deterministic, and voxmux's audio equals Piper's: the same
// number of samples, and every sample within parityTolerance of full scale. Piper's executable
// bundles ONNX Runtime 1.14 and voxmux runs its own (a newer one), both on the CPU, so the float
// results differ by rounding only; Piper truncates to 16 bits (up to 1 step), and voxmux's
// samples are compared before any encoding.
func TestPiperParityAudio(t *testing.T) {
	p := reference(t)
	lines := []string{"Dr. Smith paid $3.50 on Jan. 5th.", "What? No!"}
	_, want := p.run(t, lines, "--noise_scale", "0", "--noise_w", "0", "--sentence_silence", "0")
	// Whole sentences, each scaled to its peak as Piper does; chunked decoding equals this one's raw
	// audio (TestPiperChunksEqualWhole) but fixes each sentence's gain before its first chunk.
	r, _, err := openPiper(tts.LoadConfig{Manifest: p.voice, Provider: "cpu", ORTLibrary: ortLibrary(t),
		Engine: section(t, Options{Decode: DecodeSentences})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	r.m.SentenceSilence = 0
	r.m.Files[0].scales = [3]float32{0, 1, 0}
	for i, l := range lines {
		var got []float32
		for _, c := range speak(t, r, tts.Request{Text: l}) {
			got = append(got, c...)
		}
		if len(got) != len(want[i]) {
			t.Errorf("%q: voxmux %d samples, Piper %d", l, len(got), len(want[i]))
			continue
		}
		var maxDiff, sq float64
		for j := range got {
			d := math.Abs(float64(got[j]) - float64(want[i][j])/32767)
			maxDiff = max(maxDiff, d)
			sq += d * d
		}
		t.Logf("%q: %d samples, largest difference %.5f of full scale, rms %.6f", l, len(got), maxDiff, math.Sqrt(sq/float64(len(got))))
		if maxDiff > parityTolerance {
			t.Errorf("%q: a sample differs from Piper's by %.5f of full scale, more than %g", l, maxDiff, parityTolerance)
		}
	}
}
