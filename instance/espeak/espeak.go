// Package espeak phonemizes text with libespeak-ng in process: text goes in, IPA phonemes come out
// clause by clause, each with the punctuation that ended it. It builds against Debian's
// libespeak-ng-dev headers and opens libespeak-ng.so.1 when first used.
package espeak

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <espeak-ng/espeak_ng.h>
#include <espeak-ng/speak_lib.h>

// libespeak-ng is opened at run time (dlopen), so a voxmux binary that serves no Piper voice does
// not need it, nor the audio libraries it links, installed.
static void (*p_InitializePath)(const char *);
static espeak_ng_STATUS (*p_Initialize)(espeak_ng_ERROR_CONTEXT *);
static espeak_ng_STATUS (*p_InitializeOutput)(espeak_ng_OUTPUT_MODE, int, const char *);
static void (*p_GetStatusCodeMessage)(espeak_ng_STATUS, char *, size_t);
static void (*p_ClearErrorContext)(espeak_ng_ERROR_CONTEXT *);
static espeak_ng_STATUS (*p_SetVoiceByName)(const char *);
static const char *(*p_TextToPhonemes)(const void **, int, int);

#define VOXMUX_SYM(var, name) \
	*(void **)(&var) = dlsym(h, name); \
	if (var == NULL) return "libespeak-ng has no " name;

static const char *voxmux_espeak_load(const char *file) {
	void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) return dlerror();
	VOXMUX_SYM(p_InitializePath, "espeak_ng_InitializePath")
	VOXMUX_SYM(p_Initialize, "espeak_ng_Initialize")
	VOXMUX_SYM(p_InitializeOutput, "espeak_ng_InitializeOutput")
	VOXMUX_SYM(p_GetStatusCodeMessage, "espeak_ng_GetStatusCodeMessage")
	VOXMUX_SYM(p_ClearErrorContext, "espeak_ng_ClearErrorContext")
	VOXMUX_SYM(p_SetVoiceByName, "espeak_ng_SetVoiceByName")
	VOXMUX_SYM(p_TextToPhonemes, "espeak_TextToPhonemes")
	return NULL;
}

static espeak_ng_STATUS voxmux_espeak_init(const char *path, char *msg, size_t len) {
	p_InitializePath(path);
	espeak_ng_ERROR_CONTEXT ctx = NULL;
	espeak_ng_STATUS st = p_Initialize(&ctx);
	if (st != ENS_OK) {
		p_GetStatusCodeMessage(st, msg, len);
		p_ClearErrorContext(&ctx);
		return st;
	}
	// Synchronous output with no device: nothing is played, and TextToPhonemes needs no more.
	st = p_InitializeOutput(ENOUTPUT_MODE_SYNCHRONOUS, 0, NULL);
	if (st != ENS_OK) {
		p_GetStatusCodeMessage(st, msg, len);
	}
	return st;
}

static espeak_ng_STATUS voxmux_espeak_voice(const char *name, char *msg, size_t len) {
	espeak_ng_STATUS st = p_SetVoiceByName(name);
	if (st != ENS_OK) {
		p_GetStatusCodeMessage(st, msg, len);
	}
	return st;
}

