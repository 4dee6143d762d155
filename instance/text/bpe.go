package text

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/text/unicode/norm"
)

// BPE is a byte-level BPE tokenizer of the GPT-2 family as Qwen2 uses it: text is cut at added
// (special) tokens, each piece between them NFC-normalized and split by the pre-tokenizer
// (splitWords), each word's UTF-8 bytes mapped to printable characters and merged by the ranks
// of merges.txt, and the merged symbols looked up in vocab.json.
type BPE struct {
	vocab map[string]int64
	// merges maps a pair of symbol ids to its rank and the id of the merged symbol.
	merges map[[2]int64]merge
	// byteID is the id of each byte's symbol.
	byteID [256]int64
	added  []AddedToken
	// addedFirst indexes added tokens by their first byte, longest first.
	addedFirst map[byte][]AddedToken

	mu    sync.Mutex
	cache map[string][]int64
}

type merge struct {
	rank int
	id   int64
}

// AddedToken is a token matched in the text as a whole before any other rule, as Hugging Face's
// tokenizers treat special tokens: "<|endofprompt|>" or "[laughter]".
type AddedToken struct {
	Content string
	ID      int64
}

// cacheWords bounds the per-word cache, which holds the common words of a workload.
const cacheWords = 1 << 16

// LoadBPE reads vocab.json and merges.txt. added are the tokens already numbered (those of
// tokenizer_config.json's added_tokens_decoder); extra are appended after the highest id in
// order, skipping any already present, as Hugging Face's add_special_tokens numbers them.
func LoadBPE(vocabPath, mergesPath string, added []AddedToken, extra []string) (*BPE, error) {
	data, err := os.ReadFile(vocabPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer vocabulary: %w", err)
	}
	t := &BPE{merges: map[[2]int64]merge{}, cache: map[string][]int64{}}
	if err := json.Unmarshal(data, &t.vocab); err != nil {
		return nil, fmt.Errorf("tokenizer vocabulary %s: %w", vocabPath, err)
	}
	b2u := bytesToUnicode()
	for b := range 256 {
		id, ok := t.vocab[string(b2u[b])]
		if !ok {
			return nil, fmt.Errorf("tokenizer vocabulary %s: no symbol for byte %#x", vocabPath, b)
		}
		t.byteID[b] = id
	}
	f, err := os.Open(mergesPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer merges: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	line, rank := 0, 0
	for sc.Scan() {
		line++
		s := strings.TrimRight(sc.Text(), "\r")
		if s == "" || (line == 1 && strings.HasPrefix(s, "#version")) {
			continue
		}
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return nil, fmt.Errorf("tokenizer merges %s:%d: %q is not two symbols", mergesPath, line, s)
		}
		ia, oka := t.vocab[a]
		ib, okb := t.vocab[b]
		im, okm := t.vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("tokenizer merges %s:%d: %q names symbols the vocabulary lacks", mergesPath, line, s)
		}
		if _, dup := t.merges[[2]int64{ia, ib}]; !dup {
			t.merges[[2]int64{ia, ib}] = merge{rank: rank, id: im}
		}
		rank++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokenizer merges %s: %w", mergesPath, err)
	}
	next := int64(len(t.vocab))
	have := map[string]bool{}
	for _, a := range added {
		t.added = append(t.added, a)
		have[a.Content] = true
		next = max(next, a.ID+1)
	}
	for _, s := range extra {
		if s == "" || have[s] {
			continue
		}
		if id, ok := t.vocab[s]; ok {
			t.added = append(t.added, AddedToken{Content: s, ID: id})
		} else {
			t.added = append(t.added, AddedToken{Content: s, ID: next})
			next++
		}
		have[s] = true
	}
	t.addedFirst = map[byte][]AddedToken{}
	for _, a := range t.added {
		t.addedFirst[a.Content[0]] = append(t.addedFirst[a.Content[0]], a)
	}
	for _, list := range t.addedFirst {
		// Longest first: at a position the longest added token wins.
		for i := 1; i < len(list); i++ {
			for j := i; j > 0 && len(list[j].Content) > len(list[j-1].Content); j-- {
				list[j], list[j-1] = list[j-1], list[j]
			}
		}
	}
	return t, nil
}

// Size is the number of ids: the vocabulary and the added tokens.
func (t *BPE) Size() int {
	n := int64(len(t.vocab))
	for _, a := range t.added {
		n = max(n, a.ID+1)
	}
	return int(n)
}

// ID returns the id of an added token or a vocabulary symbol.
func (t *BPE) ID(token string) (int64, bool) {
	for _, a := range t.added {
		if a.Content == token {
			return a.ID, true
		}
	}
	id, ok := t.vocab[token]
	return id, ok
}

// Encode returns the ids of text.
func (t *BPE) Encode(text string) []int64 {
	var ids []int64
	start := 0
	for i := 0; i < len(text); {
		if a, ok := t.addedAt(text[i:]); ok {
			ids = t.encodePlain(ids, text[start:i])
			ids = append(ids, a.ID)
			i += len(a.Content)
			start = i
			continue
		}
		i++
	}
	return t.encodePlain(ids, text[start:])
}

func (t *BPE) addedAt(s string) (AddedToken, bool) {
	for _, a := range t.addedFirst[s[0]] {
		if strings.HasPrefix(s, a.Content) {
			return a, true
		}
	}
	return AddedToken{}, false
}

// encodePlain appends the ids of text that holds no added token.
func (t *BPE) encodePlain(ids []int64, text string) []int64 {
	if text == "" {
		return ids
	}
	text = norm.NFC.String(text)
	splitWords(text, func(w string) { ids = append(ids, t.word(w)...) })
	return ids
}

// word returns the ids of one pre-tokenized word.
func (t *BPE) word(w string) []int64 {
	t.mu.Lock()
	got, ok := t.cache[w]
	t.mu.Unlock()
	if ok {
		return got
	}
	syms := make([]int64, len(w))
	for i := 0; i < len(w); i++ {
		syms[i] = t.byteID[w[i]]
	}
	// Merge the pair of lowest rank, every occurrence left to right, until no pair merges.
	for len(syms) > 1 {
		best := merge{rank: -1}
		for i := 0; i+1 < len(syms); i++ {
			if m, ok := t.merges[[2]int64{syms[i], syms[i+1]}]; ok && (best.rank < 0 || m.rank < best.rank) {
				best = m
			}
		}
		if best.rank < 0 {
			break
		}
		out := syms[:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) {
				if m, ok := t.merges[[2]int64{syms[i], syms[i+1]}]; ok && m.rank == best.rank {
					out = append(out, m.id)
					i++
					continue
				}
			}
			out = append(out, syms[i])
		}
		syms = out
	}
	t.mu.Lock()
	if len(t.cache) >= cacheWords {
		clear(t.cache)
	}
	t.cache[w] = syms
	t.mu.Unlock()
	return syms
}

// bytesToUnicode is GPT-2's map of bytes to printable characters: printable Latin-1 bytes stand
// for themselves, the others for characters from U+0100 on, in byte order.
func bytesToUnicode() [256]rune {
	var out [256]rune
	n := 0
	for b := range 256 {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			out[b] = rune(b)
		} else {
			out[b] = rune(256 + n)
			n++
		}
	}
	return out
}
