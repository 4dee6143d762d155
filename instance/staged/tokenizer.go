package staged

import "unicode/utf8"

// Tokenize builds the LM prompt for text: [bos, bytes+offset..., sos] (the "bytes" tokenizer).
func (m *Manifest) Tokenize(text string) []int64 {
	ids := make([]int64, 0, len(text)+2)
	ids = append(ids, m.Tokenizer.BOS)
	for i := 0; i < len(text); i++ {
		ids = append(ids, int64(text[i])+m.Tokenizer.Offset)
	}
	return append(ids, m.LM.SOS)
}

// TokenBounds returns the minimum and maximum number of speech tokens for text.
func (m *Manifest) TokenBounds(text string) (minTok, maxTok int) {
	chars := float64(utf8.RuneCountInString(text))
	minTok = int(chars * m.LM.MinTokensPerChar)
	maxTok = int(chars*m.LM.MaxTokensPerChar + 0.5)
	maxTok = max(maxTok, 1)
	maxTok = min(maxTok, m.LM.MaxTokens)
	minTok = min(minTok, maxTok)
	return minTok, maxTok
}
