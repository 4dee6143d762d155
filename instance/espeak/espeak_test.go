package espeak

import (
	"strings"
	"sync"
	"testing"
)

// These tests run Debian's libespeak-ng 1.51 with its espeak-ng-data (scripts/debian-packages.txt).
// The expected phonemes are what that version says (espeak-ng -q --ipa gives the same words).

func phonemizer(t *testing.T) *Phonemizer {
	t.Helper()
	dir, err := FindData("")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// clauseOf is a Clause without its place in the text (TestClauseEnds checks that).
type clauseOf struct {
	Phonemes    string
	Punct       rune
	SentenceEnd bool
}

// Each clause says where its text ends: the clauses' texts follow each other and cover the text.
func TestClauseEnds(t *testing.T) {
	p := phonemizer(t)
	for _, c := range []struct {
		voice, text string
		want        []string
	}{
		{"en-us", "Hello, world. How are you? I'm fine!", []string{"Hello, ", "world. ", "How are you? ", "I'm fine!"}},
		{"cmn", "你好，世界。", []string{"你好，", "世界。"}},
	} {
		got, err := p.Phonemize(c.voice, c.text)
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		at := 0
		for _, cl := range got {
			if cl.End < at || cl.End > len(c.text) {
				t.Fatalf("%q: clause ends %+v", c.text, got)
			}
			parts = append(parts, c.text[at:cl.End])
			at = cl.End
		}
		if strings.Join(parts, "|") != strings.Join(c.want, "|") {
			t.Errorf("%q: clause texts %q, want %q", c.text, parts, c.want)
		}
	}
}

func TestClausesAndTheirPunctuation(t *testing.T) {
	p := phonemizer(t)
	for _, c := range []struct {
		voice, text string
		want        []clauseOf
	}{
		{"en-us", "Hello, world. How are you? I'm fine!", []clauseOf{
			{"həlˈoʊ", ',', false}, {"wˈɜːld", '.', true}, {"hˈaʊ ɑːɹ juː", '?', true}, {"aɪm fˈaɪn", '!', true},
		}},
		{"en-us", "He paid 3.50 dollars; ok: yes", []clauseOf{
			{"hiː pˈeɪd θɹˈiː pɔɪnt fˈaɪv zˈiəɹoʊ dˈɑːlɚz", ';', false}, {"ˌoʊkˈeɪ", ':', false}, {"jˈɛs", 0, true},
		}},
		// A closing quote does not hide the full stop; a blank line ends a sentence.
		{"en-us", "He said \"Hello.\" Then left.\n\nNew paragraph\n\nAnother one", []clauseOf{
			{"hiː sˈɛd həlˈoʊ", '.', true}, {"ðˈɛn lˈɛft", '.', true}, {"nˈuː pˈæɹəɡɹˌæf", 0, true}, {"ɐnˈʌðɚ wˌʌn", 0, true},
		}},
		{"es", "¿Cómo estás? ¡Hola, mundo!", []clauseOf{
			{"kˈomo estˈas", '?', true}, {"ˈola", ',', false}, {"mˈundo", '!', true},
		}},
		// Full-width CJK punctuation ends clauses like its ASCII forms. Debian's espeak-ng-data lacks
		// the extended Mandarin dictionary, so hanzi are read through pinyin with English digits.
		{"cmn", "你好，世界。", []clauseOf{
			{"(en)nɪθɹˈiː hˌeɪəθɹˈiː(cmn)", ',', false}, {"s.ˈi.5 (en)dʒiːfˈɔː(cmn)", '.', true},
		}},
		// Emoji espeak-ng has no name for: a clause with nothing in it.
		{"en-us", "🫠🫥", []clauseOf{{"", 0, true}}},
	} {
		got, err := p.Phonemize(c.voice, c.text)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(c.want) {
			t.Errorf("%s %q: %d clauses %+v, want %+v", c.voice, c.text, len(got), got, c.want)
			continue
		}
		for i := range got {
			if g := (clauseOf{got[i].Phonemes, got[i].Punct, got[i].SentenceEnd}); g != c.want[i] {
				t.Errorf("%s %q clause %d: %+v, want %+v", c.voice, c.text, i, got[i], c.want[i])
			}
		}
	}
}

// espeak-ng is one C state per process: concurrent callers with different voices must each get
// their own voice's phonemes.
func TestConcurrentVoices(t *testing.T) {
	p := phonemizer(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		voice, text, want := "en-us", "Hello.", "həlˈoʊ"
		if i%2 == 1 {
			voice, text, want = "es", "Hola.", "ˈola"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				got, err := p.Phonemize(voice, text)
				if err != nil || len(got) != 1 || got[0].Phonemes != want {
					t.Errorf("%s %q: %+v %v, want %q", voice, text, got, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestBadVoiceAndData(t *testing.T) {
	p := phonemizer(t)
	if err := p.CheckVoice("xx-nonexistent"); err == nil || !strings.Contains(err.Error(), "xx-nonexistent") {
		t.Errorf("unknown voice: %v", err)
	}
	if _, err := p.Phonemize("xx-nonexistent", "hi"); err == nil {
		t.Error("phonemize with an unknown voice: no error")
	}
	// The voice before still works after a failed switch.
	if got, err := p.Phonemize("en-us", "Hello."); err != nil || got[0].Phonemes != "həlˈoʊ" {
		t.Errorf("after a bad voice: %+v %v", got, err)
	}
	dir := t.TempDir()
	if _, err := FindData(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("FindData on an empty folder: %v", err)
	}
	if _, err := Open(dir); err == nil {
		t.Error("Open with a second data folder in one process: no error")
	}
	if _, err := p.Phonemize("en-us", "a\x00b"); err == nil {
		t.Error("NUL in text: no error")
	}
}

func TestTerminator(t *testing.T) {
	for _, c := range []struct {
		consumed string
		more     bool
		punct    rune
		end      bool
	}{
		{"Hello, w", true, ',', false},
		{"orld. H", true, '.', true},
		{"'m fine!  M", true, '!', true},
		{"界。今", true, '.', true},
		{"好！", false, '!', true},
		{"¿Cómo estás? ¡", true, '?', true},
		{"(Really!) —", true, '!', true},
		{"paragraph\n\nA", true, 0, true},
		{"no punctuation x", true, 0, false},
		{"Wait... w", true, 0, false},
		{"Wait.. w", true, 0, false},
		{"Wait… w", true, 0, false},
	} {
		p, end := terminator(c.consumed, c.more)
		if p != c.punct || end != c.end {
			t.Errorf("terminator(%q, %v) = %q, %v; want %q, %v", c.consumed, c.more, p, end, c.punct, c.end)
		}
	}
}
