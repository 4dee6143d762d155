package text

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tinyLlama loads the tiny MiniCPM-style tokenizer of testdata/voxcpm, written by
// scripts/voxcpm/tokenizer.py. Its tokenizer_config.json says legacy true, so transformers 5
// (and LoadLlama) put "▁" in front of every piece: PrefixAlways.
func tinyLlama(t testing.TB) *Llama {
	t.Helper()
	tok, err := LoadLlama("testdata/voxcpm/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Ids of the tiny vocabulary: "▁" 359, letters from 360 (a) and 386 (A), digits from 412, the
// byte <0xNN> at 103+NN; the merged pieces after them in the order of their merges.
const (
	sp   = 359
	bos  = 1
	eos  = 2
	imE  = 478 // <|im_end|>
	imS  = 479 // <|im_start|>
	hi   = 450 // ▁Hello
	wrld = 455 // ▁world
)

func byteTok(b byte) int64 { return 103 + int64(b) }

func TestLlamaTinyEncode(t *testing.T) {
	tok := tinyLlama(t)
	if tok.Prefix != PrefixAlways {
		t.Fatalf("prefix %v, want PrefixAlways (legacy true)", tok.Prefix)
	}
	for _, c := range []struct {
		in         string
		plain, cjk []int64 // without and with SplitCJK; cjk nil: the same
	}{
		{"", nil, nil},
		{"Hello world.", []int64{hi, wrld, 422}, nil},
		// "▁the▁end": no merge makes "▁e" or "▁end".
		{"the end", []int64{445, sp, 364, 458}, nil},
		// "1 2" outranks "▁ 1", so "▁1" never forms.
		{"12 123", []int64{sp, 462, sp, 462, 415}, nil},
		{"(a)?", []int64{sp, 431, 360, 432, 425}, nil},
		{"It's", []int64{sp, 394, 379, 460}, nil},
		{"a  b", []int64{457, 461, 361}, nil},
		// A piece that starts with a space gets no second "▁".
		{" Hello", []int64{hi}, nil},
		{"Hello ", []int64{hi, sp}, nil},
		{"  Hello", []int64{sp, hi}, nil},
		// Characters outside the vocabulary fall back to their UTF-8 bytes.
		{"😀", []int64{sp, byteTok(0xF0), byteTok(0x9F), byteTok(0x98), byteTok(0x80)}, nil},
		{"é", []int64{sp, byteTok(0xC3), byteTok(0xA9)}, nil},
		{"混", []int64{sp, byteTok(0xE6), byteTok(0xB7), byteTok(0xB7)}, nil},
		// "你好世界" merges to one token, which SplitCJK cuts into its characters.
		{"你好世界", []int64{sp, 471}, []int64{sp, 433, 434, 435, 436}},
		{"中文", []int64{sp, 472}, []int64{sp, 439, 440}},
		// "▁我们" is cut too, and its "▁" dropped, as VoxCPM's wrapper does.
		{"我们", []int64{474}, []int64{437, 438}},
		// "▁你" is one character without its "▁": kept.
		{"你们", []int64{469, 438}, nil},
		// Added tokens are matched first; the pieces between them get their own "▁".
		{"<|im_start|>Hello<|im_end|>", []int64{imS, hi, imE}, nil},
		{"Hello <s> world </s>", []int64{hi, sp, bos, wrld, sp, eos}, nil},
		{"<|im_start|>你好<|im_end|>", []int64{imS, sp, 467, imE}, []int64{imS, sp, 433, 434, imE}},
	} {
		want := c.cjk
		if want == nil {
			want = c.plain
		}
		tok.SplitCJK = false
		if got := tok.Encode(c.in); !slices.Equal(got, c.plain) {
			t.Errorf("%q: %v, want %v", c.in, got, c.plain)
		}
		tok.SplitCJK = true
		if got := tok.Encode(c.in); !slices.Equal(got, want) {
			t.Errorf("%q split: %v, want %v", c.in, got, want)
		}
	}
	for s, want := range map[string]int64{"<unk>": 0, "<s>": 1, "</s>": 2, "<|audio_start|>": 101, "<|audio_end|>": 102, "<0x00>": 103, "▁": sp} {
		if got, ok := tok.ID(s); !ok || got != want {
			t.Errorf("id of %s = %d, %v; want %d", s, got, ok, want)
		}
	}
	if tok.Size() != 486 {
		t.Errorf("size %d, want 486", tok.Size())
	}
}

func TestLlamaPrefixes(t *testing.T) {
	tok := tinyLlama(t)
	for _, c := range []struct {
		prefix LlamaPrefix
		in     string
		want   []int64
	}{
		// The file's Prepend normalizer puts "▁" in front even of a piece that has a space there.
		{PrefixFile, " Hello", []int64{sp, hi}},
		{PrefixFile, "Hello <s> world", []int64{hi, sp, bos, sp, wrld}},
		{PrefixFile, "Hello world", []int64{hi, wrld}},
		// Only the piece the text starts with gets one.
		{PrefixFirst, "Hello<|im_end|>Hello", []int64{hi, imE, 393, 448}},
		{PrefixFirst, "<|im_start|>Hello", []int64{imS, 393, 448}},
		{PrefixNever, "Hello world", []int64{393, 448, wrld}},
		{PrefixAlways, "Hello<|im_end|>Hello", []int64{hi, imE, hi}},
	} {
		tok.Prefix = c.prefix
		if got := tok.Encode(c.in); !slices.Equal(got, c.want) {
			t.Errorf("prefix %d, %q: %v, want %v", c.prefix, c.in, got, c.want)
		}
	}
}

// testdata/llama_parity.json is what transformers' LlamaTokenizerFast (with VoxCPM's split of
// multi-character Chinese tokens) made of the tiny tokenizer's sentences, llama_fuzz.json the
// same of 382 random strings, and llama_parity_file.json what the tokenizers library made of the
// sentences following the file: scripts/voxcpm/tokenizer_parity.py.
func TestLlamaParity(t *testing.T) {
	for _, c := range []struct {
		file   string
		prefix LlamaPrefix
	}{
		{"testdata/llama_parity.json", PrefixAlways},
		{"testdata/llama_fuzz.json", PrefixAlways},
		{"testdata/llama_parity_file.json", PrefixFile},
	} {
		t.Run(filepath.Base(c.file), func(t *testing.T) {
			data, err := os.ReadFile(c.file)
			if errors.Is(err, fs.ErrNotExist) {
				t.Skipf("%s is absent: scripts/voxcpm/tokenizer_parity.py makes it on a host with transformers", c.file)
			}
			if err != nil {
				t.Fatal(err)
			}
			var want map[string][]int64
			if err := json.Unmarshal(data, &want); err != nil {
				t.Fatalf("%s: %v", c.file, err)
			}
			if len(want) < 20 {
				t.Fatalf("%s has %d sentences", c.file, len(want))
			}
			tok := tinyLlama(t)
			tok.Prefix, tok.SplitCJK = c.prefix, true
			for text, ids := range want {
				if got := tok.Encode(text); !slices.Equal(got, ids) {
					t.Errorf("%q:\n got %v\nwant %v", text, got, ids)
				}
			}
		})
	}
}

// writeLlama writes a tokenizer.json (and a tokenizer_config.json when config is not nil) into a
// new folder and returns the tokenizer.json's path.
func writeLlama(t *testing.T, tj, config map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer.json", tj)
	if config != nil {
		write("tokenizer_config.json", config)
	}
	return filepath.Join(dir, "tokenizer.json")
}

// edgeLlama is a small file of the other forms LoadLlama reads: a Metaspace pre-tokenizer
// (prepend_scheme "first", split) instead of the normalizer, merges as pairs, no byte fallback.
func edgeLlama() map[string]any {
	return map[string]any{
		"added_tokens":  []any{map[string]any{"id": 0, "content": "<unk>", "special": true}},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true},
		"model": map[string]any{
			"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
			"vocab": map[string]int{"<unk>": 0, "a": 1, "b": 2, "ab": 3, "▁": 4, "▁a": 5,
				"<0xC3>": 6, "<0xA9>": 7, "丂": 8, "丂丄": 9},
			"merges": []any{[]string{"a", "b"}, []string{"▁", "a"}},
		},
	}
}

func TestLlamaFileForms(t *testing.T) {
	tj := edgeLlama()
	tok, err := LoadLlama(writeLlama(t, tj, nil))
	if err != nil {
		t.Fatal(err)
	}
	if tok.Prefix != PrefixFirst {
		t.Fatalf("prefix %v without a tokenizer_config.json, want PrefixFirst (transformers 5's default)", tok.Prefix)
	}
	tok.Prefix = PrefixFile
	check := func(in string, want ...int64) {
		t.Helper()
		if got := tok.Encode(in); !slices.Equal(got, want) {
			t.Errorf("%q: %v, want %v", in, got, want)
		}
	}
	// Split before each "▁": "▁ab", "▁ab"; "a b" outranks "▁ a".
	check("ab ab", 4, 3, 4, 3)
	// Unknown characters fuse into one <unk>.
	check("a😀😀b", 5, 0, 2)
	tj["model"].(map[string]any)["fuse_unk"] = false
	if tok, err = LoadLlama(writeLlama(t, tj, nil)); err != nil {
		t.Fatal(err)
	}
	tok.Prefix = PrefixFile
	check("a😀😀b", 5, 0, 0, 2)
	// With byte fallback, "é" has its byte tokens and "😀" has not: as the tokenizers library
	// does, the <unk> waiting from "😀" comes after the bytes that follow it.
	tj["model"].(map[string]any)["byte_fallback"] = true
	if tok, err = LoadLlama(writeLlama(t, tj, nil)); err != nil {
		t.Fatal(err)
	}
	tok.Prefix = PrefixFile
	check("é", 4, 6, 7)
	check("😀é", 4, 6, 7, 0)
	// ignore_merges takes a word found whole in the vocabulary as it is; SplitCJK cuts "丂丄"
	// and gives the character the vocabulary lacks the unk id.
	tj["model"].(map[string]any)["ignore_merges"] = true
	if tok, err = LoadLlama(writeLlama(t, tj, nil)); err != nil {
		t.Fatal(err)
	}
	tok.Prefix = PrefixNever
	check("丂丄", 9)
	tok.SplitCJK = true
	check("丂丄", 8, 0)
}

func TestLlamaPrefixFromConfig(t *testing.T) {
	for _, c := range []struct {
		config map[string]any
		want   LlamaPrefix
	}{
		{map[string]any{"legacy": true}, PrefixAlways},
		{map[string]any{"legacy": false}, PrefixFirst},
		{map[string]any{}, PrefixFirst},
		{map[string]any{"legacy": true, "add_prefix_space": false}, PrefixNever},
	} {
		tok, err := LoadLlama(writeLlama(t, edgeLlama(), c.config))
		if err != nil {
			t.Fatal(err)
		}
		if tok.Prefix != c.want {
			t.Errorf("%v: prefix %v, want %v", c.config, tok.Prefix, c.want)
		}
	}
}

func TestLoadLlamaRefuses(t *testing.T) {
	for _, c := range []struct {
		mutate func(map[string]any)
		want   string
	}{
		{func(tj map[string]any) { tj["model"].(map[string]any)["type"] = "WordPiece" }, `model type "WordPiece"`},
		{func(tj map[string]any) { tj["normalizer"] = map[string]any{"type": "NFKC"} }, `normalizer: "NFKC" is not supported`},
		{func(tj map[string]any) {
			tj["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " +"}, "content": "▁"}
		}, "Replace of a regex"},
		{func(tj map[string]any) { tj["pre_tokenizer"] = map[string]any{"type": "ByteLevel"} }, `pre_tokenizer: "ByteLevel" is not supported`},
		{func(tj map[string]any) { tj["model"].(map[string]any)["merges"] = []any{"a c"} }, "the vocabulary lacks"},
		{func(tj map[string]any) { tj["model"].(map[string]any)["merges"] = []any{"a b c"} }, "is not two tokens"},
		{func(tj map[string]any) { tj["model"].(map[string]any)["unk_token"] = "<nope>" }, "unk token"},
		{func(tj map[string]any) {
			tj["added_tokens"] = []any{map[string]any{"id": 0, "content": "<unk>", "normalized": true}}
		}, "normalized true is not supported"},
	} {
		tj := edgeLlama()
		c.mutate(tj)
		path := writeLlama(t, tj, nil)
		_, err := LoadLlama(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("error %v, want one naming %s and %q", err, path, c.want)
		}
	}
}

func BenchmarkLlamaEncode(b *testing.B) {
	tok := tinyLlama(b)
	tok.SplitCJK = true
	text := strings.Repeat("Hello world, it's 12 o'clock. 你好世界，我们是中文的是。😀 ", 8)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
}
