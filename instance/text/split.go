package text

import "strings"

// SplitSpec sets how long text is cut into segments, in the units count returns (tokens; for
// Chinese, characters): a segment grows sentence by sentence while it is no longer than MaxN,
// or while it is still no longer than MinN; a last segment shorter than MergeLen joins the one
// before it. CosyVoice's frontend uses 80, 60 and 20.
type SplitSpec struct {
	MaxN, MinN, MergeLen int
	CommaSplit           bool
}

// DefaultSplit is CosyVoice's.
var DefaultSplit = SplitSpec{MaxN: 80, MinN: 60, MergeLen: 20}

// Split cuts text into sentences at sentence punctuation (a closing quote stays with its
// sentence) and groups them into segments by spec. Text that does not end in punctuation gets a
// full stop. A sentence longer than MaxN stays whole. Segments holding only punctuation are
// dropped.
func Split(text string, lang Lang, count func(string) int, spec SplitSpec) []string {
	if text == "" {
		return nil
	}
	punct := ".?!;:"
	if lang == Chinese {
		punct = "。？！；：、.?!;"
		count = func(s string) int { return len([]rune(s)) }
	}
	if spec.CommaSplit {
		punct += "，,"
	}
	rs := []rune(text)
	if !strings.ContainsRune(punct, rs[len(rs)-1]) {
		if lang == Chinese {
			rs = append(rs, '。')
		} else {
			rs = append(rs, '.')
		}
	}
	var sentences []string
	st := 0
	for i := 0; i < len(rs); i++ {
		if !strings.ContainsRune(punct, rs[i]) {
			continue
		}
		end := i + 1
		if end < len(rs) && (rs[end] == '"' || rs[end] == '”') {
			end++
		}
		if i > st {
			sentences = append(sentences, string(rs[st:end]))
		} else if end > i+1 && len(sentences) > 0 {
			sentences[len(sentences)-1] += string(rs[i+1 : end])
		}
		st = end
		i = end - 1
	}
	var out []string
	cur := ""
	for _, s := range sentences {
		if count(cur+s) > spec.MaxN && count(cur) > spec.MinN {
			out = append(out, cur)
			cur = ""
		}
		cur += s
	}
	if cur != "" {
		if count(cur) < spec.MergeLen && len(out) > 0 {
			out[len(out)-1] += cur
		} else {
			out = append(out, cur)
		}
	}
	kept := out[:0]
	for _, s := range out {
		if !IsOnlyPunctuation(s) {
			kept = append(kept, s)
		}
	}
	return kept
}
