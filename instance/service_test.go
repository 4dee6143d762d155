package instance_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/instance/piper"
	"github.com/voxmux/voxmux/instance/staged"
	"github.com/voxmux/voxmux/instance/voxcpm"
	"github.com/voxmux/voxmux/tts"
)

// families is cmd/voxmux's list: voxcpm before staged, which claims every path.
func families() instance.Families {
	return instance.Families{piper.Family{}, voxcpm.Family{}, staged.Family{}}
}

// Each family claims its own models: a Piper voice folder goes to Piper, a staged manifest to the
// staged family, a VoxCPM export (where `make tiny-voxcpm` has made one) to the voxcpm family.
func TestFamiliesDescribe(t *testing.T) {
	models := map[string]string{"../models/tiny-piper": "piper", "../models/tiny/pipeline.yaml": "staged"}
	const vox = "../models/tiny-voxcpm/pipeline.yaml"
	if _, err := os.Stat(vox); err == nil || os.Getenv("VOXMUX_REQUIRE_TINY_VOXCPM") != "" {
		models[vox] = voxcpm.Kind
	}
	for path, kind := range models {
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

// blockFamily serves one fake model whose requests run until released.
type blockFamily struct{ release chan struct{} }

func (blockFamily) Name() string                                { return "block" }
func (blockFamily) OptionKeys() []string                        { return nil }
func (blockFamily) ParseOptions(tts.EngineSection) (any, error) { return nil, nil }
func (blockFamily) Claims(string) bool                          { return true }
func (blockFamily) Describe(string) (tts.Description, error)    { return tts.Description{}, nil }
func (f blockFamily) Open(tts.LoadConfig) (instance.Runner, tts.Description, error) {
	return blockRunner(f), tts.Description{}, nil
}

type blockRunner blockFamily

func (r blockRunner) Synthesize(ctx context.Context, _ tts.Request, _ func(tts.Chunk) error) error {
	select {
	case <-r.release:
	case <-ctx.Done():
	}
	return nil
}
func (blockRunner) Close() error            { return nil }
func (blockRunner) Report() instance.Report { return instance.Report{} }

// A request that finds every slot taken waits a moment for one: the router frees a cancelled
// request's slot a moment before the cancel reaches the instance. A slot that does not come back
// within the grace is busy.
func TestServiceWaitsBrieflyForASlot(t *testing.T) {
	f := blockFamily{release: make(chan struct{})}
	s := instance.NewService(instance.Families{f}, func(string) string { return "" })
	defer s.Close()
	if _, err := s.Load(context.Background(), tts.LoadConfig{Manifest: "fake", MaxInflight: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- s.Synthesize(ctx, tts.Request{ID: "held"}, nil) }()
	for {
		if h, _ := s.Health(context.Background()); h.Inflight == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// The held request is cancelled a moment after the next one arrives: that one gets its slot.
	time.AfterFunc(50*time.Millisecond, cancel)
	next := make(chan error, 1)
	go func() { next <- s.Synthesize(context.Background(), tts.Request{ID: "next"}, nil) }()
	<-first
	close(f.release)
	if err := <-next; err != nil {
		t.Fatalf("the request behind a cancelled one: %v", err)
	}
	// A slot held past the grace: busy.
	hold := make(chan struct{})
	g := blockFamily{release: hold}
	s2 := instance.NewService(instance.Families{g}, func(string) string { return "" })
	defer s2.Close()
	if _, err := s2.Load(context.Background(), tts.LoadConfig{Manifest: "fake", MaxInflight: 1}); err != nil {
		t.Fatal(err)
	}
	go s2.Synthesize(context.Background(), tts.Request{ID: "held"}, nil)
	for {
		if h, _ := s2.Health(context.Background()); h.Inflight == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	err := s2.Synthesize(context.Background(), tts.Request{ID: "late"}, nil)
	var ie *tts.Error
	if !errors.As(err, &ie) || ie.Kind != tts.ErrBusy {
		t.Fatalf("a slot held past the grace: %v, want busy", err)
	}
	close(hold)
}

// model: naming a folder that is not a model says what to name instead, not a Piper error: an
// export folder's manifest, a published checkpoint's export command.
func TestFamiliesExplainFolders(t *testing.T) {
	for _, c := range []struct {
		files []string
		want  string
	}{
		{[]string{"pipeline.yaml", "step.onnx"}, "is an export folder: name its manifest"},
		{[]string{"cosyvoice3.yaml", "llm.pt", "flow.pt"}, "scripts.cosyvoice3.export"},
		{[]string{"audiovae.pth", "config.json", "model.safetensors"}, "scripts.voxcpm.export"},
	} {
		dir := t.TempDir()
		for _, f := range c.files {
			if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := families().Describe(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "iper") {
			t.Errorf("%v: %v, want an error saying %q", c.files, err, c.want)
		}
	}
}
