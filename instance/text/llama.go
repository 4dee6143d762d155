package text

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Llama is a sentencepiece-style BPE tokenizer read from a Hugging Face tokenizer.json, as Llama
// and MiniCPM ship theirs: the text is cut at added tokens; each piece between them gets "▁" for
// its spaces (and one in front, as Prefix says) and is merged as a whole by merge rank; a
// character missing from the vocabulary falls back to the tokens of its UTF-8 bytes (<0xNN>).
type Llama struct {
	// Prefix is how a piece gets its leading "▁". LoadLlama sets it as transformers'
	// LlamaTokenizerFast.from_pretrained does for the file's folder.
	Prefix LlamaPrefix
	// SplitCJK replaces each token that is, with its "▁" removed, a vocabulary entry of two or more
	// characters all in U+4E00..U+9FFF by the ids of its single characters (the unk id for one
	// the vocabulary lacks), the "▁" dropped: VoxCPM's mask_multichar_chinese_tokens.
	SplitCJK bool

	vocab  map[string]int64
	merges map[[2]int64]merge
	// byteID is the id of each byte's <0xNN> token, -1 where the vocabulary has none.
	byteID       [256]int64
	byteFallback bool
	unk          int64 // -1 without an unk token
	fuseUnk      bool
	ignoreMerges bool

	added      map[string]llamaAdded
	addedFirst map[byte][]llamaAdded // by first byte, longest first

	// The file's pipeline, used under PrefixFile.
	normalizers []func(string) string
	meta        *llamaMetaspace

	// cjk maps a token id to the ids SplitCJK puts in its place.
	cjk map[int64][]int64
}

// LlamaPrefix is how the "▁" standing for a space is put in front of a piece of text. Readers
// of one tokenizer.json differ here: the tokenizers library (and transformers 4) follow the file,
// while transformers 5's LlamaTokenizerFast drops the file's normalizer and pre-tokenizer for a
// Metaspace(replacement="▁", split=False) of its own.
type LlamaPrefix int

const (
	// PrefixFile follows the file: a Prepend("▁") normalizer puts one in front of every non-empty
	// piece, a Metaspace pre-tokenizer as its prepend_scheme says.
	PrefixFile LlamaPrefix = iota
	// PrefixAlways puts one in front of every piece that does not start with a space:
	// transformers 5 with legacy true (prepend_scheme "always").
	PrefixAlways
	// PrefixFirst does so only for the piece the text starts with: transformers 5 with legacy
	// false, its default (prepend_scheme "first").
	PrefixFirst
	// PrefixNever puts none: add_prefix_space false.
	PrefixNever
)

type llamaAdded struct {
	content        string
	id             int64
	lstrip, rstrip bool
}

// llamaMetaspace is the Metaspace pre-tokenizer: spaces become the replacement, which is put in
// front as scheme says; split cuts before each replacement.
type llamaMetaspace struct {
	rep    string
	scheme LlamaPrefix // PrefixAlways, PrefixFirst or PrefixNever
	split  bool
}

