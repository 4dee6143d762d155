package text

import (
	"slices"
	"strings"
	"testing"
)

func TestNormalizeEnglish(t *testing.T) {
	for in, want := range map[string]string{
		"I have 3 cats.":             "I have three cats.",
		"It costs 1234 dollars":      "It costs one thousand, two hundred and thirty-four dollars",
		"In 2024, 1001 nights":       "In two thousand and twenty-four, one thousand and one nights",
		"pi is 3.14":                 "pi is three point one four",
		"50% off":                    "fifty percent off",
		"the 1st, 2nd, 3rd and 21st": "the first, second, third and twenty-first",
		"the 12th and 40th":          "the twelfth and fortieth",
		"  100 and 1000000  ":        "one hundred and one million",
		"room 0042":                  "room zero zero four two",
		"no digits here":             "no digits here",
		"1st-class 2ndary":           "first-class twondary",
	} {
		if got, lang := Normalize(in); got != want || lang != English {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, lang, want)
		}
	}
}

func TestNormalizeChinese(t *testing.T) {
	for in, want := range map[string]string{
		"今年是2024年":            "今年是二千零二十四年",
		"价格是3.5元，打50%折":       "价格是三点五元，打百分之五十折",
		"第10名和第15名":           "第十名和第十五名",
		"100005人":             "十万零五人",
		"你好 世界":               "你好世界",
		"用 GPU 算":             "用GPU算",
		"面积5m²\n（约）":          "面积五m平方约",
		"他说 - 好吧，":            "他说-好吧。",
		"GPU - CPU对比":         "GPU，CPU对比",
		"结束了.":                "结束了。",
		"【注意】这是——重点":          "注意这是 重点",
		"<|endofprompt|>不改 1": "<|endofprompt|>不改 1",
	} {
		if got, lang := Normalize(in); got != want || lang != Chinese {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, lang, want)
		}
	}
}

func TestSplit(t *testing.T) {
	words := func(s string) int { return len(strings.Fields(s)) }
	spec := SplitSpec{MaxN: 8, MinN: 5, MergeLen: 3}
	got := Split("One two three. Four five six seven! Eight nine ten eleven twelve? Thirteen", English, words, spec)
	want := []string{"One two three. Four five six seven!", " Eight nine ten eleven twelve? Thirteen."}
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	// A closing quote stays with its sentence; lone punctuation goes.
	got = Split(`He said "stop." Then!! left`, English, words, DefaultSplit)
	if want := []string{`He said "stop." Then! left.`}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	// Chinese counts characters.
	long := strings.Repeat("一二三四五六七八九十。", 12) // 12 sentences of 11 characters
	segs := Split(long, Chinese, nil, DefaultSplit)
	for _, s := range segs {
		if n := len([]rune(s)); n > 80+11 || n < 20 {
			t.Errorf("segment of %d characters: %q", n, s)
		}
	}
	if strings.Join(segs, "") != long {
		t.Errorf("segments do not add up to the text: %q", segs)
	}
	if got := Split("...", English, words, DefaultSplit); len(got) != 0 {
		t.Errorf("only punctuation gave %q", got)
	}
}

// Split with CosyVoice's sizes and the Qwen2 tokenizer: every segment but one lone long sentence
// stays within 80 tokens, and the segments add up to the text.
func TestSplitQwen2Tokens(t *testing.T) {
	tok := qwen2(t)
	count := func(s string) int { return len(tok.Encode(s)) }
	var b strings.Builder
	for i := range 40 {
		b.WriteString([]string{"The quick brown fox jumps over the lazy dog. ", "Is it raining today? ", "What a wonderful surprise this turned out to be for everyone involved! "}[i%3])
	}
	text := strings.TrimSpace(b.String())
	segs := Split(text, English, count, DefaultSplit)
	if len(segs) < 5 {
		t.Fatalf("%d segments", len(segs))
	}
	for _, s := range segs {
		if n := count(s); n > 80+20 || n < 20 {
			t.Errorf("segment of %d tokens: %q", n, s)
		}
	}
	if strings.Join(segs, "") != text {
		t.Error("segments do not add up to the text")
	}
}
