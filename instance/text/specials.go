package text

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// SpecialTokenSets are the tokens a model family adds to its tokenizer in code rather than in its
// tokenizer files, by name (the manifest's tokenizer.special_tokens), numbered in this order.
var SpecialTokenSets = map[string][]string{"cosyvoice3": cosyVoice3Specials()}

// cosyVoice3Specials are CosyVoice3's: the chat markers and <|endofprompt|>, the paralinguistic
// tags, <|endofsystem|>, and the phoneme tags (CMU ARPAbet with stress, then pinyin finals with
// tones) that let a request spell a word's pronunciation.
func cosyVoice3Specials() []string {
	out := []string{"<|im_start|>", "<|im_end|>", "<|endofprompt|>",
		"[breath]", "<strong>", "</strong>", "[noise]", "[laughter]", "[cough]", "[clucking]", "[accent]",
		"[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]", "[vocalized-noise]",
		"[lipsmack]", "[mn]", "<|endofsystem|>"}
	// ARPAbet: vowels carry stress 0-2 after the bare phone.
	for _, p := range []string{"AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G", "HH",
		"IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH", "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH"} {
		out = append(out, "["+p+"]")
		if slices.Contains([]string{"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW"}, p) {
			for s := range 3 {
				out = append(out, "["+p+strconv.Itoa(s)+"]")
			}
		}
	}
	for _, p := range pinyinTags {
		out = append(out, "["+p+"]")
	}
	return out
}

// pinyinTags are CosyVoice3's pinyin initials and finals, in its order.
var pinyinTags = []string{"a", "ai", "an", "ang", "ao", "b", "c", "ch", "d", "e", "ei", "en", "eng", "f",
	"g", "h", "i", "ian", "in", "ing", "iu", "ià", "iàn", "iàng", "iào", "iá", "ián",
	"iáng", "iáo", "iè", "ié", "iòng", "ióng", "iù", "iú", "iā", "iān", "iāng", "iāo",
	"iē", "iě", "iōng", "iū", "iǎ", "iǎn", "iǎng", "iǎo", "iǒng", "iǔ", "j", "k", "l",
	"m", "n", "o", "ong", "ou", "p", "q", "r", "s", "sh", "t", "u", "uang", "ue",
	"un", "uo", "uà", "uài", "uàn", "uàng", "uá", "uái", "uán", "uáng", "uè", "ué", "uì",
	"uí", "uò", "uó", "uā", "uāi", "uān", "uāng", "uē", "uě", "uī", "uō", "uǎ", "uǎi",
	"uǎn", "uǎng", "uǐ", "uǒ", "vè", "w", "x", "y", "z", "zh", "à", "ài", "àn", "àng",
	"ào", "á", "ái", "án", "áng", "áo", "è", "èi", "èn", "èng", "èr", "é", "éi", "én",
	"éng", "ér", "ì", "ìn", "ìng", "í", "ín", "íng", "ò", "òng", "òu", "ó", "óng", "óu",
	"ù", "ùn", "ú", "ún", "ā", "āi", "ān", "āng", "āo", "ē", "ēi", "ēn", "ēng", "ě",
	"ěi", "ěn", "ěng", "ěr", "ī", "īn", "īng", "ō", "ōng", "ōu", "ū", "ūn", "ǎ", "ǎi",
	"ǎn", "ǎng", "ǎo", "ǐ", "ǐn", "ǐng", "ǒ", "ǒng", "ǒu", "ǔ", "ǔn", "ǘ", "ǚ", "ǜ"}

// LoadAddedTokens reads the added tokens of a Hugging Face tokenizer_config.json
// (added_tokens_decoder: id → content), in id order.
func LoadAddedTokens(path string) ([]AddedToken, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer config: %w", err)
	}
	var cfg struct {
		Added map[string]struct {
			Content string `json:"content"`
		} `json:"added_tokens_decoder"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("tokenizer config %s: %w", path, err)
	}
	var out []AddedToken
	for k, v := range cfg.Added {
		id, err := strconv.ParseInt(k, 10, 64)
		if err != nil || v.Content == "" {
			return nil, fmt.Errorf("tokenizer config %s: added token %q: not an id and a content", path, k)
		}
		out = append(out, AddedToken{Content: v.Content, ID: id})
	}
	slices.SortFunc(out, func(a, b AddedToken) int { return int(a.ID - b.ID) })
	return out, nil
}
