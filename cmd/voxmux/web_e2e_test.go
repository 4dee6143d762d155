package main

import (
	"bytes"
	"encoding/binary"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The web conventions against the real server and the tiny model, with the config's cors key: a
// browser's preflight from an allowed origin, HEAD and /health, the lists Open WebUI reads, and
// whole files ("stream": false) whose headers give the true length, as FFmpeg reads them.
func TestEndToEndWebConventions(t *testing.T) {
	needCommand(t, "ffmpeg", "ffprobe")
	listen := freePort(t)
	cfg := writeConfig(t, listen, "  - name: cpu\n    instances: 1\n")
	appendConfig(t, cfg, "cors:\n  allow_origins: [\"http://localhost:3000\"]\n  max_age: 1m\n")
	s := startServe(t, cfg, listen)

	req, _ := http.NewRequest("OPTIONS", s.url+"/v1/audio/speech", nil)
	req.Header.Set("Origin", "http://localhost:3000")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "http://localhost:3000" ||
		resp.Header.Get("Access-Control-Max-Age") != "60" {
		t.Errorf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	for _, path := range []string{"/", "/health", "/status.json", "/v1/audio/voices"} {
		req, _ := http.NewRequest("HEAD", s.url+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("HEAD %s: %d", path, resp.StatusCode)
		}
	}
	for _, c := range []struct{ path, key string }{{"/v1/audio/voices", `"voices":[{"id":"default","name":"default"}`}, {"/v1/audio/models", `"models":[{"id":"tiny","name":"tiny"}`}} {
		resp, err := http.Get(s.url + c.path)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(b.String(), c.key) {
			t.Errorf("%s: %d %s", c.path, resp.StatusCode, b.String())
		}
	}

	dir := t.TempDir()
	for _, format := range []string{"wav", "flac"} {
		resp, b := speechReq(t, s.url, "", `{"input":"A whole file, with its length.","response_format":"`+format+`","stream":false}`)
		if resp.StatusCode != 200 || resp.ContentLength != int64(len(b)) || resp.Header.Get("Content-Disposition") != `attachment; filename="speech.`+format+`"` {
			t.Fatalf("%s: %d, Content-Length %d for %d bytes, %v", format, resp.StatusCode, resp.ContentLength, len(b), resp.Header)
		}
		if format == "wav" && (binary.LittleEndian.Uint32(b[4:8]) != uint32(len(b)-8) || binary.LittleEndian.Uint32(b[40:44]) != uint32(len(b)-44)) {
			t.Errorf("wav: RIFF size %d, data size %d, for %d bytes", binary.LittleEndian.Uint32(b[4:8]), binary.LittleEndian.Uint32(b[40:44]), len(b))
		}
		// The header's length (what ffprobe reads without decoding) is the audio's: decoded samples.
		f := filepath.Join(dir, "speech."+format)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("ffprobe", "-v", "error", "-show_entries", "stream=duration_ts", "-of", "default=nw=1:nk=1", f).Output()
		if err != nil {
			t.Fatalf("%s: ffprobe: %v", format, err)
		}
		header, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		pcm, err := exec.Command("ffmpeg", "-v", "error", "-i", f, "-f", "s16le", "-").Output()
		if err != nil {
			t.Fatalf("%s: ffmpeg: %v", format, err)
		}
		if header == 0 || header != len(pcm)/2 {
			t.Errorf("%s: the header says %d samples, the file holds %d", format, header, len(pcm)/2)
		}
	}
}
