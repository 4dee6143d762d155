package router

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestVoicesList(t *testing.T) {
	url := serveTest(t)
	resp, err := http.Get(url + "/v1/audio/voices")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var l struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if l.Object != "list" || l.Model != "tiny" || len(l.Data) != 2 || l.Data[0].ID != "default" || l.Data[1].ID != "other" {
		t.Fatalf("voices: %s", body)
	}
	resp, err = http.Post(url+"/v1/audio/voices", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" {
		t.Fatalf("POST voices: status %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}
