package library

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/voxmux/voxmux/tts"
)

// Errors of the library; the router maps them to HTTP statuses.
var (
	ErrExists   = errors.New("a voice of that name exists")
	ErrNotFound = errors.New("no voice of that name")
	ErrBadName  = errors.New("a voice name is 1 to 64 of A-Z, a-z, 0-9, _ and -")
)

// Prefixes of the library's own working folders; a voice name cannot start with '.', so they
// never clash with a voice.
const (
	tempPrefix    = ".tmp-"
	deletedPrefix = ".del-"
)

// Options configure a Library.
type Options struct {
	Dir string
	// MaxEntries and MaxBytes bound the cache of loaded prompts.
	MaxEntries int
	MaxBytes   int64
	Logger     *slog.Logger
}

// Library is the voice folder on disk, an index of its voices' metadata and a cache of their
// prompts.
type Library struct {
	dir   string
	log   *slog.Logger
	cache *cache

	mu    sync.Mutex // guards index and every change to dir
	index map[string]Meta
}

// ValidName reports whether name may name a library voice.
func ValidName(name string) bool {
	if len(name) < 1 || len(name) > 64 {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Open opens (creating it when missing) the library in o.Dir. Working folders left by a process
// that died mid-write or mid-delete are removed; a voice folder that cannot be read is logged and
// skipped, not served.
func Open(o Options) (*Library, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("voice library: %w", err)
	}
	l := &Library{dir: o.Dir, log: o.Logger, cache: newCache(o.MaxEntries, o.MaxBytes), index: map[string]Meta{}}
	ents, err := os.ReadDir(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("voice library: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, tempPrefix) || strings.HasPrefix(name, deletedPrefix) {
			if err := os.RemoveAll(filepath.Join(o.Dir, name)); err != nil {
				return nil, fmt.Errorf("voice library: remove a stale working folder: %w", err)
			}
			l.log.Info("voice library: removed a stale working folder", "folder", name)
			continue
		}
		if !e.IsDir() || !ValidName(name) {
			continue
		}
		if _, m, err := readMeta(filepath.Join(o.Dir, name), name); err != nil {
			l.log.Warn("voice library: skipped a voice that cannot be read", "voice", name, "error", err)
		} else {
			l.index[name] = m
		}
	}
	return l, nil
}

// Dir is the library's folder.
func (l *Library) Dir() string { return l.dir }

// List is every voice's metadata, by name.
func (l *Library) List() []Meta {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Meta, 0, len(l.index))
	for _, m := range l.index {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Meta) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Get is a voice's metadata. A folder copied into the library while it runs is found here.
func (l *Library) Get(name string) (Meta, error) {
	if !ValidName(name) {
		return Meta{}, ErrNotFound
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if m, ok := l.index[name]; ok {
		return m, nil
	}
	_, m, err := readMeta(filepath.Join(l.dir, name), name)
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, ErrNotFound
	}
	if err != nil {
		return Meta{}, fmt.Errorf("voice %s: %w", name, err)
	}
	l.index[name] = m
	return m, nil
}

// Prompt is a voice's prompt, from the cache or read from its folder. Callers must not modify it.
func (l *Library) Prompt(name string) (*tts.VoicePrompt, error) {
	if p := l.cache.get(name); p != nil {
		return p, nil
	}
	if _, err := l.Get(name); err != nil {
		return nil, err
	}
	p, m, err := readPrompt(filepath.Join(l.dir, name), name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound // deleted since Get
	}
	if err != nil {
		return nil, fmt.Errorf("voice %s: %w", name, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.index[name]; !ok {
		return nil, ErrNotFound
	}
	l.index[name] = m
	l.cache.put(name, p)
	return p, nil
}

// Create stores a new voice. The files are written into a working folder and renamed into
// place, so a voice is either whole or absent, whatever happens midway.
func (l *Library) Create(name string, p *tts.VoicePrompt, m Meta) error {
	if !ValidName(name) {
		return ErrBadName
	}
	m.Name, m.Tokens, m.Family = name, len(p.SpeechTokens), p.Family()
	if p.LatentDim > 0 {
		m.LatentFrames = len(p.Latents) / p.LatentDim
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	final := filepath.Join(l.dir, name)
	if _, ok := l.index[name]; ok {
		return ErrExists
	}
	if _, err := os.Lstat(final); err == nil {
		return ErrExists
	}
	tmp := filepath.Join(l.dir, tempPrefix+name+"-"+randomSuffix())
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fmt.Errorf("voice %s: %w", name, err)
	}
	if err := writeFolder(tmp, p, m); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("voice %s: %w", name, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("voice %s: %w", name, err)
	}
	syncDir(l.dir)
	l.index[name] = m
	l.cache.put(name, p)
	return nil
}

// Delete removes a voice: its folder is renamed out of the library first, so that a delete that
// dies midway leaves no partial voice either.
func (l *Library) Delete(name string) error {
	if !ValidName(name) {
		return ErrNotFound
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	final := filepath.Join(l.dir, name)
	if _, err := os.Lstat(final); errors.Is(err, fs.ErrNotExist) {
		delete(l.index, name)
		l.cache.remove(name)
		return ErrNotFound
	}
	gone := filepath.Join(l.dir, deletedPrefix+name+"-"+randomSuffix())
	if err := os.Rename(final, gone); err != nil {
		return fmt.Errorf("voice %s: %w", name, err)
	}
	syncDir(l.dir)
	delete(l.index, name)
	l.cache.remove(name)
	if err := os.RemoveAll(gone); err != nil {
		l.log.Warn("voice library: could not remove a deleted voice's files (removed at the next start)", "voice", name, "error", err)
	}
	return nil
}

// CacheStats is the number and bytes of cached prompts.
func (l *Library) CacheStats() (entries int, bytes int64) { return l.cache.stats() }

// syncDir makes a rename in dir durable; a failure leaves it to the file system's own timing.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