// LoadLlama reads a tokenizer.json whose model is a BPE (merges as "a b" strings or ["a", "b"]
// pairs) with a normalizer of Prepend and Replace steps and/or a Metaspace pre-tokenizer, the
// forms Llama-style files use; other forms are refused. Prefix is set as transformers 5's
// LlamaTokenizerFast sets it from the tokenizer_config.json beside the file (legacy true:
// PrefixAlways; legacy false or absent: PrefixFirst; add_prefix_space false: PrefixNever).
func LoadLlama(path string) (*Llama, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var f struct {
		AddedTokens []struct {
			ID         int64  `json:"id"`
			Content    string `json:"content"`
			SingleWord bool   `json:"single_word"`
			Lstrip     bool   `json:"lstrip"`
			Rstrip     bool   `json:"rstrip"`
			Normalized bool   `json:"normalized"`
		} `json:"added_tokens"`
		Normalizer   json.RawMessage `json:"normalizer"`
		PreTokenizer json.RawMessage `json:"pre_tokenizer"`
		Model        struct {
			Type         string            `json:"type"`
			Dropout      *float64          `json:"dropout"`
			UnkToken     *string           `json:"unk_token"`
			Prefix       *string           `json:"continuing_subword_prefix"`
			Suffix       *string           `json:"end_of_word_suffix"`
			FuseUnk      bool              `json:"fuse_unk"`
			ByteFallback bool              `json:"byte_fallback"`
			IgnoreMerges bool              `json:"ignore_merges"`
			Vocab        map[string]int64  `json:"vocab"`
			Merges       []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	m := f.Model
	unsupported := func(what string, args ...any) error {
		return fmt.Errorf("tokenizer %s: %s %w", path, fmt.Sprintf(what, args...), errLlamaUnsupported)
	}
	switch {
	case m.Type != "BPE":
		return nil, unsupported("model type %q (only BPE)", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, unsupported("BPE dropout")
	case m.Prefix != nil && *m.Prefix != "", m.Suffix != nil && *m.Suffix != "":
		return nil, unsupported("a continuing_subword_prefix or end_of_word_suffix")
	case len(m.Vocab) == 0:
		return nil, fmt.Errorf("tokenizer %s: empty vocabulary", path)
	}
	t := &Llama{
		vocab:        m.Vocab,
		merges:       make(map[[2]int64]merge, len(m.Merges)),
		byteFallback: m.ByteFallback,
		unk:          -1,
		fuseUnk:      m.FuseUnk,
		ignoreMerges: m.IgnoreMerges,
		added:        map[string]llamaAdded{},
		addedFirst:   map[byte][]llamaAdded{},
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("tokenizer %s: unk token %q is not in the vocabulary", path, *m.UnkToken)
		}
		t.unk = id
	}
	for b := range 256 {
		t.byteID[b] = -1
		if id, ok := m.Vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			t.byteID[b] = id
		}
	}
	for i, raw := range m.Merges {
		a, b, err := parseLlamaMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("tokenizer %s: merge %d: %w", path, i, err)
		}
		ia, oka := m.Vocab[a]
		ib, okb := m.Vocab[b]
		im, okm := m.Vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("tokenizer %s: merge %d (%q %q) names tokens the vocabulary lacks", path, i, a, b)
		}
		// A repeated pair takes its last rank, as the tokenizers library's map of merges does.
		t.merges[[2]int64{ia, ib}] = merge{rank: i, id: im}
	}
	for _, a := range f.AddedTokens {
		switch {
		case a.Content == "":
			return nil, fmt.Errorf("tokenizer %s: added token %d is empty", path, a.ID)
		case a.Normalized:
			return nil, unsupported("added token %q with normalized true", a.Content)
		case a.SingleWord:
			return nil, unsupported("added token %q with single_word true", a.Content)
		}
		at := llamaAdded{content: a.Content, id: a.ID, lstrip: a.Lstrip, rstrip: a.Rstrip}
		t.added[a.Content] = at
		t.addedFirst[a.Content[0]] = append(t.addedFirst[a.Content[0]], at)
	}
	for _, list := range t.addedFirst {
		// Longest first: at a position the longest added token wins (leftmost-longest).
		for i := 1; i < len(list); i++ {
			for j := i; j > 0 && len(list[j].content) > len(list[j-1].content); j-- {
				list[j], list[j-1] = list[j-1], list[j]
			}
		}
	}
	if t.normalizers, err = parseLlamaNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("tokenizer %s: normalizer: %w", path, err)
	}
	if t.meta, err = parseLlamaMetaspace(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("tokenizer %s: pre_tokenizer: %w", path, err)
	}
	if t.Prefix, err = transformersPrefix(filepath.Join(filepath.Dir(path), "tokenizer_config.json")); err != nil {
		return nil, err
	}
	t.cjk = t.cjkSplits()
	return t, nil
}

var errLlamaUnsupported = errors.New("is not supported")

func parseLlamaMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		parts := strings.Split(s, " ")
		if len(parts) != 2 {
			return "", "", fmt.Errorf("%q is not two tokens", s)
		}
		return parts[0], parts[1], nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("%s is neither \"a b\" nor [\"a\", \"b\"]", raw)
	}
	return pair[0], pair[1], nil
}

// parseLlamaNormalizer returns the steps of a normalizer made of Prepend and Replace (of a string).
func parseLlamaNormalizer(raw json.RawMessage) ([]func(string) string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Prepend     string            `json:"prepend"`
		Pattern     struct {
			String *string `json:"String"`
		} `json:"pattern"`
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, err
	}
	switch n.Type {
	case "Sequence":
		var steps []func(string) string
		for _, sub := range n.Normalizers {
			s, err := parseLlamaNormalizer(sub)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "Prepend":
		p := n.Prepend
		return []func(string) string{func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		}}, nil
	case "Replace":
		if n.Pattern.String == nil {
			return nil, fmt.Errorf("Replace of a regex %w", errLlamaUnsupported)
		}
		from, to := *n.Pattern.String, n.Content
		return []func(string) string{func(s string) string { return strings.ReplaceAll(s, from, to) }}, nil
	}
	return nil, fmt.Errorf("%q %w (only Sequence, Prepend, Replace)", n.Type, errLlamaUnsupported)
}

