package text

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Lang is the rule set a text is normalized and segmented by: CosyVoice's frontend tells only
// Chinese (any CJK ideograph) from everything else.
type Lang int

const (
	English Lang = iota // and every language without CJK ideographs
	Chinese
)

func (l Lang) String() string {
	if l == Chinese {
		return "zh"
	}
	return "en"
}

// DetectLang returns Chinese when text holds a CJK unified ideograph (U+4E00–U+9FFF).
func DetectLang(text string) Lang {
	for _, r := range text {
		if r >= 0x4E00 && r <= 0x9FFF {
			return Chinese
		}
	}
	return English
}

// HasMarkup reports whether text carries <|…|> markers; the frontend leaves such text alone, as
// CosyVoice's does, since its rules would break the markers.
func HasMarkup(text string) bool { return strings.Contains(text, "<|") && strings.Contains(text, "|>") }

// Normalize applies the rule-based part of CosyVoice's text frontend: for Chinese, numbers read
// in Chinese, line breaks and the blanks between non-ASCII characters dropped, ² and ³ read,
// "." and " - " turned into Chinese punctuation, brackets removed and a trailing comma made a
// full stop; for other text, numbers spelled out in English words. The reference first runs a
// weighted-FST normalizer (wetext) over dates, money, units and the like; that grammar is not
// reproduced here.
func Normalize(text string) (string, Lang) {
	text = strings.TrimSpace(text)
	lang := DetectLang(text)
	if text == "" || HasMarkup(text) {
		return text, lang
	}
	if lang == Chinese {
		text = numbersZH(text)
		text = strings.ReplaceAll(text, "\n", "")
		text = dropBlanks(text)
		text = strings.NewReplacer("²", "平方", "³", "立方").Replace(text)
		text = strings.ReplaceAll(text, ".", "。")
		text = strings.ReplaceAll(text, " - ", "，")
		text = strings.NewReplacer("（", "", "）", "", "【", "", "】", "", "`", "", "——", " ").Replace(text)
		text = trailingComma.ReplaceAllString(text, "。")
		return text, lang
	}
	return numbersEN(text), lang
}

var trailingComma = regexp.MustCompile(`[，,、]+$`)

// dropBlanks removes each space that does not sit between two ASCII characters other than
// spaces: Chinese is written without them, and the LM reads them as pauses.
func dropBlanks(text string) string {
	rs := []rune(text)
	var b strings.Builder
	for i, r := range rs {
		if r == ' ' {
			ok := i > 0 && i+1 < len(rs) && rs[i-1] < utf8.RuneSelf && rs[i-1] != ' ' && rs[i+1] < utf8.RuneSelf && rs[i+1] != ' '
			if !ok {
				continue
			}
		}
		b.WriteRune(r)
	}
	return b.String()
}

// number is an ASCII number: digits (or groups of three after commas: 1,000,000), optionally a
// decimal part, optionally a percent sign.
var number = regexp.MustCompile(`(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?%?`)

// numbersEN spells out numbers: 1234 → "one thousand, two hundred and thirty-four" (in the style
// of Python's inflect, which the reference uses), 3.5 → "three point five", 50% → "fifty
// percent"; 1st, 2nd, 3rd, 4th → "first", "second"…
func numbersEN(text string) string {
	idx := number.FindAllStringIndex(text, -1)
	if idx == nil {
		return text
	}
	var b strings.Builder
	last := 0
	for _, m := range idx {
		s, e := m[0], m[1]
		b.WriteString(text[last:s])
		tok := text[s:e]
		pct := strings.HasSuffix(tok, "%")
		tok = strings.TrimSuffix(tok, "%")
		whole, frac, _ := strings.Cut(tok, ".")
		whole = strings.ReplaceAll(whole, ",", "")
		suffix := strings.ToLower(text[e:min(e+2, len(text))])
		ordinal := frac == "" && !pct && len(suffix) == 2 && (suffix == "st" || suffix == "nd" || suffix == "rd" || suffix == "th") &&
			(e+2 == len(text) || !isLetter(rune(text[e+2])))
		switch {
		case ordinal:
			b.WriteString(ordinalEN(cardinalEN(whole)))
			e += 2
		default:
			b.WriteString(cardinalEN(whole))
			if frac != "" {
				b.WriteString(" point")
				for _, d := range frac {
					b.WriteString(" " + onesEN[d-'0'])
				}
			}
			if pct {
				b.WriteString(" percent")
			}
		}
		last = e
	}
	b.WriteString(text[last:])
	return b.String()
}

var onesEN = []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
	"eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"}
