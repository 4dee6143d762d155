package text

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// qwen2 loads the Qwen2 tokenizer files of testdata/qwen2 (compressed there) with CosyVoice3's
// special tokens.
func qwen2(t testing.TB) *BPE {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"vocab.json", "merges.txt"} {
		in, err := os.Open(filepath.Join("testdata/qwen2", name+".zst"))
		if err != nil {
			t.Fatal(err)
		}
		dec, err := zstd.NewReader(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dir, name))
		if err == nil {
			_, err = io.Copy(out, dec)
		}
		if err == nil {
			err = out.Close()
		}
		dec.Close()
		in.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	added, err := LoadAddedTokens("testdata/qwen2/tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := LoadBPE(filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt"), added, SpecialTokenSets["cosyvoice3"])
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// reference is what Hugging Face's Qwen2 tokenizer (transformers, with CosyVoice3's special
// tokens added as its frontend adds them) made of the corpus: testdata/qwen2/reference.py.
type reference struct {
	Transformers string           `json:"transformers"`
	Cases        []referenceCase  `json:"cases"`
	Specials     map[string]int64 `json:"specials"`
	VocabSize    int              `json:"vocab_size"`
}

type referenceCase struct {
	Text string  `json:"text"`
	IDs  []int64 `json:"ids"`
}

func loadReference(t testing.TB) reference {
	return loadReferenceFile(t, "testdata/qwen2/ref_ids.json")
}

func loadReferenceFile(t testing.TB, path string) reference {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

func TestQwen2MatchesReference(t *testing.T) {
	tok := qwen2(t)
	ref := loadReference(t)
	if len(ref.Cases) < 40 {
		t.Fatalf("reference has %d cases", len(ref.Cases))
	}
	for _, c := range ref.Cases {
		if got := tok.Encode(c.Text); !slices.Equal(got, c.IDs) {
			t.Errorf("%q:\n got %v\nwant %v (transformers %s)", c.Text, got, c.IDs, ref.Transformers)
		}
	}
	for s, want := range ref.Specials {
		if got, ok := tok.ID(s); !ok || got != want {
			t.Errorf("id of %s = %d, %v; want %d", s, got, ok, want)
		}
	}
	if tok.Size() != ref.VocabSize {
		t.Errorf("size %d, want %d", tok.Size(), ref.VocabSize)
	}
}

// 400 texts of random pieces (words, contractions, digits, punctuation, every kind of white
// space, scripts, emoji sequences, combining marks, special tokens whole and broken) made by
// testdata/qwen2/reference.py with a fixed seed.
func TestQwen2MatchesReferenceOnRandomTexts(t *testing.T) {
	tok := qwen2(t)
	ref := loadReferenceFile(t, "testdata/qwen2/fuzz_ids.json")
	if len(ref.Cases) != 400 {
		t.Fatalf("reference has %d cases", len(ref.Cases))
	}
	bad := 0
	for _, c := range ref.Cases {
		if got := tok.Encode(c.Text); !slices.Equal(got, c.IDs) {
			if bad++; bad <= 10 {
				t.Errorf("%q:\n got %v\nwant %v", c.Text, got, c.IDs)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d texts differ", bad, len(ref.Cases))
	}
}

// Encoding the same words again (from the cache) gives the same ids.
func TestQwen2CacheKeepsIDs(t *testing.T) {
	tok := qwen2(t)
	c := loadReference(t).Cases[1]
	first := tok.Encode(c.Text)
	if again := tok.Encode(c.Text); !slices.Equal(first, again) || !slices.Equal(first, c.IDs) {
		t.Fatalf("%v then %v, want %v", first, again, c.IDs)
	}
}

func TestSplitWords(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"I'LL don't", []string{"I", "'LL", " don", "'t"}},
		{"a  b", []string{"a", " ", " b"}},
		{"end   ", []string{"end", "   "}},
		{"x\n\n  y", []string{"x", "\n\n", " ", " y"}},
		{"123", []string{"1", "2", "3"}},
		{" ,.!x", []string{" ,.!", "x"}},
		{"$5", []string{"$", "5"}},
		{"\tword", []string{"\tword"}},
		{"你好，世界", []string{"你好", "，世界"}},
	} {
		var got []string
		splitWords(c.in, func(w string) { got = append(got, w) })
		if !slices.Equal(got, c.want) {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}

func BenchmarkQwen2Encode(b *testing.B) {
	tok := qwen2(b)
	text := loadReference(b).Cases[len(loadReference(b).Cases)-1].Text
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.cache = map[string][]int64{}
		tok.Encode(text)
	}
}
