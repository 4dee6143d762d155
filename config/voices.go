package config

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
)

// Voices configures the voice library: voices cloned from uploaded clips (docs/api.md, "Voice
// cloning"). Without Dir there is no library; ad hoc cloning (ref_audio) still works on models
// that clone.
type Voices struct {
	// Dir holds one folder per voice, relative to the config file; created when missing.
	Dir string `yaml:"dir"`
	// MaxUploadBytes bounds an uploaded clip (the file itself, before base64).
	MaxUploadBytes ByteSize `yaml:"max_upload_bytes"`
	// Cache bounds the prompts held in memory; the rest are read from Dir when used.
	Cache VoiceCache `yaml:"cache"`
}

// VoiceCache bounds the in-memory cache of loaded voice prompts.
type VoiceCache struct {
	MaxEntries int      `yaml:"max_entries"`
	MaxBytes   ByteSize `yaml:"max_bytes"`
}

// Defaults of voices.
const (
	DefaultVoicesMaxUpload  = ByteSize(20 << 20)
	DefaultVoiceCacheItems  = 64
	DefaultVoiceCacheBytes  = ByteSize(256 << 20)
	maxVoicesMaxUploadBytes = ByteSize(1 << 30)
)

// VoicesDir resolves voices.dir relative to the config file; "" when there is no library.
func (c *Config) VoicesDir() string {
	d := c.Voices.Dir
	if d == "" || filepath.IsAbs(d) || c.File == "" {
		return d
	}
	return filepath.Join(filepath.Dir(c.File), d)
}

func (c *Config) applyVoicesDefaults() {
	v := &c.Voices
	if v.MaxUploadBytes == 0 {
		v.MaxUploadBytes = DefaultVoicesMaxUpload
	}
	if v.Cache.MaxEntries == 0 {
		v.Cache.MaxEntries = DefaultVoiceCacheItems
	}
	if v.Cache.MaxBytes == 0 {
		v.Cache.MaxBytes = DefaultVoiceCacheBytes
	}
}

func (c *Config) validateVoices() error {
	v := c.Voices
	switch {
	case strings.TrimSpace(v.Dir) != v.Dir:
		return bad("$.voices.dir", "voices.dir", "%q has leading or trailing spaces", v.Dir)
	case v.MaxUploadBytes < 0:
		return bad("$.voices.max_upload_bytes", "voices.max_upload_bytes", "must be positive")
	case v.MaxUploadBytes > maxVoicesMaxUploadBytes:
		// The upload is held in memory whole, with its decoded audio.
		return bad("$.voices.max_upload_bytes", "voices.max_upload_bytes", "%d is above the limit of 1GiB", v.MaxUploadBytes)
	case v.Cache.MaxEntries < 0:
		return bad("$.voices.cache.max_entries", "voices.cache.max_entries", "must be positive")
	case v.Cache.MaxBytes < 0:
		return bad("$.voices.cache.max_bytes", "voices.cache.max_bytes", "must be positive")
	}
	return nil
}

// ByteSize is a size in bytes, written in YAML as an integer or with a unit: "20MiB", "512KB".
type ByteSize int64

var byteUnits = []struct {
	suffix string
	n      int64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}

// UnmarshalYAML reads an integer or a number with a unit; errors carry the value's position.
func (b *ByteSize) UnmarshalYAML(node ast.Node) error {
	bad := func() error {
		return &yaml.SyntaxError{Message: fmt.Sprintf("%s is not a size like 1048576, 512KiB or 20MiB", node.String()), Token: node.GetToken()}
	}
	switch n := node.(type) {
	case *ast.IntegerNode:
		v, ok := n.Value.(int64)
		if !ok {
			if u, ok := n.Value.(uint64); ok && u <= 1<<62 {
				v = int64(u)
			} else {
				return bad()
			}
		}
		*b = ByteSize(v)
		return nil
	case *ast.StringNode:
		v, err := ParseByteSize(n.Value)
		if err != nil {
			return bad()
		}
		*b = v
		return nil
	}
	return bad()
}

// ParseByteSize reads "1048576", "512KiB", "20MiB", "1GB".
func ParseByteSize(s string) (ByteSize, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(rest), u.n
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size like 1048576, 512KiB or 20MiB", s)
	}
	return ByteSize(v * mult), nil
}
