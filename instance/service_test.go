package instance_test

import (
	"context"
	"errors"
	"testing"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/piper"
	"github.com/voxmux/voxmux/instance/staged"
	"github.com/voxmux/voxmux/tts"
)

func families() instance.Families { return instance.Families{piper.Family{}, staged.Family{}} }

// Each family claims its own models: a Piper voice folder goes to Piper, a staged manifest to the
// staged family.
func TestFamiliesDescribe(t *testing.T) {
	for path, kind := range map[string]string{"../models/tiny-piper": "piper", "../models/tiny/pipeline.yaml": "staged"} {
		d, err := families().Describe(path)
		if err != nil || d.Kind != kind {
			t.Errorf("Describe(%s) = %+v, %v; want kind %s", path, d, err, kind)
		}
	}
	if _, err := (instance.Families{}).Describe("../models/tiny/pipeline.yaml"); err == nil {
		t.Error("no family, yet a model was described")
	}
}

// Through the Service, as the instance process runs it: text with nothing to pronounce is a
// request error (the router answers 400), a voice speaks, and a second load is refused.
func TestServiceWithPiper(t *testing.T) {
	lib, err := ort.FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	s := instance.NewService(families(), func(string) string { return "" })
	defer s.Close()
	cfg := tts.LoadConfig{Manifest: "../models/tiny-piper", Provider: "cpu", ORTLibrary: lib}
	if _, err := s.Load(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	err = s.Synthesize(context.Background(), tts.Request{Text: "🫠"}, func(tts.Chunk) error { return nil })
	var ie *tts.Error
	if !errors.As(err, &ie) || ie.Kind != tts.ErrInvalid {
		t.Fatalf("emoji only: %v", err)
	}
	n := 0
	if err := s.Synthesize(context.Background(), tts.Request{Text: "Warm up.", Voice: "bob"}, func(tts.Chunk) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("bob: %v, %d chunks", err, n)
	}
	if _, err := s.Load(context.Background(), cfg); err == nil {
		t.Fatal("a second model loaded into one instance")
	}
	h, err := s.Health(context.Background())
	if err != nil || !h.Ready {
		t.Fatalf("health %+v, %v", h, err)
	}
}
