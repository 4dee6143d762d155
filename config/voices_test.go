package config

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestVoices(t *testing.T) {
	base := "model: m.yaml\ngroups:\n  - name: a\n"
	c, err := Parse(testFile, []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	v := c.Voices
	if c.VoicesDir() != "" || v.MaxUploadBytes != 20<<20 || v.Cache.MaxEntries != 64 || v.Cache.MaxBytes != 256<<20 {
		t.Fatalf("defaults %+v dir %q", v, c.VoicesDir())
	}
	c, err = Parse(testFile, []byte(base+"voices:\n  dir: lib\n  max_upload_bytes: 5MiB\n  cache: {max_entries: 3, max_bytes: 1000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	v = c.Voices
	if c.VoicesDir() != filepath.Join(filepath.Dir(testFile), "lib") || v.MaxUploadBytes != 5<<20 || v.Cache.MaxEntries != 3 || v.Cache.MaxBytes != 1000 {
		t.Fatalf("set %+v dir %q", v, c.VoicesDir())
	}
	for _, tc := range []struct{ yaml, want string }{
		{"voices:\n  max_upload_bytes: lots\n", "is not a size"},
		{"voices:\n  max_upload_bytes: -1\n", "voices.max_upload_bytes"},
		{"voices:\n  max_upload_bytes: 2GiB\n", "voices.max_upload_bytes: 2147483648 is above"},
		{"voices:\n  cache: {max_entries: -1}\n", "voices.cache.max_entries"},
		{"voices:\n  cache: {max_bytes: -5}\n", "voices.cache.max_bytes"},
		{"voices:\n  folder: x\n", `"folder"`},
	} {
		_, err := Parse(testFile, []byte(base+tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), testFile) {
			t.Errorf("%q: err %v, want one naming %s and the file", tc.yaml, err, tc.want)
		}
	}
	for s, want := range map[string]ByteSize{"12": 12, "1KiB": 1024, "2 MB": 2e6, "1GiB": 1 << 30} {
		if got, err := ParseByteSize(s); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
}