// One clause: espeak-ng advances *text past what it read, or sets it to NULL at the end.
static const char *voxmux_espeak_clause(const char **text) {
	return p_TextToPhonemes((const void **)text, espeakCHARS_UTF8, espeakPHONEMES_IPA);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// libespeak-ng keeps all its state in C globals: it is initialised once per process, with one
// data folder, and is not thread-safe. So this guard is per process too, whatever number of
// Phonemizers there are.
var lib struct {
	mu      sync.Mutex
	dataDir string // set once initialised
	voice   string // the voice selected last, so a run of requests for one voice loads it once
}

// Phonemizer is a handle on the process's espeak-ng.
type Phonemizer struct {
	dataDir string
}

// Clause is what espeak-ng phonemized up to a punctuation mark, as its own clause splitter cut it.
type Clause struct {
	// Phonemes is espeak-ng's IPA for the clause: words separated by spaces, and language switches
	// marked as "(en)…(cmn)" when the voice reads a word in another language.
	Phonemes string
	// Punct is the punctuation that ended the clause, as ASCII ('.', '?', '!', ',', ':', ';'), or 0.
	Punct rune
	// SentenceEnd is true when the clause ends a sentence (., ?, !, a blank line, the end of text).
	SentenceEnd bool
	// End is the byte offset in the text where the clause's text ends, its trailing spaces
	// included; the next clause's text starts there, and the last one's End is the text's length.
	End int
}

// Library is the shared library Open loads: Debian's libespeak-ng1 (1.51).
const Library = "libespeak-ng.so.1"

// DataDirs are where distributions put espeak-ng-data, in the order they are tried.
var DataDirs = []string{
	"/usr/lib/x86_64-linux-gnu/espeak-ng-data",  // Debian, Ubuntu (amd64)
	"/usr/lib/aarch64-linux-gnu/espeak-ng-data", // Debian, Ubuntu (arm64)
	"/usr/share/espeak-ng-data",                 // Fedora, Arch, Alpine
	"/usr/lib/espeak-ng-data",
	"/usr/local/share/espeak-ng-data", // built from source
}

// FindData returns the espeak-ng-data folder to use: dir when it is given, else the first of
// DataDirs that holds espeak-ng's phoneme tables.
func FindData(dir string) (string, error) {
	if dir != "" {
		if err := checkData(dir); err != nil {
			return "", err
		}
		return filepath.Abs(dir)
	}
	for _, d := range DataDirs {
		if checkData(d) == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("espeak-ng-data not found in %s (apt-get install espeak-ng-data, or name the folder)", strings.Join(DataDirs, ", "))
}

func checkData(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "phontab")); err != nil {
		return fmt.Errorf("espeak-ng-data %s: no phoneme tables (phontab) there: %w", dir, err)
	}
	return nil
}

// Open initialises espeak-ng with the data folder dataDir (from FindData) the first time it is
// called in a process; later calls must name the same folder.
func Open(dataDir string) (*Phonemizer, error) {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.dataDir != "" {
		if lib.dataDir != dataDir {
			return nil, fmt.Errorf("espeak-ng is already initialised with %s in this process; it cannot also use %s", lib.dataDir, dataDir)
		}
		return &Phonemizer{dataDir: dataDir}, nil
	}
	if err := checkData(dataDir); err != nil {
		return nil, err
	}
	clib := C.CString(Library)
	defer C.free(unsafe.Pointer(clib))
	if msg := C.voxmux_espeak_load(clib); msg != nil {
		return nil, fmt.Errorf("espeak-ng: cannot load %s (apt-get install libespeak-ng1): %s", Library, C.GoString(msg))
	}
	cpath := C.CString(dataDir)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	if st := C.voxmux_espeak_init(cpath, &msg[0], C.size_t(len(msg))); st != C.ENS_OK {
		return nil, fmt.Errorf("espeak-ng: initialise with %s: %s", dataDir, C.GoString(&msg[0]))
	}
	lib.dataDir = dataDir
	return &Phonemizer{dataDir: dataDir}, nil
}

// DataDir is the espeak-ng-data folder in use.
func (p *Phonemizer) DataDir() string { return p.dataDir }

// CheckVoice reports whether espeak-ng has the voice (e.g. "en-us", "es", "cmn").
func (p *Phonemizer) CheckVoice(voice string) error {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	return setVoice(voice)
}