var tensEN = []string{"", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"}
var scalesEN = []string{"", " thousand", " million", " billion", " trillion"}

// cardinalEN reads a string of digits; past the trillions, and for a leading zero, digit by digit.
func cardinalEN(digits string) string {
	if len(digits) > 15 || (len(digits) > 1 && digits[0] == '0') {
		words := make([]string, len(digits))
		for i, d := range digits {
			words[i] = onesEN[d-'0']
		}
		return strings.Join(words, " ")
	}
	var groups []int
	for end := len(digits); end > 0; end -= 3 {
		g := 0
		for _, d := range digits[max(0, end-3):end] {
			g = g*10 + int(d-'0')
		}
		groups = append(groups, g)
	}
	var parts []string
	var lastG int
	for i := len(groups) - 1; i >= 0; i-- {
		if groups[i] == 0 {
			continue
		}
		parts = append(parts, under1000EN(groups[i])+scalesEN[i])
		lastG = groups[i]
	}
	if len(parts) == 0 {
		return "zero"
	}
	if len(parts) > 1 && lastG < 100 && groups[0] == lastG {
		// 1001 → "one thousand and one"
		return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
	}
	return strings.Join(parts, ", ")
}

func under1000EN(n int) string {
	var s string
	if n >= 100 {
		s = onesEN[n/100] + " hundred"
		n %= 100
		if n == 0 {
			return s
		}
		s += " and "
	}
	switch {
	case n < 20:
		s += onesEN[n]
	case n%10 == 0:
		s += tensEN[n/10]
	default:
		s += tensEN[n/10] + "-" + onesEN[n%10]
	}
	return s
}

// ordinalEN turns a cardinal's last word into an ordinal: "twenty-one" → "twenty-first".
func ordinalEN(cardinal string) string {
	cut := strings.LastIndexAny(cardinal, " -") + 1
	head, w := cardinal[:cut], cardinal[cut:]
	irregular := map[string]string{"one": "first", "two": "second", "three": "third", "five": "fifth",
		"eight": "eighth", "nine": "ninth", "twelve": "twelfth"}
	switch {
	case irregular[w] != "":
		w = irregular[w]
	case strings.HasSuffix(w, "y"):
		w = strings.TrimSuffix(w, "y") + "ieth"
	default:
		w += "th"
	}
	return head + w
}

var digitsZH = []rune("零一二三四五六七八九")

// numbersZH reads numbers in Chinese: 2024 → 二千零二十四, 3.14 → 三点一四, 50% → 百分之五十.
func numbersZH(text string) string {
	return number.ReplaceAllStringFunc(text, func(tok string) string {
		pct := strings.HasSuffix(tok, "%")
		tok = strings.TrimSuffix(tok, "%")
		whole, frac, _ := strings.Cut(tok, ".")
		s := cardinalZH(strings.ReplaceAll(whole, ",", ""))
		if frac != "" {
			s += "点"
			for _, d := range frac {
				s += string(digitsZH[d-'0'])
			}
		}
		if pct {
			s = "百分之" + s
		}
		return s
	})
}

// cardinalZH reads a string of digits in Chinese; past 10^16, and for a leading zero, digit by
// digit.
func cardinalZH(digits string) string {
	if len(digits) > 16 || (len(digits) > 1 && digits[0] == '0') {
		var b strings.Builder
		for _, d := range digits {
			b.WriteRune(digitsZH[d-'0'])
		}
		return b.String()
	}
	units := []string{"", "十", "百", "千"}
	bigs := []string{"", "万", "亿", "万亿"}
	var groups []string
	for end := len(digits); end > 0; end -= 4 {
		groups = append(groups, digits[max(0, end-4):end])
	}
	var b strings.Builder
	zero := false // a zero is pending between non-zero digits
	for gi := len(groups) - 1; gi >= 0; gi-- {
		g := groups[gi]
		wrote := false
		for i, d := range g {
			pos := len(g) - 1 - i
			if d == '0' {
				zero = b.Len() > 0
				continue
			}
			if zero {
				b.WriteRune('零')
				zero = false
			}
			b.WriteRune(digitsZH[d-'0'])
			b.WriteString(units[pos])
			wrote = true
		}
		if wrote {
			b.WriteString(bigs[gi])
		}
	}
	s := b.String()
	if s == "" {
		return "零"
	}
	// 10–19 are read 十, 十一 …, not 一十.
	if strings.HasPrefix(s, "一十") {
		s = strings.TrimPrefix(s, "一")
	}
	return s
}

// IsOnlyPunctuation reports whether text holds nothing but punctuation and symbols (or nothing):
// such a segment has nothing to speak.
func IsOnlyPunctuation(text string) bool {
	for _, r := range text {
		if !unicode.IsPunct(r) && !unicode.IsSymbol(r) {
			return false
		}
	}
	return true
}
