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
	// Without a library there is nothing to create voices in.
	resp, err = http.Post(url+"/v1/audio/voices", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("POST voices without a library: status %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("PUT", url+"/v1/audio/voices", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD, POST" {
		t.Fatalf("PUT voices: status %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// TestListsOpenWebUIReads reads the voice and model lists as Open WebUI's reader does
// (data["voices"] and data["models"], items with "id" and "name") and as an OpenAI-style client
// does (data["data"]).
func TestListsOpenWebUIReads(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil)
	for _, c := range []struct {
		path, key string
		want      []string
	}{
		{"/v1/audio/voices", "voices", []string{"default", "other"}},
		{"/v1/audio/voices", "data", []string{"default", "other"}},
		{"/v1/audio/models", "models", []string{"tiny", "tts-1"}},
		{"/v1/audio/models", "data", []string{"tiny", "tts-1"}},
	} {
		resp, body := do(t, "GET", url+c.path, "", nil)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %d %q %s", c.path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		var m map[string][]struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(body, &raw); err != nil {
			t.Fatalf("%s: %v: %s", c.path, err, body)
		}
		if err := json.Unmarshal([]byte(`{"l":`+string(raw[c.key])+`}`), &m); err != nil {
			t.Fatalf("%s: %q is not a list of objects: %s", c.path, c.key, body)
		}
		var got []string
		for _, e := range m["l"] {
			got = append(got, e.ID)
			if c.key != "data" && e.Name == "" { // Open WebUI reads voice["name"]
				t.Errorf("%s %s: %q has no name", c.path, c.key, e.ID)
			}
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s %s: ids %v, want %v", c.path, c.key, got, c.want)
		}
	}
	if resp, _ := do(t, "POST", url+"/v1/audio/models", "{}", nil); resp.StatusCode != 405 {
		t.Errorf("POST /v1/audio/models: %d", resp.StatusCode)
	}
}