func setVoice(voice string) error {
	if voice == lib.voice {
		return nil
	}
	cv := C.CString(voice)
	defer C.free(unsafe.Pointer(cv))
	var msg [512]C.char
	if st := C.voxmux_espeak_voice(cv, &msg[0], C.size_t(len(msg))); st != C.ENS_OK {
		lib.voice = "" // espeak-ng may have unloaded the previous voice
		return fmt.Errorf("espeak-ng voice %q: %s (is it in %s/voices or lang?)", voice, C.GoString(&msg[0]), lib.dataDir)
	}
	lib.voice = voice
	return nil
}

// textSlack is how many zero bytes follow the text handed to espeak-ng.
const textSlack = 16

// Phonemize runs espeak-ng's clause splitter and phonemizer over text with the voice, and returns
// every clause in order. Text with nothing espeak-ng can pronounce gives clauses with empty Phonemes.
func (p *Phonemizer) Phonemize(voice, text string) ([]Clause, error) {
	if strings.IndexByte(text, 0) >= 0 {
		return nil, errors.New("text contains a NUL character")
	}
	// espeak-ng's clause reader looks a few bytes ahead of the character it decodes, past the
	// string's NUL at its end (a read past a bare C.CString crashed the instance): the copy
	// carries zero bytes of slack.
	ctext := (*C.char)(C.calloc(C.size_t(len(text)+textSlack), 1))
	defer C.free(unsafe.Pointer(ctext))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(ctext)), len(text)), text)
	base := uintptr(unsafe.Pointer(ctext))

	lib.mu.Lock()
	defer lib.mu.Unlock()
	if err := setVoice(voice); err != nil {
		return nil, err
	}
	var out []Clause
	cur := ctext
	for cur != nil {
		from := int(uintptr(unsafe.Pointer(cur)) - base)
		ph := C.GoString(C.voxmux_espeak_clause(&cur)) // copied: espeak-ng reuses its buffer
		to, more := len(text), cur != nil
		if more {
			to = int(uintptr(unsafe.Pointer(cur)) - base)
		}
		punct, end := terminator(text[from:to], more)
		textEnd := to
		if more {
			// espeak-ng read one character past the clause (terminator).
			_, n := utf8.DecodeLastRuneInString(text[from:to])
			textEnd -= n
		}
		out = append(out, Clause{Phonemes: ph, Punct: punct, SentenceEnd: end || !more, End: textEnd})
	}
	return out, nil
}

// terminator finds the punctuation that ended a clause in the text espeak-ng consumed for it.
// Piper uses a patched espeak-ng that reports the clause's terminator; stock espeak-ng (Debian's
// 1.51) does not, so it is read back from the text: espeak-ng stops one character past the
// clause's trailing spaces (it reads ahead to classify the punctuation), so that character is
// dropped, then spaces and closing quotes or brackets, and the last character left is classified
// as espeak-ng's clause table does, full-width CJK forms included; an ellipsis ("...", "…") ends
// a clause but gives no punctuation, as in Piper.
func terminator(consumed string, more bool) (punct rune, sentenceEnd bool) {
	s := consumed
	if more {
		_, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
	}
	trimmed := strings.TrimRightFunc(s, unicode.IsSpace)
	if strings.Count(s[len(trimmed):], "\n") >= 2 {
		sentenceEnd = true // a blank line ends a paragraph, so a sentence
	}
	trimmed = strings.TrimRight(trimmed, "\"'”’»」』)]}）")
	if strings.HasSuffix(trimmed, "..") {
		// espeak-ng reads two or more periods as an ellipsis: a clause end that is neither a
		// sentence end nor punctuation Piper keeps (its piper-phonemize adds nothing for it).
		return 0, sentenceEnd
	}
	r, _ := utf8.DecodeLastRuneInString(trimmed)
	switch r {
	case '.', '。', '．', '｡':
		return '.', true
	case '?', '？':
		return '?', true
	case '!', '！':
		return '!', true
	case ',', '，', '、', '､':
		return ',', sentenceEnd
	case ':', '：':
		return ':', sentenceEnd
	case ';', '；':
		return ';', sentenceEnd
	}
	return 0, sentenceEnd
}
