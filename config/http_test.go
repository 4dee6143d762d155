package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestCORS(t *testing.T) {
	base := "model: m.yaml\ngroups:\n  - name: a\n"
	for _, tt := range []struct {
		yaml    string
		origins []string
		maxAge  time.Duration
	}{
		{"", []string{"*"}, 10 * time.Minute},
		{"cors:\n  allow_origins: []\n", []string{}, 10 * time.Minute},
		{"cors:\n  allow_origins: [\"https://a.example\", \"http://localhost:3000\"]\n  max_age: 1h\n",
			[]string{"https://a.example", "http://localhost:3000"}, time.Hour},
	} {
		c, err := Parse(testFile, []byte(base+tt.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tt.yaml, err)
		}
		if got := c.CORS.Origins(); !reflect.DeepEqual(got, tt.origins) {
			t.Errorf("%q: origins %v, want %v", tt.yaml, got, tt.origins)
		}
		if c.CORS.MaxAge.Std() != tt.maxAge {
			t.Errorf("%q: max_age %v", tt.yaml, c.CORS.MaxAge.Std())
		}
	}
}

func TestCORSErrors(t *testing.T) {
	base := "model: m.yaml\ngroups:\n  - name: a\n"
	for _, tt := range []struct {
		yaml string
		want []string
	}{
		{"cors:\n  allow_origins: [\"*\", \"https://a.example\"]\n", []string{testFile + ":5:", "cors.allow_origins[0]", "only entry"}},
		{"cors:\n  allow_origins: [\"a.example\"]\n", []string{testFile + ":5:", "cors.allow_origins[0]", "not an origin"}},
		{"cors:\n  allow_origins: [\"https://a.example/app\"]\n", []string{testFile + ":5:", "cors.allow_origins[0]", "no path"}},
		{"cors:\n  allow_origins: [\"https://A.example\"]\n", []string{testFile + ":5:", "lower case"}},
		{"cors:\n  allow_origins: [\"https://a.example\", \"https://a.example\"]\n", []string{"cors.allow_origins[1]", "twice"}},
		{"cors:\n  max_age: -1s\n", []string{testFile + ":5:", "cors.max_age"}},
		{"cors:\n  max_age: soon\n", []string{testFile, "soon", "duration"}},
		{"cors:\n  origins: [\"*\"]\n", []string{testFile, `"origins"`}},
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
