package engine

import (
	"errors"
	"slices"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

type testMode string

func (m *testMode) UnmarshalText(b []byte) (err error) {
	*m, err = ParseEnum[testMode](b, "a", "b")
	return err
}

// SharedTestOptions is exported, as an embedded set of options must be (ort.Options).
type SharedTestOptions struct {
	Threads int `json:"threads"`
}

type testOptions struct {
	SharedTestOptions
	Mode    testMode `json:"mode"`
	Sizes   []int    `json:"sizes"`
	On      bool     `json:"on"`
	skipped int
	Ignored int `json:"-"`
}

// A section decodes key by key into the options struct, an embedded struct's keys beside its own;
// every error names its key.
func TestParseOptions(t *testing.T) {
	if got := OptionKeys(testOptions{}); !slices.Equal(got, []string{"threads", "mode", "sizes", "on"}) {
		t.Fatalf("keys %v", got)
	}
	var o testOptions
	if err := ParseOptions("test", tts.EngineSection(`{"threads": 2, "mode": "b", "sizes": [], "on": true}`), &o); err != nil {
		t.Fatal(err)
	}
	if o.Threads != 2 || o.Mode != "b" || o.Sizes == nil || len(o.Sizes) != 0 || !o.On {
		t.Fatalf("parsed %+v", o)
	}
	o = testOptions{}
	if err := ParseOptions("test", tts.EngineSection(`{"mode": "", "sizes": null}`), &o); err != nil || o.Mode != "" || o.Sizes != nil {
		t.Fatalf("empty and null values: %+v, %v", o, err)
	}
	for section, want := range map[string]string{
		`{"mode": "c"}`:      `engine.mode: "c" is not one of [a b]`,
		`{"threads": "two"}`: `engine.threads: "two" is not a whole number`,
		`{"on": 1}`:          "engine.on: 1 is not true or false",
		`{"sizes": 4}`:       "engine.sizes: 4 is not a list of whole numbers",
		`{"Ignored": 1}`:     "engine.Ignored: unknown key; the test family's keys are threads, mode, sizes, on",
	} {
		err := ParseOptions("test", tts.EngineSection(section), &testOptions{})
		var oe *tts.OptionError
		if !errors.As(err, &oe) || err.Error() != want {
			t.Errorf("%s: %v, want the *tts.OptionError %s", section, err, want)
		}
	}
	if err := ParseOptions("test", tts.EngineSection(`[1]`), &testOptions{}); err == nil {
		t.Error("a list was taken for a section")
	}
	if err := ParseOptions("test", nil, testOptions{}); err == nil {
		t.Error("options not given by pointer were accepted")
	}
}
