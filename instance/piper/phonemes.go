package piper

import (
	"slices"
	"strings"

	"golang.org/x/text/unicode/norm"

	"github.com/voxmux/voxmux/instance/espeak"
)

// clausePhonemizer is what Piper's text front end needs of espeak-ng.
type clausePhonemizer interface {
	Phonemize(voice, text string) ([]espeak.Clause, error)
}

// piperSentence is one sentence's phonemes and the ids the voice's graph takes for them.
type piperSentence struct {
	Phonemes []string
	IDs      []int64
	// End is the byte offset in the text where the sentence's text ends (espeak.Clause.End).
	End int
}

// sentences turns text into the voice's phoneme ids, one sentence at a time, following Piper
// (OHF-Voice/piper1-gpl src/piper/phonemize_espeak.py and phoneme_ids.py; rhasspy/piper-phonemize
// src/phonemize.cpp and phoneme_ids.cpp):
//   - espeak-ng phonemizes clause by clause; language-switch flags like "(en)" are removed;
//   - the clause's punctuation is kept as a phoneme (. ? ! end the sentence; , : ; are followed by
//     a space);
//   - phonemes are decomposed to Unicode NFD code points, one phoneme each (the voice's
//     phoneme_map and vowel_clusters are applied if it has them);
//   - ids are ^ _ then each phoneme's ids followed by _, then $; phonemes the voice has no id for
//     are dropped, as Piper drops them.
//
// Sentences in which espeak-ng pronounced nothing (only emoji, say) are left out.
func (f *piperFile) sentences(ph clausePhonemizer, text string) ([]piperSentence, error) {
	clauses, err := ph.Phonemize(f.Config.ESpeak.Voice, text)
	if err != nil {
		return nil, err
	}
	var out []piperSentence
	var cur strings.Builder
	spoken := false
	end := 0
	flush := func() {
		if spoken {
			p := f.phonemes(cur.String())
			out = append(out, piperSentence{Phonemes: p, IDs: f.ids(p), End: end})
		}
		cur.Reset()
		spoken = false
	}
	for _, c := range clauses {
		p := stripLanguageFlags(c.Phonemes)
		if strings.TrimSpace(p) != "" {
			spoken = true
		}
		cur.WriteString(p)
		end = c.End
		if c.Punct != 0 {
			cur.WriteRune(c.Punct)
			if c.Punct == ',' || c.Punct == ':' || c.Punct == ';' {
				cur.WriteByte(' ')
			}
		}
		if c.SentenceEnd {
			flush()
		}
	}
	flush()
	return out, nil
}

// stripLanguageFlags removes espeak-ng's "(lang)" marks around words read in another language;
// the words' phonemes stay.
func stripLanguageFlags(s string) string {
	if !strings.Contains(s, "(") {
		return s
	}
	var b strings.Builder
	in := false
	for _, r := range s {
		switch {
		case in:
			in = r != ')'
		case r == '(':
			in = true
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// phonemes splits an IPA string into the voice's phonemes: NFD code points, through phoneme_map,
// with vowel_clusters merged.
func (f *piperFile) phonemes(ipa string) []string {
	var out []string
	for _, r := range norm.NFD.String(ipa) {
		s := string(r)
		if m, ok := f.Config.PhonemeMap[s]; ok {
			out = append(out, m...)
			continue
		}
		out = append(out, s)
	}
	if len(f.Config.VowelClusters) > 0 {
		out = mergeClusters(out, f.Config.VowelClusters)
	}
	return out
}

// mergeClusters joins runs of phonemes that the voice lists as one (longest first), as piper1-gpl
// does for voices trained with diphthongs as single symbols.
func mergeClusters(ph []string, clusters [][]string) []string {
	longest := 0
	for _, c := range clusters {
		longest = max(longest, len(c))
	}
	var out []string
	for i := 0; i < len(ph); {
		n := 0
		for l := min(longest, len(ph)-i); l > 1 && n == 0; l-- {
			for _, c := range clusters {
				if len(c) == l && slices.Equal(c, ph[i:i+l]) {
					n = l
					break
				}
			}
		}
		if n == 0 {
			out = append(out, ph[i])
			i++
			continue
		}
		out = append(out, strings.Join(ph[i:i+n], ""))
		i += n
	}
	return out
}

func (f *piperFile) ids(phonemes []string) []int64 {
	m := f.Config.PhonemeIDMap
	pad := m[piperPad]
	ids := append(slices.Clone(m[piperBOS]), pad...)
	for _, p := range phonemes {
		pid, ok := m[p]
		if !ok {
			continue
		}
		ids = append(ids, pid...)
		ids = append(ids, pad...)
	}
	return append(ids, m[piperEOS]...)
}