// parseLlamaMetaspace reads a Metaspace pre-tokenizer (alone or the only one of a Sequence).
func parseLlamaMetaspace(raw json.RawMessage) (*llamaMetaspace, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var p struct {
		Type           string            `json:"type"`
		PreTokenizers  []json.RawMessage `json:"pretokenizers"`
		Replacement    string            `json:"replacement"`
		PrependScheme  *string           `json:"prepend_scheme"`
		AddPrefixSpace *bool             `json:"add_prefix_space"`
		Split          *bool             `json:"split"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, err
	}
	if p.Type == "Sequence" && len(p.PreTokenizers) == 1 {
		return parseLlamaMetaspace(p.PreTokenizers[0])
	}
	if p.Type != "Metaspace" {
		return nil, fmt.Errorf("%q %w (only Metaspace)", p.Type, errLlamaUnsupported)
	}
	if utf8.RuneCountInString(p.Replacement) != 1 {
		return nil, fmt.Errorf("Metaspace replacement %q is not one character", p.Replacement)
	}
	// Files older than prepend_scheme say add_prefix_space; split defaults to true.
	m := &llamaMetaspace{rep: p.Replacement, scheme: PrefixAlways, split: p.Split == nil || *p.Split}
	if p.AddPrefixSpace != nil && !*p.AddPrefixSpace {
		m.scheme = PrefixNever
	}
	if p.PrependScheme != nil {
		switch *p.PrependScheme {
		case "always":
			m.scheme = PrefixAlways
		case "first":
			m.scheme = PrefixFirst
		case "never":
			m.scheme = PrefixNever
		default:
			return nil, fmt.Errorf("Metaspace prepend_scheme %q %w", *p.PrependScheme, errLlamaUnsupported)
		}
	}
	return m, nil
}

// transformersPrefix is the prepend scheme transformers 5's LlamaTokenizerFast builds from a
// tokenizer_config.json (a missing file leaves its defaults: legacy false, add_prefix_space true).
func transformersPrefix(path string) (LlamaPrefix, error) {
	var cfg struct {
		Legacy         *bool `json:"legacy"`
		AddPrefixSpace *bool `json:"add_prefix_space"`
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return PrefixFirst, nil
	}
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil {
		return 0, fmt.Errorf("tokenizer config %s: %w", path, err)
	}
	switch {
	case cfg.AddPrefixSpace != nil && !*cfg.AddPrefixSpace:
		return PrefixNever, nil
	case cfg.Legacy != nil && *cfg.Legacy:
		return PrefixAlways, nil
	}
	return PrefixFirst, nil
}

// cjkSplits finds the tokens SplitCJK replaces, as mask_multichar_chinese_tokens does: those
// whose text without "▁" is an entry of the vocabulary (added tokens included) of two or more
// characters all in U+4E00..U+9FFF.
func (t *Llama) cjkSplits() map[int64][]int64 {
	multi := map[string]bool{}
	isMulti := func(s string) bool {
		if utf8.RuneCountInString(s) < 2 {
			return false
		}
		for _, r := range s {
			if r < 0x4E00 || r > 0x9FFF {
				return false
			}
		}
		return true
	}
	for s := range t.vocab {
		if isMulti(s) {
			multi[s] = true
		}
	}
	for s := range t.added {
		if isMulti(s) {
			multi[s] = true
		}
	}
	out := map[int64][]int64{}
	split := func(s string, id int64) {
		clean := strings.ReplaceAll(s, "▁", "")
		if !multi[clean] {
			return
		}
		var ids []int64
		for _, r := range clean {
			cid, ok := t.ID(string(r))
			if !ok {
				if t.unk < 0 {
					return // no id to give it: the token stays whole
				}
				cid = t.unk
			}
			ids = append(ids, cid)
		}
		out[id] = ids
	}
	for s, id := range t.vocab {
		split(s, id)
	}
	for s, a := range t.added {
		split(s, a.id)
	}
	return out
}

// Size is the number of ids: the vocabulary and the added tokens.
func (t *Llama) Size() int {
	n := int64(0)
	for _, id := range t.vocab {
		n = max(n, id+1)
	}
	for _, a := range t.added {
		n = max(n, a.id+1)
	}
	return int(n)
}

// ID returns the id of an added token or a vocabulary token, added tokens first as the
// tokenizers library looks them up.
func (t *Llama) ID(token string) (int64, bool) {
	if a, ok := t.added[token]; ok {
		return a.id, true
	}
	id, ok := t.vocab[token]
	return id, ok
}

// Encode returns the ids of text without <s> (transformers' tokenize then convert_tokens_to_ids,
// which is what VoxCPM feeds its LM), split by SplitCJK when set.
func (t *Llama) Encode(text string) []int64 {
	if text == "" {
		return nil
	}
	var ids []int64
	start := 0 // where the piece before the next added token starts
	for i := 0; i < len(text); {
		a, ok := t.addedAt(text[i:])
		if !ok {
			i++
			continue
		}
		s, e := i, i+len(a.content)
		if a.lstrip {
			s = max(start, len(strings.TrimRightFunc(text[:i], unicode.IsSpace)))
		}
		if a.rstrip {
			e = len(text) - len(strings.TrimLeftFunc(text[e:], unicode.IsSpace))
		}
		ids = t.piece(ids, text[start:s], start == 0)
		ids = append(ids, a.id)
		start, i = e, e
	}
	ids = t.piece(ids, text[start:], start == 0)
	if t.SplitCJK {
		out := ids[:0:0]
		for _, id := range ids {
			if s, ok := t.cjk[id]; ok {
				out = append(out, s...)
			} else {
				out = append(out, id)
			}
		}
		ids = out
	}
	return ids
}

func (t *Llama) addedAt(s string) (llamaAdded, bool) {
	for _, a := range t.addedFirst[s[0]] {
		if strings.HasPrefix(s, a.content) {
			return a, true
		}
	}
	return llamaAdded{}, false
}

// piece appends the ids of text between added tokens; first says it starts the text.
func (t *Llama) piece(ids []int64, s string, first bool) []int64 {
	if s == "" {
		return ids
	}
	meta := &llamaMetaspace{rep: "▁", scheme: t.Prefix}
	if t.Prefix == PrefixFile {
		for _, n := range t.normalizers {
			s = n(s)
		}
		if meta = t.meta; meta == nil {
			return t.word(ids, s)
		}
	}
	s = strings.ReplaceAll(s, " ", meta.rep)
	if (meta.scheme == PrefixAlways || meta.scheme == PrefixFirst && first) && !strings.HasPrefix(s, meta.rep) {
		s = meta.rep + s
	}
	if !meta.split {
		return t.word(ids, s)
	}
	// Cut before each replacement, which stays with what follows it.
	for s != "" {
		_, size := utf8.DecodeRuneInString(s)
		n := strings.Index(s[size:], meta.rep)
		if n < 0 {
			n = len(s)
		} else {
			n += size
		}
		ids = t.word(ids, s[:n])
		s = s[n:]
	}
	return ids
}

type llamaSym struct {
	id         int64
	prev, next int // -1 at the ends
	gone       bool
}

// word appends the ids of one pre-tokenized word, merged as the tokenizers library's BPE does:
// the pair of lowest rank first, the leftmost of equal ranks.
func (t *Llama) word(ids []int64, w string) []int64 {
	if t.ignoreMerges {
		if id, ok := t.vocab[w]; ok {
			return append(ids, id)
		}
	}
	syms := make([]llamaSym, 0, len(w))
	add := func(id int64) {
		syms = append(syms, llamaSym{id: id, prev: len(syms) - 1, next: -1})
	}
	// An unknown character waits, to be fused with the next one when fuse_unk is set.
	pendingUnk := false
	for i := 0; i < len(w); {
		_, size := utf8.DecodeRuneInString(w[i:])
		c := w[i : i+size]
		i += size
		if id, ok := t.vocab[c]; ok {
			if pendingUnk {
				add(t.unk)
				pendingUnk = false
			}
			add(id)
			continue
		}
		if t.byteFallback && t.hasBytes(c) {
			// As the tokenizers library does, an unk still waiting comes after these bytes.
			for j := 0; j < len(c); j++ {
				add(t.byteID[c[j]])
			}
			continue
		}
		if t.unk < 0 {
			continue
		}
		if pendingUnk && !t.fuseUnk {
			add(t.unk)
		}
		pendingUnk = true
	}
	if pendingUnk {
		add(t.unk)
	}
	for i := range syms {
		if i+1 < len(syms) {
			syms[i].next = i + 1
		}
	}
	q := &llamaQueue{}
	push := func(pos int) {
		if next := syms[pos].next; next >= 0 {
			if m, ok := t.merges[[2]int64{syms[pos].id, syms[next].id}]; ok {
				heap.Push(q, llamaQueued{rank: m.rank, pos: pos, id: m.id})
			}
		}
	}
	for i := range syms {
		push(i)
	}
	for q.Len() > 0 {
		top := heap.Pop(q).(llamaQueued)
		s := &syms[top.pos]
		if s.gone || s.next < 0 {
			continue
		}
		// Skip an entry whose pair has changed since it was llamaQueued.
		if m, ok := t.merges[[2]int64{s.id, syms[s.next].id}]; !ok || m.id != top.id {
			continue
		}
		right := syms[s.next]
		syms[s.next].gone = true
		s.id, s.next = top.id, right.next
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if s.prev >= 0 {
			push(s.prev)
		}
		push(top.pos)
	}
	for i := 0; i >= 0 && len(syms) > 0; i = syms[i].next {
		ids = append(ids, syms[i].id)
	}
	return ids
}

func (t *Llama) hasBytes(c string) bool {
	for j := 0; j < len(c); j++ {
		if t.byteID[c[j]] < 0 {
			return false
		}
	}
	return true
}

type llamaQueued struct {
	rank, pos int
	id        int64
}

// llamaQueue orders merges by rank, then position.
type llamaQueue []llamaQueued

func (q llamaQueue) Len() int { return len(q) }
func (q llamaQueue) Less(i, j int) bool {
	return q[i].rank < q[j].rank || q[i].rank == q[j].rank && q[i].pos < q[j].pos
}
func (q llamaQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *llamaQueue) Push(x any)   { *q = append(*q, x.(llamaQueued)) }
func (q *llamaQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}
