package text

import (
	"unicode"
	"unicode/utf8"
)

// splitWords cuts text into the pieces Qwen2's pre-tokenizer makes before BPE, the matches of
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// taken left to right, the first alternative that matches winning. It is written out by hand
// because Go's regexp has no lookahead, which the \s+(?!\S) rule needs.
func splitWords(text string, emit func(string)) {
	for i := 0; i < len(text); {
		n := matchAt(text[i:])
		emit(text[i : i+n])
		i += n
	}
}

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isNL(r rune) bool     { return r == '\r' || r == '\n' }

// matchAt returns the length in bytes of the match at the start of s (never 0 for a non-empty s:
// every character is a letter, a number, white space or something else, and each has a rule).
func matchAt(s string) int {
	r, size := utf8.DecodeRuneInString(s)
	// 's 't 're 've 'm 'll 'd, in any case.
	if r == '\'' && len(s) > 1 {
		switch lower(s[1]) {
		case 's', 't', 'm', 'd':
			return 2
		case 'r', 'v', 'l':
			if len(s) > 2 {
				if two := string([]byte{lower(s[1]), lower(s[2])}); two == "re" || two == "ve" || two == "ll" {
					return 3
				}
			}
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if n := letters(s); n > 0 {
		return n
	}
	if !isLetter(r) && !isNumber(r) && !isNL(r) {
		if n := letters(s[size:]); n > 0 {
			return size + n
		}
	}
	// \p{N}
	if isNumber(r) {
		return size
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := 0
	if r == ' ' {
		j = 1
	}
	k := j
	for k < len(s) {
		c, n := utf8.DecodeRuneInString(s[k:])
		if isSpace(c) || isLetter(c) || isNumber(c) {
			break
		}
		k += n
	}
	if k > j {
		for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
			k++
		}
		return k
	}
	// The run of white space that starts here.
	end, lastNL := 0, -1
	for end < len(s) {
		c, n := utf8.DecodeRuneInString(s[end:])
		if !isSpace(c) {
			break
		}
		if isNL(c) {
			lastNL = end
		}
		end += n
	}
	// \s*[\r\n]+: backtracking leaves the run up to and including its last line break.
	if lastNL >= 0 {
		return lastNL + 1
	}
	// \s+(?!\S): the whole run at the end of the text, else all of it but its last character.
	if end == len(s) {
		return end
	}
	_, last := utf8.DecodeLastRuneInString(s[:end])
	if end-last > 0 {
		return end - last
	}
	// \s+
	return end
}

// letters is the length of the run of letters at the start of s.
func letters(s string) int {
	n := 0
	for n < len(s) {
		c, size := utf8.DecodeRuneInString(s[n:])
		if !isLetter(c) {
			break
		}
		n += size
	}
	return n
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}
