package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseRealtime(t *testing.T) {
	c, err := Parse(testFile, []byte("model: m.yaml\ngroups:\n  - name: a\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Realtime
	if r.MinChars != 20 || r.MaxChars != 200 || r.MaxContexts != 8 || r.Idle() != 2*time.Second {
		t.Errorf("defaults %+v idle %v", r, r.Idle())
	}
	c, err = Parse(testFile, []byte("model: m.yaml\nmax_input_chars: 100\ngroups:\n  - name: a\nrealtime:\n  min_chars: 5\n  idle_flush: 0s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Realtime; r.MinChars != 5 || r.MaxChars != 100 || r.Idle() != 0 {
		t.Errorf("set %+v idle %v: want min 5, max capped at max_input_chars, idle off", r, r.Idle())
	}
	for _, tc := range []struct{ yaml, want string }{
		{"realtime:\n  min_chars: -1\n", "realtime.min_chars"},
		{"realtime:\n  min_chars: 50\n  max_chars: 10\n", "realtime.max_chars: 10 is below"},
		{"realtime:\n  max_chars: 5000\n", "realtime.max_chars: 5000 is above max_input_chars"},
		{"realtime:\n  idle_flush: -1s\n", "realtime.idle_flush"},
		{"realtime:\n  idle_flush: soon\n", `"soon" is not a duration`},
		{"realtime:\n  max_contexts: -2\n", "realtime.max_contexts"},
		{"realtime:\n  chars: 2\n", `"chars"`},
	} {
		_, err := Parse(testFile, []byte("model: m.yaml\ngroups:\n  - name: a\n"+tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), testFile) {
			t.Errorf("%q: err %v, want one naming %s and the file", tc.yaml, err, tc.want)
		}
	}
}
