package config

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
)

// DefaultModelAliases are the names OpenAI clients send as "model"; they reach the served model.
var DefaultModelAliases = []string{"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}

// APIKeys says where the keys of the speech API come from. With neither set, /v1/* is open.
type APIKeys struct {
	// File holds one key per line; '#' starts a comment, blank lines are skipped. Relative to
	// the config file. A key may be followed by rights, separated by spaces: "KEY voices" lets
	// it create and delete library voices.
	File string `yaml:"file"`
	// Env names an environment variable holding keys separated by commas or spaces.
	Env string `yaml:"env"`
}

// Enabled reports whether keys are configured (and so required).
func (k APIKeys) Enabled() bool { return k.File != "" || k.Env != "" }

// Aliases are the other names clients may send as "model": model_aliases, or
// DefaultModelAliases when the key is left out (an empty list allows none).
func (c *Config) Aliases() []string {
	if c.ModelAliases == nil {
		return append([]string(nil), DefaultModelAliases...)
	}
	return append([]string(nil), (*c.ModelAliases)...)
}

func (c *Config) validateAPI() error {
	if c.ModelAliases != nil {
		seen := map[string]bool{}
		for i, a := range *c.ModelAliases {
			p := fmt.Sprintf("$.model_aliases[%d]", i)
			k := fmt.Sprintf("model_aliases[%d]", i)
			if strings.TrimSpace(a) == "" {
				return bad(p, k, "is empty")
			}
			if seen[a] {
				return bad(p, k, "%q is listed twice", a)
			}
			seen[a] = true
		}
	}
	if c.APIKeys.Env != "" && strings.ContainsAny(c.APIKeys.Env, "$= \t") {
		return bad("$.api_keys.env", "api_keys.env", "%q is not an environment variable name", c.APIKeys.Env)
	}
	return nil
}

// RightVoices lets a key create and delete library voices (POST and DELETE /v1/audio/voices).
const RightVoices = "voices"

// keyRights are the rights a key line may grant after the key.
var keyRights = []string{RightVoices}

// LoadAPIKeys reads the configured API keys (main calls it once, at start-up; getenv is how it
// reads the environment). It returns nil when none are configured. A configured source that
// yields no key is an error, so that a typo never leaves the API open or locked shut. Errors never contain a key.
func (c *Config) LoadAPIKeys(getenv func(string) string) (map[string]struct{}, error) {
	rights, err := c.LoadAPIKeyRights(getenv)
	if rights == nil || err != nil {
		return nil, err
	}
	keys := make(map[string]struct{}, len(rights))
	for k := range rights {
		keys[k] = struct{}{}
	}
	return keys, nil
}

// KeysWith are the keys among rights that hold right.
func KeysWith(rights map[string][]string, right string) map[string]struct{} {
	keys := map[string]struct{}{}
	for k, r := range rights {
		if slices.Contains(r, right) {
			keys[k] = struct{}{}
		}
	}
	return keys
}

// LoadAPIKeyRights is LoadAPIKeys with each key's rights. A line of api_keys.file is a key,
// optionally followed by rights separated by spaces ("KEY voices"); keys from api_keys.env have
// none. Rights add to what every key may do (speak, list).
func (c *Config) LoadAPIKeyRights(getenv func(string) string) (map[string][]string, error) {
	if !c.APIKeys.Enabled() {
		return nil, nil
	}
	keys := map[string][]string{}
	if c.APIKeys.File != "" {
		p := c.Path(c.APIKeys.File)
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("config %s: api_keys.file: %w", c.File, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		n := 0
		for sc.Scan() {
			n++
			line, _, _ := strings.Cut(sc.Text(), "#")
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			for _, r := range fields[1:] {
				if !slices.Contains(keyRights, r) {
					// Nothing of the line is quoted: the word may be a key.
					return nil, fmt.Errorf("config %s: api_keys.file: %s line %d: a word after the key is not a right (rights: %s); a key must not contain spaces",
						c.File, p, n, strings.Join(keyRights, ", "))
				}
			}
			keys[fields[0]] = append(keys[fields[0]], fields[1:]...)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("config %s: api_keys.file: %s: %w", c.File, p, err)
		}
		if len(keys) == 0 {
			return nil, fmt.Errorf("config %s: api_keys.file: %s holds no key", c.File, p)
		}
	}
	if c.APIKeys.Env != "" {
		v := getenv(c.APIKeys.Env)
		before := len(keys)
		for _, k := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
			if _, ok := keys[k]; !ok {
				keys[k] = nil
			}
		}
		if len(keys) == before {
			return nil, fmt.Errorf("config %s: api_keys.env: $%s holds no key", c.File, c.APIKeys.Env)
		}
	}
	return keys, nil
}
