package router

import (
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// RealtimeOptions tune WS /v1/audio/speech/stream (config.Realtime has each one's meaning).
type RealtimeOptions struct {
	MinChars    int
	MaxChars    int
	IdleFlush   time.Duration // 0: never
	MaxContexts int
}

func (o RealtimeOptions) withDefaults(maxInput int) RealtimeOptions {
	if o.MinChars <= 0 {
		o.MinChars = 20
	}
	if o.MaxChars <= 0 {
		o.MaxChars = 200
	}
	if maxInput > 0 {
		o.MaxChars = min(o.MaxChars, maxInput)
	}
	o.MinChars = min(o.MinChars, o.MaxChars)
	if o.MaxContexts <= 0 {
		o.MaxContexts = 8
	}
	return o
}

// segmenter decides when text streamed in is enough to start speaking: at a sentence end or line
// break, at a clause boundary once minChars wait, and at the last space once maxChars wait
// without either. Punctuation counts as a boundary only once what follows it has arrived (a
// space, or more text), so "3." of "3.5" and "Dr." of a name still being typed are not cut at
// the end of a delta; ! ? and full-width terminators need nothing after them.
type segmenter struct {
	minChars, maxChars int
}

// cut returns the length in bytes of the first segment buf holds, 0 when it must wait for more.
func (g segmenter) cut(buf string) int {
	runes := 0
	lastSpace := -1 // byte offset after the last space seen before maxChars
	for i, r := range buf {
		runes++
		end := i + utf8.RuneLen(r)
		next, _ := utf8.DecodeRuneInString(buf[end:])
		atEnd := end == len(buf)
		switch {
		case r == '\n':
			return end
		case r == '.' || r == '!' || r == '?' || r == '…':
			if !atEnd && unicode.IsSpace(next) || atEnd && r != '.' && r != '…' {
				return end
			}
		case r == '。' || r == '！' || r == '？':
			return end
		case r == ',' || r == ';' || r == ':' || r == '—' || r == '，' || r == '；' || r == '：' || r == '、':
			if runes >= g.minChars && (!atEnd && unicode.IsSpace(next) || r >= 0x3000) {
				return end
			}
		}
		if unicode.IsSpace(r) {
			lastSpace = end
		}
		if runes >= g.maxChars {
			if lastSpace > 0 {
				return lastSpace
			}
			return end
		}
	}
	return 0
}

// split cuts buf into the segments it holds now; flush also takes what is left. Blank
// segments are dropped; rest is what waits.
func (g segmenter) split(buf string, flush bool) (segs []string, rest string) {
	for {
		n := g.cut(buf)
		if n == 0 {
			break
		}
		if s := strings.TrimSpace(buf[:n]); s != "" {
			segs = append(segs, buf[:n])
		}
		buf = buf[n:]
	}
	if flush {
		if strings.TrimSpace(buf) != "" {
			segs = append(segs, buf)
		}
		buf = ""
	}
	return segs, buf
}
