package router

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

func TestSeedReachesInstance(t *testing.T) {
	rec := &recordSynth{}
	url, _ := serveWith(t, tinyModel, nil, ready("a", rec, 4))
	for _, body := range []string{
		`{"input":"hi","response_format":"pcm","seed":42}`,
		`{"input":"hi","response_format":"pcm","seed":18446744073709551615}`,
		`{"input":"hi","response_format":"pcm"}`,
		`{"input":"hi","response_format":"pcm"}`,
	} {
		if resp, b := post(t, url, body); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
	if got := rec.reqs[0].Seed; got != 42 {
		t.Errorf("seed 42 reached the instance as %d", got)
	}
	if got := rec.reqs[1].Seed; got != 1<<64-1 {
		t.Errorf("the largest seed reached the instance as %d", got)
	}
	// Without a seed each request draws its own.
	if a, b := rec.reqs[2].Seed, rec.reqs[3].Seed; a == b {
		t.Errorf("two requests without a seed both got %d", a)
	}
}

func TestSeedMustBeUnsignedInteger(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &recordSynth{}, 4))
	for _, seed := range []string{"-1", "1.5", `"7"`, "18446744073709551616"} {
		resp, body := post(t, url, `{"input":"hi","seed":`+seed+`}`)
		var e openAIError
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 400 || e.Error.Param == nil || *e.Error.Param != "seed" {
			t.Errorf("seed %s: %d %s, want 400 with param seed", seed, resp.StatusCode, body)
		}
	}
}

type invalidSynth struct{ msg string }

func (s invalidSynth) Synthesize(context.Context, tts.Request, func(tts.Chunk) error) error {
	return tts.Invalid(s.msg)
}

// An instance's refusal of input over the model's token limit reaches the client as a 400 that
// names the limit.
func TestTokenLimitIs400(t *testing.T) {
	msg := "input is too long for model tiny: the text makes 8194 prompt tokens; the limit is 1024 tokens (lm.max_prompt_tokens)"
	url, _ := serveWith(t, tinyModel, nil, ready("a", invalidSynth{msg}, 4))
	resp, body := post(t, url, `{"input":"hi"}`)
	if resp.StatusCode != 400 {
		t.Fatalf("%d %s, want 400", resp.StatusCode, body)
	}
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatal(err)
	}
	if e.Error.Message != msg || e.Error.Param == nil || *e.Error.Param != "input" {
		t.Errorf("error %+v, want the instance's message about input", e.Error)
	}
}
