package piper

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/tts"

	"github.com/voxmux/voxmux/instance/espeak"
	"github.com/voxmux/voxmux/instance/ort"
)

// models/tiny-piper is made by scripts/piper/make_tiny.py: Piper's graph interface and .onnx.json
// schema; each of the first input_lengths ids lasts ceil(2·length_scale) frames of 256 samples.
const (
	tinyPiperDir   = "../../models/tiny-piper"
	tinyPiperEN    = tinyPiperDir + "/en_US-tiny-x_low.onnx"
	tinyPiperMulti = tinyPiperDir + "/es_ES-tinymulti-x_low.onnx"
	tinyPiperHop   = 256
)

func ortLibrary(t testing.TB) string {
	t.Helper()
	p, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testPhonemizer(t testing.TB) *espeak.Phonemizer {
	t.Helper()
	dir, err := espeak.FindData("")
	if err != nil {
		t.Fatal(err)
	}
	p, err := espeak.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func tinyPiperFile(t testing.TB, path string) *piperFile {
	t.Helper()
	f, err := loadPiperFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// The expected ids are derived by hand: espeak-ng's IPA for the text (see the espeak package's
// tests), language flags removed, the clause punctuation kept (", " after a comma), split into code
// points and looked up in piper-phonemize's default id map, which the tiny voices carry:
//
//	_ 0  ^ 1  $ 2  ' ' 3  ! 4  , 8  . 10  ? 13  a 14  d 17  e 18  f 19  h 20  i 21  j 22  k 23
//	l 24  m 25  n 26  o 27  s 31  t 32  u 33  w 35  ɑ 51  ɔ 54  ə 59  ɜ 62  ɪ 74  ɹ 88  ʊ 100
//	ʒ 108  ˈ 120  ˌ 121  ː 122  θ 126  5 135
//
// Each sentence is ^ _ then every phoneme's id followed by _ (0), then $.
func TestPiperPhonemeIDs(t *testing.T) {
	ph := testPhonemizer(t)
	en := tinyPiperFile(t, tinyPiperEN)
	es := tinyPiperFile(t, tinyPiperMulti)
	cmn := *en
	cmn.Config.ESpeak.Voice = "cmn"
	pad := func(ids ...int64) []int64 {
		out := []int64{1, 0}
		for _, id := range ids {
			out = append(out, id, 0)
		}
		return append(out, 2)
	}
	for _, c := range []struct {
		name string
		f    *piperFile
		text string
		want [][]int64
	}{
		{"english", en, "Hello, world. How are you?", [][]int64{
			// həlˈoʊ, wˈɜːld.
			pad(20, 59, 24, 120, 27, 100, 8, 3, 35, 120, 62, 122, 24, 17, 10),
			// hˈaʊ ɑːɹ juː?
			pad(20, 120, 14, 100, 3, 51, 122, 88, 3, 22, 33, 122, 13),
		}},
		{"spanish", es, "¿Cómo estás? ¡Hola, mundo!", [][]int64{
			// kˈomo estˈas?
			pad(23, 120, 27, 25, 27, 3, 18, 31, 32, 120, 14, 31, 13),
			// ˈola, mˈundo!
			pad(120, 27, 24, 14, 8, 3, 25, 120, 33, 26, 17, 27, 4),
		}},
		{"chinese", &cmn, "你好，世界。", [][]int64{
			// espeak-ng: "(en)nɪθɹˈiː hˌeɪəθɹˈiː(cmn)" "," then "s.ˈi.5 (en)dʒiːfˈɔː(cmn)" "."
			// -> nɪθɹˈiː hˌeɪəθɹˈiː, s.ˈi.5 dʒiːfˈɔː.
			pad(26, 74, 126, 88, 120, 21, 122, 3, 20, 121, 18, 74, 59, 126, 88, 120, 21, 122, 8, 3,
				31, 10, 120, 21, 10, 135, 3, 17, 108, 21, 122, 19, 120, 54, 122, 10),
		}},
		// A sentence with nothing to pronounce is left out; the others stay.
		{"emoji sentence dropped", en, "🫠🫥\n\nHello.", [][]int64{pad(20, 59, 24, 120, 27, 100, 10)}},
		{"only emoji", en, "🫠🫥", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			sents, err := c.f.sentences(ph, c.text)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]int64
			for _, s := range sents {
				got = append(got, s.IDs)
			}
			if !slices.EqualFunc(got, c.want, slices.Equal) {
				t.Errorf("%q:\n got %v\nwant %v\n(sentences %+v)", c.text, got, c.want, sents)
			}
		})
	}
}

// Piper's own expectations (OHF-Voice/piper1-gpl tests/test_piper.py, test_phonemize_synthesize
// and test_phonemize_with_vowel_clusters) hold here with Debian's espeak-ng.
func TestPiperMatchesPipersTestVectors(t *testing.T) {
	ph := testPhonemizer(t)
	f := tinyPiperFile(t, tinyPiperEN)
	sents, err := f.sentences(ph, "Test 1. Test 2.")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int64{
		{1, 0, 32, 0, 120, 0, 61, 0, 31, 0, 32, 0, 3, 0, 35, 0, 120, 0, 102, 0, 26, 0, 10, 0, 2},
		{1, 0, 32, 0, 120, 0, 61, 0, 31, 0, 32, 0, 3, 0, 32, 0, 120, 0, 33, 0, 122, 0, 10, 0, 2},
	}
	if len(sents) != 2 || !slices.Equal(sents[0].IDs, want[0]) || !slices.Equal(sents[1].IDs, want[1]) {
		t.Fatalf("Test 1. Test 2.: %+v, want %v", sents, want)
	}
	// piper1-gpl's default map adds diphthongs 161..165 for voices trained with vowel_clusters.
	for i, d := range []string{"aɪ", "aʊ", "ɔɪ", "eɪ", "oʊ"} {
		f.Config.PhonemeIDMap[d] = []int64{int64(161 + i)}
	}
	f.Config.VowelClusters = [][]string{{"a", "ɪ"}, {"a", "ʊ"}, {"ɔ", "ɪ"}, {"e", "ɪ"}, {"o", "ʊ"}}
	sents, err = f.sentences(ph, "my cow toy day no")
	if err != nil {
		t.Fatal(err)
	}
	wantIDs := []int64{1, 0, 25, 0, 161, 0, 3, 0, 23, 0, 120, 0, 162, 0, 3, 0, 32, 0, 120, 0, 163, 0, 3, 0, 17, 0, 120, 0, 164, 0, 3, 0, 26, 0, 120, 0, 165, 0, 2}
	if len(sents) != 1 || !slices.Equal(sents[0].IDs, wantIDs) {
		t.Fatalf("my cow toy day no: %+v, want %v", sents, wantIDs)
	}
}

func TestPiperPhonemeMapAndClusters(t *testing.T) {
	f := tinyPiperFile(t, tinyPiperEN)
	f.Config.PhonemeMap = map[string][]string{"c": {"k"}}
	f.Config.VowelClusters = [][]string{{"a", "ɪ"}}
	f.Config.PhonemeIDMap["aɪ"] = []int64{200}
	got := f.phonemes("caɪç") // ç decomposes to c + U+0327
	want := []string{"k", "aɪ", "k", "\u0327"}
	if !slices.Equal(got, want) {
		t.Fatalf("phonemes %q, want %q", got, want)
	}
	if ids := f.ids(got); !slices.Equal(ids, []int64{1, 0, 23, 0, 200, 0, 23, 0, 140, 0, 2}) {
		t.Fatalf("ids %v", ids)
	}
	if s := stripLanguageFlags("(en)nɪ hˌeɪ(cmn) ni"); s != "nɪ hˌeɪ ni" {
		t.Fatalf("stripLanguageFlags: %q", s)
	}
}

func openTinyPiper(t testing.TB, path string) (*Runner, tts.Description) {
	t.Helper()
	r, d, err := openPiper(tts.LoadConfig{Manifest: path, Provider: "cpu", ORTLibrary: ortLibrary(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, d
}

// speak returns each chunk's audio.
func speak(t *testing.T, r instance.Runner, req tts.Request) [][]float32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var chunks [][]float32
	err := r.Synthesize(ctx, req, func(c tts.Chunk) error {
		if c.Index != len(chunks) {
			t.Errorf("chunk %d arrived as number %d", c.Index, len(chunks))
		}
		if c.SampleRate != 22050 {
			t.Errorf("sample rate %d, want 22050", c.SampleRate)
		}
		chunks = append(chunks, c.PCM)
		return nil
	})
	if err != nil {
		t.Fatalf("synthesize %q: %v", req.Text, err)
	}
	return chunks
}

func TestPiperDescribeFolder(t *testing.T) {
	d, err := (Family{}).Describe(tinyPiperDir)
	if err != nil {
		t.Fatal(err)
	}
	want := tts.Description{Kind: "piper", Name: "tiny-piper", SampleRate: 22050, Voices: []string{"en_US-tiny-x_low", "alice", "bob"}, NativeSpeed: true}
	if d.Kind != want.Kind || d.Name != want.Name || d.SampleRate != want.SampleRate || !slices.Equal(d.Voices, want.Voices) || !d.NativeSpeed {
		t.Fatalf("(Family{}).Describe(folder) = %+v, want %+v", d, want)
	}
	for path, name := range map[string]string{tinyPiperEN: "en_US-tiny-x_low", tinyPiperEN + ".json": "en_US-tiny-x_low"} {
		d, err := (Family{}).Describe(path)
		if err != nil || d.Name != name || !slices.Equal(d.Voices, []string{"en_US-tiny-x_low"}) {
			t.Errorf("(Family{}).Describe(%s) = %+v, %v", path, d, err)
		}
	}
	if d, err := (Family{}).Describe(tinyPiperMulti); err != nil || !slices.Equal(d.Voices, []string{"alice", "bob"}) {
		t.Errorf("(Family{}).Describe(multi) = %+v, %v", d, err)
	}
	// A staged manifest is another family's.
	if (Family{}).Claims("../../models/tiny/pipeline.yaml") {
		t.Error("the Piper family claims a staged manifest")
	}
}

func TestPiperSpeaksSentenceBySentence(t *testing.T) {
	r, _ := openTinyPiper(t, tinyPiperEN)
	ph := testPhonemizer(t)
	f := tinyPiperFile(t, tinyPiperEN)
	text := "Hello, world. How are you?"
	sents, err := f.sentences(ph, text)
	if err != nil || len(sents) != 2 {
		t.Fatalf("sentences: %v %v", sents, err)
	}
	for _, c := range []struct {
		speed       float32
		framesPerID int // ceil(2 × length_scale / speed)
	}{{1, 2}, {2, 1}, {0.5, 4}, {0.25, 8}} {
		chunks := speak(t, r, tts.Request{Text: text, Speed: c.speed})
		silence := int(math.Round(DefaultSentenceSilence * 22050 / float64(c.speed))) // shortened by the speed too
		if len(chunks) != 2 {
			t.Fatalf("speed %g: %d chunks, want one per sentence (2)", c.speed, len(chunks))
		}
		for i, pcm := range chunks {
			speech := len(sents[i].IDs) * c.framesPerID * tinyPiperHop
			want := speech
			if i == 0 {
				want += silence // between sentences, not after the last
			}
			if len(pcm) != want {
				t.Errorf("speed %g sentence %d: %d samples, want %d ids × %d frames × %d + silence = %d",
					c.speed, i, len(pcm), len(sents[i].IDs), c.framesPerID, tinyPiperHop, want)
				continue
			}
			peak := float32(0)
			for _, x := range pcm[:speech] {
				peak = max(peak, max(x, -x))
			}
			if peak < 0.999 || peak > 1 {
				t.Errorf("speed %g sentence %d: peak %g, want audio normalized to 1", c.speed, i, peak)
			}
			for _, x := range pcm[speech:] {
				if x != 0 {
					t.Fatalf("speed %g: sentence silence is not silent", c.speed)
				}
			}
		}
	}
	// Deterministic: the same request gives the same audio.
	a, b := speak(t, r, tts.Request{Text: "Hello."}), speak(t, r, tts.Request{Text: "Hello."})
	if !slices.Equal(a[0], b[0]) {
		t.Error("the same request gave different audio")
	}
}

func TestPiperMultiSpeakerPicksSid(t *testing.T) {
	r, d := openTinyPiper(t, tinyPiperDir)
	if !slices.Equal(d.Voices, []string{"en_US-tiny-x_low", "alice", "bob"}) {
		t.Fatalf("voices %v", d.Voices)
	}
	text := "Hola, mundo."
	alice := speak(t, r, tts.Request{Text: text, Voice: "alice"})
	bob := speak(t, r, tts.Request{Text: text, Voice: "bob"})
	if len(alice) != 1 || len(bob) != 1 || len(alice[0]) != len(bob[0]) {
		t.Fatalf("alice %d chunks, bob %d chunks: want one each of equal length", len(alice), len(bob))
	}
	if slices.Equal(alice[0], bob[0]) {
		t.Fatal("alice and bob sound the same: sid is not reaching the graph")
	}
	if again := speak(t, r, tts.Request{Text: text, Voice: "alice"}); !slices.Equal(again[0], alice[0]) {
		t.Fatal("alice twice gave different audio")
	}
	// The empty voice is the first one (the single-speaker English voice, phonemized as English).
	first := speak(t, r, tts.Request{Text: "Hello."})
	en := speak(t, r, tts.Request{Text: "Hello.", Voice: "en_US-tiny-x_low"})
	if !slices.Equal(first[0], en[0]) {
		t.Fatal("the default voice is not the first voice")
	}
	err := r.Synthesize(context.Background(), tts.Request{Text: "Hi.", Voice: "carol"}, func(tts.Chunk) error { return nil })
	var ie *tts.Error
	if !errors.As(err, &ie) || ie.Kind != tts.ErrInvalid || !strings.Contains(ie.Msg, "carol") {
		t.Fatalf("unknown voice: %v", err)
	}
}

func TestPiperNothingToPronounceIsInvalid(t *testing.T) {
	r, _ := openTinyPiper(t, tinyPiperEN)
	for _, text := range []string{"🫠🫥", "🫠 🫥 🫠"} {
		emitted := 0
		err := r.Synthesize(context.Background(), tts.Request{Text: text}, func(tts.Chunk) error { emitted++; return nil })
		var ie *tts.Error
		if !errors.As(err, &ie) || ie.Kind != tts.ErrInvalid || !strings.Contains(ie.Msg, "nothing to pronounce") || emitted != 0 {
			t.Errorf("%q: err %v, %d chunks; want tts.ErrInvalid and no audio", text, err, emitted)
		}
	}
	if err := r.Synthesize(context.Background(), tts.Request{Text: "  "}, func(tts.Chunk) error { return nil }); !errors.Is(err, tts.ErrEmptyText) {
		t.Errorf("blank text: %v", err)
	}
}

// A client that goes away after the first sentence stops the synthesis there.
func TestPiperStopsWhenClientGoes(t *testing.T) {
	r, _ := openTinyPiper(t, tinyPiperEN)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	err := r.Synthesize(ctx, tts.Request{Text: "One. Two. Three. Four."}, func(tts.Chunk) error {
		n++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || n != 1 {
		t.Fatalf("err %v after %d chunks; want context.Canceled after 1", err, n)
	}
}

// writeVoice copies a tiny voice's graph into dir as stem.onnx with its config changed by edit
// (nil edit: no .onnx.json at all).
func writeVoice(t *testing.T, dir, src, stem string, edit func(map[string]any)) string {
	t.Helper()
	g, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, stem+".onnx")
	if err := os.WriteFile(p, g, 0o644); err != nil {
		t.Fatal(err)
	}
	if edit == nil {
		return p
	}
	var cfg map[string]any
	data, _ := os.ReadFile(src + ".json")
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	out, _ := json.Marshal(cfg)
	if err := os.WriteFile(p+".json", out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPiperBadVoiceFiles(t *testing.T) {
	for _, c := range []struct {
		name string
		src  string
		edit func(map[string]any)
		want []string
	}{
		{"missing config", tinyPiperEN, nil, []string{"v.onnx.json", "missing"}},
		{"speakers without sid", tinyPiperEN, func(c map[string]any) { c["num_speakers"] = 2 }, []string{"v.onnx", "num_speakers is 2", "no sid input"}},
		{"sid without speakers", tinyPiperMulti, func(c map[string]any) { c["num_speakers"] = 1; c["speaker_id_map"] = map[string]any{} }, []string{"v.onnx", "num_speakers is 1", "has a sid input"}},
		{"no bos", tinyPiperEN, func(c map[string]any) { delete(c["phoneme_id_map"].(map[string]any), "^") }, []string{"v.onnx.json", `phoneme_id_map: has no "^"`}},
		{"no sample rate", tinyPiperEN, func(c map[string]any) { delete(c, "audio") }, []string{"v.onnx.json", "audio.sample_rate"}},
		{"other phonemizer", tinyPiperEN, func(c map[string]any) { c["phoneme_type"] = "pinyin" }, []string{"v.onnx.json", `phoneme_type: "pinyin"`}},
		{"id past num_symbols", tinyPiperEN, func(c map[string]any) { c["num_symbols"] = 100 }, []string{"v.onnx.json", "outside num_symbols 100"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := writeVoice(t, dir, c.src, "v", c.edit)
			for _, path := range []string{p, dir} {
				_, err := (Family{}).Describe(path)
				if err == nil {
					t.Fatalf("(Family{}).Describe(%s): no error", path)
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("(Family{}).Describe(%s): %q does not say %q", path, err, w)
					}
				}
			}
		})
	}
	// Not a graph at all.
	dir := t.TempDir()
	p := writeVoice(t, dir, tinyPiperEN, "v", func(map[string]any) {})
	os.WriteFile(p, []byte("not onnx"), 0o644)
	if _, err := (Family{}).Describe(p); err == nil || !strings.Contains(err.Error(), "v.onnx") {
		t.Errorf("garbage graph: %v", err)
	}
	// An espeak voice espeak-ng does not have fails at load, naming the config.
	dir = t.TempDir()
	p = writeVoice(t, dir, tinyPiperEN, "v", func(c map[string]any) { c["espeak"] = map[string]any{"voice": "xx-nope"} })
	if _, _, err := openPiper(tts.LoadConfig{Manifest: p, Provider: "cpu", ORTLibrary: ortLibrary(t)}); err == nil ||
		!strings.Contains(err.Error(), "v.onnx.json") || !strings.Contains(err.Error(), "xx-nope") {
		t.Errorf("unknown espeak voice: %v", err)
	}
	// Two files offering one voice name.
	dir = t.TempDir()
	writeVoice(t, dir, tinyPiperMulti, "a", func(map[string]any) {})
	writeVoice(t, dir, tinyPiperMulti, "b", func(map[string]any) {})
	if _, err := (Family{}).Describe(dir); err == nil || !strings.Contains(err.Error(), `"alice"`) {
		t.Errorf("duplicate voice names: %v", err)
	}
}

func TestPiperManifest(t *testing.T) {
	dir := t.TempDir()
	writeVoice(t, dir, tinyPiperEN, "en", func(map[string]any) {})
	sub := filepath.Join(dir, "more")
	os.Mkdir(sub, 0o755)
	writeVoice(t, sub, tinyPiperMulti, "multi", func(map[string]any) {})
	man := filepath.Join(dir, "voices.yaml")
	os.WriteFile(man, []byte("kind: piper\nname: mine\nvoices: [en.onnx, more]\nmax_loaded_voices: 1\nsentence_silence: 0\n"), 0o644)
	d, err := (Family{}).Describe(man)
	if err != nil || d.Name != "mine" || !slices.Equal(d.Voices, []string{"en", "alice", "bob"}) {
		t.Fatalf("(Family{}).Describe(manifest) = %+v, %v", d, err)
	}
	r, _ := openTinyPiper(t, man)
	chunks := speak(t, r, tts.Request{Text: "One. Two."})
	f := tinyPiperFile(t, tinyPiperEN)
	sents, _ := f.sentences(testPhonemizer(t), "One. Two.")
	if len(chunks) != 2 || len(chunks[0]) != len(sents[0].IDs)*2*tinyPiperHop {
		t.Fatalf("sentence_silence 0: first chunk has %d samples, want %d", len(chunks[0]), len(sents[0].IDs)*2*tinyPiperHop)
	}
	// max_loaded_voices 1: using another file's voice unloads the first.
	if got := r.Loaded(); !slices.Equal(got, []string{"en"}) {
		t.Fatalf("loaded %v, want [en]", got)
	}
	speak(t, r, tts.Request{Text: "Hola.", Voice: "bob"})
	if got := r.Loaded(); !slices.Equal(got, []string{"multi"}) {
		t.Fatalf("loaded %v, want [multi]", got)
	}
	// Concurrent requests over both files with a bound of 1: a session in use is never unloaded,
	// so every request completes.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			voice := []string{"en", "alice", "bob"}[i%3]
			err := r.Synthesize(context.Background(), tts.Request{Text: "One. Two.", Voice: voice}, func(tts.Chunk) error { return nil })
			if err != nil {
				t.Errorf("%s: %v", voice, err)
			}
		}()
	}
	wg.Wait()
	if got := r.Loaded(); len(got) != 1 {
		t.Fatalf("after the requests, %v loaded; want 1", got)
	}

	for body, want := range map[string]string{
		"kind: piper\nbogus: 1\n":              "bogus",
		"kind: piper\nmax_loaded_voices: -1\n": "max_loaded_voices",
		"kind: piper\nvoices: [nope.onnx]\n":   "nope.onnx",
	} {
		os.WriteFile(man, []byte(body), 0o644)
		if _, err := (Family{}).Describe(man); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "voices.yaml") && want != "nope.onnx" {
			t.Errorf("manifest %q: %v", body, err)
		}
	}
}
