package router

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/router/library"
	"github.com/voxmux/voxmux/tts"
)

// apiErr decodes an OpenAI-shaped error body.
func apiErr(t *testing.T, body []byte) (msg, param string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not OpenAI-shaped JSON: %s", body)
	}
	if e.Error.Param != nil {
		param = *e.Error.Param
	}
	return e.Error.Message, param
}

// libraryWith opens a library in a new folder holding voice anna, made by the staged family
// (fixedPrompt has speech tokens), and bob, made by the voxcpm family (latents).
func libraryWith(t *testing.T) *library.Library {
	t.Helper()
	lib, err := library.Open(library.Options{Dir: t.TempDir(), MaxEntries: 4, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	if err := lib.Create("anna", &fixedPrompt, library.Meta{Text: "hello", Consent: "Anna agreed.", CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	bob := &tts.VoicePrompt{Text: "hello", Latents: []float32{1, 2, 3, 4}, LatentDim: 2}
	if err := lib.Create("bob", bob, library.Meta{Text: "hello", Consent: "Bob agreed.", CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	return lib
}

// A library voice made by another family than the model's is refused before any instance is
// asked, with a 400 about "voice" naming both families (not one blaming "input"); the model's
// list leaves it out, and its view tells its family.
func TestLibraryVoiceOfAnotherFamily(t *testing.T) {
	c := newCloner(nil)
	m := cloningModel
	m.Family = "voxcpm"
	lib := libraryWith(t)
	url, _ := serveWith(t, m, func(o *Options) { o.Voices = lib }, ready("i0", c, 4))

	resp, body := speak(t, url, `{"input":"hi","voice":"anna","response_format":"pcm"}`)
	msg, param := apiErr(t, body)
	if resp.StatusCode != 400 || param != "voice" || !strings.Contains(msg, "staged family") || !strings.Contains(msg, "voxcpm family") || !strings.Contains(msg, `"anna"`) {
		t.Fatalf("a staged voice on a voxcpm model: %d %s", resp.StatusCode, body)
	}
	select {
	case p := <-c.prompts:
		t.Fatalf("the instance was asked to speak in %+v", p)
	default:
	}
	// Its own family's voice speaks, with its prompt.
	if resp, body := speak(t, url, `{"input":"hi","voice":"bob","response_format":"pcm"}`); resp.StatusCode != 200 {
		t.Fatalf("a voxcpm voice on a voxcpm model: %d %s", resp.StatusCode, body)
	}
	if p := <-c.prompts; p == nil || p.Family() != "voxcpm" {
		t.Fatalf("the instance got prompt %+v", p)
	}

	_, body = do(t, "GET", url+"/v1/audio/voices", "", nil)
	var l voiceList
	json.Unmarshal(body, &l)
	var ids []string
	for _, v := range l.Data {
		ids = append(ids, v.ID)
	}
	if strings.Join(ids, ",") != "default,other,bob" {
		t.Fatalf("voices %v, want the model's and bob (anna is the staged family's)", ids)
	}
	if _, body := do(t, "GET", url+"/v1/audio/voices/anna", "", nil); !strings.Contains(string(body), `"family":"staged"`) {
		t.Fatalf("anna's view %s, want its family", body)
	}
}

// An unknown voice's 400 lists the voices the model can use: its own and the library voices of
// its family (not those of another family's).
func TestUnknownVoiceListsLibraryVoices(t *testing.T) {
	m := cloningModel
	m.Family = "staged"
	lib := libraryWith(t)
	url, _ := serveWith(t, m, func(o *Options) { o.Voices = lib }, ready("i0", newCloner(nil), 4))
	resp, body := speak(t, url, `{"input":"hi","voice":"nobody"}`)
	msg, param := apiErr(t, body)
	if resp.StatusCode != 400 || param != "voice" || !strings.Contains(msg, `"nobody"`) ||
		!strings.Contains(msg, "default, other") || !strings.Contains(msg, "library voices: anna") || strings.Contains(msg, "bob") {
		t.Fatalf("unknown voice: %d %s", resp.StatusCode, body)
	}
	// Without a library the list is the model's voices alone.
	url, _ = serveWith(t, m, nil, ready("i0", newCloner(nil), 4))
	_, body = speak(t, url, `{"input":"hi","voice":"nobody"}`)
	if msg, _ := apiErr(t, body); !strings.Contains(msg, "default, other") || strings.Contains(msg, "library") {
		t.Fatalf("unknown voice without a library: %s", body)
	}
}

// An instance's verdict on the voice (tts.InvalidVoice: a model whose voices changed under the
// router, say) is a 400 about "voice"; other verdicts stay about "input".
func TestInstanceVoiceVerdictNamesVoice(t *testing.T) {
	for _, c := range []struct {
		err   error
		param string
	}{
		{tts.InvalidVoice(`voice "other" is not a voice of model "clone"; its voices: default`), "voice"},
		{tts.Invalid("the prompt is too long"), "input"},
	} {
		s := &tts.MockInstance{SynthesizeF: func(context.Context, tts.Request, func(tts.Chunk) error) error { return c.err }}
		url, _ := serveWith(t, cloningModel, nil, ready("i0", s, 4))
		resp, body := speak(t, url, `{"input":"hi","voice":"other"}`)
		msg, param := apiErr(t, body)
		if resp.StatusCode != 400 || param != c.param || msg != c.err.Error() {
			t.Errorf("%v: %d %s, want a 400 about %s", c.err, resp.StatusCode, body, c.param)
		}
	}
}
