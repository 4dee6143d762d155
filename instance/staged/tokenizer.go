package staged

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/voxmux/voxmux/instance/text"
)

// textTokenizer turns text into the tokenizer's own ids (before tokenizer.offset).
type textTokenizer interface {
	Encode(string) []int64
}

// byteTokenizer makes a token per UTF-8 byte (tokenizer.type: bytes).
type byteTokenizer struct{}

func (byteTokenizer) Encode(s string) []int64 {
	ids := make([]int64, len(s))
	for i := 0; i < len(s); i++ {
		ids[i] = int64(s[i])
	}
	return ids
}

// loadTokenizer loads what tokenizer.type names.
func (m *Manifest) loadTokenizer() error {
	if m.Tokenizer.Type != "qwen2" {
		m.tok = byteTokenizer{}
		return nil
	}
	var added []text.AddedToken
	if m.Tokenizer.Config != "" {
		var err error
		if added, err = text.LoadAddedTokens(m.Path(m.Tokenizer.Config)); err != nil {
			return fmt.Errorf("tokenizer.config: %w", err)
		}
	}
	tok, err := text.LoadBPE(m.Path(m.Tokenizer.Vocab), m.Path(m.Tokenizer.Merges), added, text.SpecialTokenSets[m.Tokenizer.SpecialTokens])
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	m.tok = tok
	return nil
}

// Tokenize builds the LM prompt for text without a voice prompt: [bos, ids+offset..., sos].
func (m *Manifest) Tokenize(s string) []int64 {
	p, _ := m.Prompt(nil, s)
	return p
}

// Prompt builds the LM prompt for segment text s in voice v (nil: no voice prompt):
// [bos, voice text ids..., segment text ids..., sos, voice speech tokens + speech_token_offset...],
// text ids with tokenizer.offset added. With lm.endofprompt, lm.default_prompt_text goes before
// the segment's text when neither text holds that id. segTokens counts the segment's own text
// ids, which the speech-token bounds count (CosyVoice: the text minus the prompt's text).
func (m *Manifest) Prompt(v *Voice, s string) (prompt []int64, segTokens int) {
	seg := m.textIDs(s)
	var voiceText, voiceSpeech []int64
	if v != nil {
		voiceText, voiceSpeech = v.textIDs, v.SpeechTokens
	}
	var extra []int64
	if e := m.LM.EndOfPrompt; e > 0 && !slices.Contains(voiceText, e) && !slices.Contains(seg, e) {
		extra = m.textIDs(m.LM.DefaultPromptText)
	}
	out := make([]int64, 0, 2+len(voiceText)+len(extra)+len(seg)+len(voiceSpeech))
	out = append(out, m.Tokenizer.BOS)
	out = append(append(append(out, voiceText...), extra...), seg...)
	out = append(out, m.LM.SOS)
	for _, t := range voiceSpeech {
		out = append(out, t+m.LM.SpeechTokenOffset)
	}
	return out, len(seg)
}

// checkEndOfPrompt refuses an lm.default_prompt_text that does not supply lm.endofprompt.
func (m *Manifest) checkEndOfPrompt() error {
	if e := m.LM.EndOfPrompt; e > 0 && !slices.Contains(m.textIDs(m.LM.DefaultPromptText), e) {
		return fmt.Errorf("lm.default_prompt_text: %q does not hold lm.endofprompt (%d) once tokenized", m.LM.DefaultPromptText, e)
	}
	return nil
}

// textIDs are the LM input ids of text s: the tokenizer's ids plus tokenizer.offset.
func (m *Manifest) textIDs(s string) []int64 {
	ids := m.tok.Encode(s)
	for i := range ids {
		ids[i] += m.Tokenizer.Offset
	}
	return ids
}

// Segments is the text frontend (text:): text normalized and cut into the segments that are
// spoken one after another, in order.
func (m *Manifest) Segments(s string) []string {
	lang := text.DetectLang(s)
	if m.Text.Normalize {
		s, lang = text.Normalize(s)
	}
	sp := m.Text.Split
	if sp == nil || text.HasMarkup(s) {
		return []string{s}
	}
	count := func(s string) int { return len(m.tok.Encode(s)) }
	segs := text.Split(s, lang, count, text.SplitSpec{MaxN: sp.MaxTokens, MinN: sp.MinTokens, MergeLen: sp.MergeTokens})
	if len(segs) == 0 {
		return []string{s}
	}
	return segs
}

// TokenBounds returns the minimum and maximum number of speech tokens for text whose prompt
// holds textTokens tokens of text (bos and sos not counted).
func (m *Manifest) TokenBounds(s string, textTokens int) (minTok, maxTok int) {
	return m.tokenBounds(s, textTokens, m.LM.MinTokensPerTextToken)
}

// tokenBounds is TokenBounds with minPerTextToken in place of lm.min_tokens_per_text_token.
func (m *Manifest) tokenBounds(s string, textTokens int, minPerTextToken float64) (minTok, maxTok int) {
	n, lo, hi := float64(utf8.RuneCountInString(s)), m.LM.MinTokensPerChar, m.LM.MaxTokensPerChar
	if m.LM.MaxTokensPerTextToken > 0 {
		n, lo, hi = float64(textTokens), minPerTextToken, m.LM.MaxTokensPerTextToken
	}
	minTok = int(n * lo)
	maxTok = int(n*hi + 0.5)
	maxTok = max(maxTok, 1)
	maxTok = min(maxTok, m.LM.MaxTokens)
	minTok = min(minTok, maxTok)
	return minTok, maxTok
}
