package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestModelAliases(t *testing.T) {
	base := "model: m.yaml\ngroups:\n  - name: a\n"
	c, err := Parse(testFile, []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Aliases(); !reflect.DeepEqual(got, []string{"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}) {
		t.Fatalf("default aliases %v", got)
	}
	c, err = Parse(testFile, []byte(base+"model_aliases: [tts-1, mine]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Aliases(); !reflect.DeepEqual(got, []string{"tts-1", "mine"}) {
		t.Fatalf("aliases %v", got)
	}
	c, err = Parse(testFile, []byte(base+"model_aliases: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Aliases(); len(got) != 0 {
		t.Fatalf("an empty list allows no alias, got %v", got)
	}
}

func TestAPIErrors(t *testing.T) {
	base := "model: m.yaml\ngroups:\n  - name: a\n"
	for _, tt := range []struct {
		yaml string
		want []string
	}{
		{"model_aliases: [a, a]\n", []string{testFile + ":4:", "model_aliases[1]", "twice"}},
		{"model_aliases: [a, \"\"]\n", []string{testFile + ":4:", "model_aliases[1]", "empty"}},
		{"api_keys:\n  env: $KEYS\n", []string{testFile + ":5:", "api_keys.env"}},
		{"api_keys:\n  files: k.txt\n", []string{testFile, `"files"`}},
	} {
		_, err := Parse(testFile, []byte(base+tt.yaml))
		if err == nil {
			t.Errorf("%q: no error", tt.yaml)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not contain %q", tt.yaml, err, w)
			}
		}
	}
}

func TestLoadAPIKeys(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "voxmux.yaml")
	keyFile := filepath.Join(dir, "keys.txt")
	if err := os.WriteFile(keyFile, []byte("# team keys\nsk-one\n\n  sk-two  # the CI's\n#sk-old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"VOXMUX_KEYS": "sk-three, sk-four", "EMPTY": " "}
	getenv := func(k string) string { return env[k] }
	parse := func(extra string) *Config {
		t.Helper()
		c, err := Parse(cfgFile, []byte("model: m.yaml\ngroups:\n  - name: a\n"+extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	keys, err := parse("").LoadAPIKeys(getenv)
	if err != nil || keys != nil {
		t.Fatalf("no api_keys: %v %v", keys, err)
	}
	keys, err = parse("api_keys: {file: keys.txt, env: VOXMUX_KEYS}\n").LoadAPIKeys(getenv)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{}{"sk-one": {}, "sk-two": {}, "sk-three": {}, "sk-four": {}}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}

	for _, tt := range []struct{ yaml, want string }{
		{"api_keys: {env: EMPTY}\n", "api_keys.env: $EMPTY holds no key"},
		{"api_keys: {env: UNSET}\n", "api_keys.env: $UNSET holds no key"},
		{"api_keys: {file: missing.txt}\n", "api_keys.file"},
	} {
		_, err := parse(tt.yaml).LoadAPIKeys(getenv)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), cfgFile) {
			t.Errorf("%q: error %v, want one naming %q and the file", tt.yaml, err, tt.want)
		}
	}
	empty := filepath.Join(dir, "empty.txt")
	os.WriteFile(empty, []byte("# nothing yet\n"), 0o600)
	if _, err := parse("api_keys: {file: empty.txt}\n").LoadAPIKeys(getenv); err == nil || !strings.Contains(err.Error(), "holds no key") {
		t.Errorf("a file without keys: %v", err)
	}
	spaced := filepath.Join(dir, "spaced.txt")
	os.WriteFile(spaced, []byte("sk-secret and more\n"), 0o600)
	_, err = parse("api_keys: {file: spaced.txt}\n").LoadAPIKeys(getenv)
	if err == nil || strings.Contains(err.Error(), "sk-secret") {
		t.Errorf("a malformed key file must fail without echoing the key: %v", err)
	}
}

func TestAPIKeyRights(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "voxmux.yaml")
	os.WriteFile(filepath.Join(dir, "keys.txt"), []byte("sk-plain\nsk-admin voices # may clone\n"), 0o600)
	c, err := Parse(cfgFile, []byte("model: m.yaml\ngroups:\n  - name: a\napi_keys: {file: keys.txt, env: K}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rights, err := c.LoadAPIKeyRights(func(string) string { return "sk-env" })
	if err != nil {
		t.Fatal(err)
	}
	if got := KeysWith(rights, RightVoices); !reflect.DeepEqual(got, map[string]struct{}{"sk-admin": {}}) {
		t.Fatalf("voices keys %v", got)
	}
	keys, err := c.LoadAPIKeys(func(string) string { return "sk-env" })
	if err != nil || len(keys) != 3 {
		t.Fatalf("every key may speak: %v %v", keys, err)
	}
	os.WriteFile(filepath.Join(dir, "bad.txt"), []byte("sk-secret sk-other\n"), 0o600)
	c.APIKeys = APIKeys{File: "bad.txt"}
	if _, err := c.LoadAPIKeyRights(nil); err == nil || strings.Contains(err.Error(), "sk-") || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("an unknown right: %v", err)
	}
}
