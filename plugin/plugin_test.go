package plugin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/voxmux/voxmux/tts"
)

// connect serves impl through the real gRPC server adapter and returns the real gRPC client
// adapter talking to it, in-process.
func connect(t *testing.T, impl Instance) Instance {
	t.Helper()
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		Name: &GRPCPlugin{Impl: impl},
	})
	// Close also stops the server, through go-plugin's controller service (calling server.Stop
	// as well races inside go-plugin).
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(Name)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	inst, ok := raw.(Instance)
	if !ok {
		t.Fatalf("Dispense returned %T, not an Instance", raw)
	}
	return inst
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestLoadRoundTrip(t *testing.T) {
	wantCfg := tts.LoadConfig{
		Manifest:        "/models/tiny/pipeline.yaml",
		Provider:        "cuda",
		ORTLibrary:      "/usr/lib/libonnxruntime.so.1",
		ProviderOptions: map[string]string{"device_id": "0", "gpu_mem_limit": "1073741824", "": "empty key"},
		MaxInflight:     7,
		GPUMemoryLimit:  tts.MemoryLimit{Fraction: 0.4},
		// The section crosses as it is: the plugin knows none of its keys.
		Engine: tts.EngineSection(`{"vocoder_batches":[1,4],"flow_workers":3,"made_up_knob":"any"}`),
	}
	wantInfo := tts.Info{
		CUDAVisibleDevices: "3,4",
		GPUs:               []tts.GPU{{Index: 0, UUID: "GPU-1", Name: "H100", MemoryTotal: 80 << 30}},
	}
	var gotCfg tts.LoadConfig
	inst := connect(t, &tts.MockInstance{LoadF: func(_ context.Context, cfg tts.LoadConfig) (tts.Info, error) {
		gotCfg = cfg
		return wantInfo, nil
	}})
	info, err := inst.Load(testContext(t), wantCfg)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if !reflect.DeepEqual(gotCfg, wantCfg) {
		t.Errorf("server saw LoadConfig\n%+v\nwant\n%+v", gotCfg, wantCfg)
	}
	if !reflect.DeepEqual(info, wantInfo) {
		t.Errorf("client got Info\n%+v\nwant\n%+v", info, wantInfo)
	}
}

func TestLoadZeroValues(t *testing.T) {
	inst := connect(t, &tts.MockInstance{LoadF: func(_ context.Context, cfg tts.LoadConfig) (tts.Info, error) {
		if !reflect.DeepEqual(cfg, tts.LoadConfig{}) {
			return tts.Info{}, fmt.Errorf("unexpected config %+v", cfg)
		}
		return tts.Info{}, nil
	}})
	info, err := inst.Load(testContext(t), tts.LoadConfig{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if info.CUDAVisibleDevices != "" || len(info.GPUs) != 0 {
		t.Errorf("Info = %+v, want zero", info)
	}
}

// A failed Load comes back as an *tts.Error with the server's message. (Its kind is not
// checked: the server adapter reports every Load failure as FailedPrecondition, i.e. ErrNotReady.)
func TestLoadError(t *testing.T) {
	inst := connect(t, &tts.MockInstance{LoadF: func(context.Context, tts.LoadConfig) (tts.Info, error) {
		return tts.Info{}, errors.New("manifest: no such file")
	}})
	_, err := inst.Load(testContext(t), tts.LoadConfig{Manifest: "x"})
	var ie *tts.Error
	if !errors.As(err, &ie) {
		t.Fatalf("Load error = %v (%T), want *tts.Error", err, err)
	}
	if !strings.Contains(ie.Msg, "manifest: no such file") {
		t.Errorf("Msg = %q, want the server's message", ie.Msg)
	}
}

func TestSynthesizeStream(t *testing.T) {
	chunks := []tts.Chunk{
		{PCM: []float32{0, 1, -1, 0.5, -0.5, 0.25, -0.123456789}, SampleRate: 24000, Index: 0, Text: &tts.TextSpan{Start: 0, End: 7}},
		{PCM: []float32{
			float32(math.Copysign(0, -1)), // -0 keeps its sign bit
			math.MaxFloat32, -math.MaxFloat32,
			math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, // subnormals
			float32(math.Inf(1)), float32(math.Inf(-1)),
			1e-30, -3.4e38, 0.1, math.Float32frombits(0x3f800001), // 1 + 1ulp
		}, SampleRate: 24000, Index: 1},
		{PCM: []float32{0.75}, SampleRate: 22050, Index: 2, Text: &tts.TextSpan{Start: 7, End: 17}},
		{PCM: []float32{}, SampleRate: 24000, Index: 3},
		{PCM: oddRamp(4801), SampleRate: 48000, Index: 4},
	}
	wantReq := tts.Request{ID: "req-42", Text: "héllo, wörld ✓", Voice: "alloy", Speed: 1.25, Seed: math.MaxUint64, Instructions: "Speak softly."}
	var gotReq tts.Request
	inst := connect(t, &tts.MockInstance{SynthesizeF: func(_ context.Context, req tts.Request, emit func(tts.Chunk) error) error {
		gotReq = req
		for _, c := range chunks {
			if err := emit(c); err != nil {
				return err
			}
		}
		return nil
	}})

	var got []tts.Chunk
	err := inst.Synthesize(testContext(t), wantReq, func(c tts.Chunk) error {
		got = append(got, c)
		return nil
	})
	if err != nil {
		t.Fatalf("Synthesize: %v", err)
	}
	if gotReq != wantReq {
		t.Errorf("server saw Request %+v, want %+v", gotReq, wantReq)
	}
	if len(got) != len(chunks) {
		t.Fatalf("got %d chunks, want %d", len(got), len(chunks))
	}
	for i, want := range chunks {
		g := got[i]
		if g.Index != want.Index || g.SampleRate != want.SampleRate {
			t.Errorf("chunk %d: index %d rate %d, want index %d rate %d", i, g.Index, g.SampleRate, want.Index, want.SampleRate)
		}
		// The text span crosses the wire, and its absence too (a model that cannot say).
		if (g.Text == nil) != (want.Text == nil) || g.Text != nil && *g.Text != *want.Text {
			t.Errorf("chunk %d: text span %v, want %v", i, g.Text, want.Text)
		}
		if len(g.PCM) != len(want.PCM) {
			t.Errorf("chunk %d: %d samples, want %d", i, len(g.PCM), len(want.PCM))
			continue
		}
		for j := range want.PCM {
			if math.Float32bits(g.PCM[j]) != math.Float32bits(want.PCM[j]) {
				t.Errorf("chunk %d sample %d: bits %#08x, want %#08x", i, j, math.Float32bits(g.PCM[j]), math.Float32bits(want.PCM[j]))
			}
		}
	}
}

// oddRamp is n distinct, NaN-free samples spanning [-1, 1].
func oddRamp(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(2*float64(i)/float64(n-1) - 1)
	}
	return s
}

func TestSynthesizeNoChunks(t *testing.T) {
	inst := connect(t, &tts.MockInstance{SynthesizeF: func(context.Context, tts.Request, func(tts.Chunk) error) error {
		return nil
	}})
	calls := 0
	if err := inst.Synthesize(testContext(t), tts.Request{Text: "x"}, func(tts.Chunk) error { calls++; return nil }); err != nil {
		t.Fatalf("Synthesize: %v", err)
	}
	if calls != 0 {
		t.Errorf("emit called %d times, want 0", calls)
	}
}

// When the router's emit fails (its HTTP client went away), the client returns that error at
// once and the instance sees its request context cancelled.
func TestSynthesizeEmitErrorCancelsServer(t *testing.T) {
	serverCancelled := make(chan struct{})
	serverReturned := make(chan error, 1)
	inst := connect(t, &tts.MockInstance{SynthesizeF: func(ctx context.Context, _ tts.Request, emit func(tts.Chunk) error) error {
		var err error
		// Keep producing until the stream breaks; bounded in case it never does.
		for i := 0; i < 100000 && err == nil && ctx.Err() == nil; i++ {
			err = emit(tts.Chunk{PCM: []float32{float32(i)}, SampleRate: 24000, Index: i})
		}
		select {
		case <-ctx.Done():
			close(serverCancelled)
		case <-time.After(10 * time.Second):
		}
		if err == nil {
			err = ctx.Err()
		}
		serverReturned <- err
		return err
	}})

	errStop := errors.New("client went away")
	var emitted []int
	err := inst.Synthesize(testContext(t), tts.Request{Text: "x"}, func(c tts.Chunk) error {
		emitted = append(emitted, c.Index)
		if c.Index == 2 {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) {
		t.Errorf("Synthesize = %v, want the emit error", err)
	}
	if want := []int{0, 1, 2}; !slices.Equal(emitted, want) {
		t.Errorf("emit saw chunks %v, want %v (nothing after the failing one)", emitted, want)
	}
	select {
	case <-serverCancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("server's context was not cancelled after emit failed")
	}
	select {
	case <-serverReturned:
	case <-time.After(10 * time.Second):
		t.Fatal("server's Synthesize did not return")
	}
}

// A router that cancels its request context mid-stream gets context.Canceled and the instance
// sees the cancellation.
func TestSynthesizeClientCancel(t *testing.T) {
	started := make(chan struct{})
	serverCancelled := make(chan struct{})
	inst := connect(t, &tts.MockInstance{SynthesizeF: func(ctx context.Context, _ tts.Request, emit func(tts.Chunk) error) error {
		if err := emit(tts.Chunk{PCM: []float32{1}, SampleRate: 24000}); err != nil {
			return err
		}
		close(started)
		select {
		case <-ctx.Done():
			close(serverCancelled)
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("never cancelled")
		}
	}})
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	go func() {
		<-started
		cancel()
	}()
	err := inst.Synthesize(ctx, tts.Request{Text: "x"}, func(tts.Chunk) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Synthesize = %v, want context.Canceled", err)
	}
	select {
	case <-serverCancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("server's context was not cancelled")
	}
}

func TestErrorKindsCrossTheWire(t *testing.T) {
	kinds := []struct {
		name string
		kind tts.ErrorKind
	}{
		{"invalid", tts.ErrInvalid},
		{"busy", tts.ErrBusy},
		{"not ready", tts.ErrNotReady},
		{"internal", tts.ErrInternal},
	}
	type call struct {
		name string
		do   func(context.Context, Instance) error
	}
	calls := []call{
		{"Synthesize", func(ctx context.Context, inst Instance) error {
			return inst.Synthesize(ctx, tts.Request{Text: "x"}, func(tts.Chunk) error { return nil })
		}},
		{"Synthesize after a chunk", func(ctx context.Context, inst Instance) error {
			return inst.Synthesize(ctx, tts.Request{Text: "mid"}, func(tts.Chunk) error { return nil })
		}},
		{"Health", func(ctx context.Context, inst Instance) error {
			_, err := inst.Health(ctx)
			return err
		}},
	}
	for _, k := range kinds {
		for _, wrapped := range []bool{false, true} {
			serverErr := error(&tts.Error{Kind: k.kind, Msg: "boom: " + k.name})
			if wrapped {
				serverErr = fmt.Errorf("engine: %w", serverErr)
			}
			fake := &tts.MockInstance{
				SynthesizeF: func(_ context.Context, req tts.Request, emit func(tts.Chunk) error) error {
					if req.Text == "mid" {
						if err := emit(tts.Chunk{PCM: []float32{1}}); err != nil {
							return err
						}
					}
					return serverErr
				},
				HealthF: func(context.Context) (tts.Health, error) { return tts.Health{}, serverErr },
			}
			inst := connect(t, fake)
			for _, c := range calls {
				name := fmt.Sprintf("%s/%s/wrapped=%v", c.name, k.name, wrapped)
				t.Run(name, func(t *testing.T) {
					err := c.do(testContext(t), inst)
					var ie *tts.Error
					if !errors.As(err, &ie) {
						t.Fatalf("error = %v (%T), want *tts.Error", err, err)
					}
					if ie.Kind != k.kind {
						t.Errorf("Kind = %d, want %d", ie.Kind, k.kind)
					}
					if !strings.Contains(ie.Msg, "boom: "+k.name) {
						t.Errorf("Msg = %q, want the server's message", ie.Msg)
					}
				})
			}
		}
	}

	// The field an invalid request is about (tts.Error.Param) crosses too, wrapped or not.
	for _, wrapped := range []bool{false, true} {
		serverErr := error(tts.InvalidVoice(`voice "carol" is not a voice of model "m"; its voices: alice`))
		if wrapped {
			serverErr = fmt.Errorf("engine: %w", serverErr)
		}
		inst := connect(t, &tts.MockInstance{
			SynthesizeF: func(context.Context, tts.Request, func(tts.Chunk) error) error { return serverErr },
		})
		err := inst.Synthesize(testContext(t), tts.Request{Text: "x"}, func(tts.Chunk) error { return nil })
		var ie *tts.Error
		if !errors.As(err, &ie) || ie.Kind != tts.ErrInvalid || ie.Param != "voice" || !strings.Contains(ie.Msg, `"carol"`) {
			t.Errorf("wrapped=%v: %#v, want an invalid request about voice", wrapped, err)
		}
	}

	t.Run("plain error is internal", func(t *testing.T) {
		inst := connect(t, &tts.MockInstance{
			SynthesizeF: func(context.Context, tts.Request, func(tts.Chunk) error) error {
				return errors.New("onnxruntime: out of memory")
			},
		})
		err := inst.Synthesize(testContext(t), tts.Request{Text: "x"}, func(tts.Chunk) error { return nil })
		var ie *tts.Error
		if !errors.As(err, &ie) || ie.Kind != tts.ErrInternal {
			t.Fatalf("error = %v (%T), want *tts.Error of kind ErrInternal", err, err)
		}
		if ie.Msg != "onnxruntime: out of memory" {
			t.Errorf("Msg = %q", ie.Msg)
		}
	})

	for _, ctxErr := range []error{context.Canceled, context.DeadlineExceeded} {
		t.Run(ctxErr.Error(), func(t *testing.T) {
			inst := connect(t, &tts.MockInstance{
				SynthesizeF: func(context.Context, tts.Request, func(tts.Chunk) error) error {
					return fmt.Errorf("flow: %w", ctxErr)
				},
				HealthF: func(context.Context) (tts.Health, error) { return tts.Health{}, ctxErr },
			})
			err := inst.Synthesize(testContext(t), tts.Request{Text: "x"}, func(tts.Chunk) error { return nil })
			if !errors.Is(err, ctxErr) {
				t.Errorf("Synthesize = %v, want errors.Is %v", err, ctxErr)
			}
			var ie *tts.Error
			if errors.As(err, &ie) {
				t.Errorf("Synthesize = %v is an *tts.Error, want a context error", err)
			}
			if _, err := inst.Health(testContext(t)); !errors.Is(err, ctxErr) {
				t.Errorf("Health = %v, want errors.Is %v", err, ctxErr)
			}
		})
	}
}

func TestHealthRoundTrip(t *testing.T) {
	for _, want := range []tts.Health{
		{Ready: true, Message: "ok", Inflight: 5},
		{Ready: false, Message: "no pipeline loaded", Inflight: 0},
		{Ready: true, Message: "", Inflight: 1 << 20},
		{Ready: true, Message: "ok", Inflight: 2, Stages: []tts.StageStats{{Stage: "lm_decode", Batches: 7, Items: 19, Busy: 1500 * time.Millisecond}, {Stage: "vocoder", Batches: 1 << 40, Items: 1<<40 + 3, Wait: 90 * time.Second}}},
		{Ready: true, Message: "ok", Cancels: tts.CancelStats{Count: 3, Freeing: 45 * time.Millisecond, MaxFreeing: 30 * time.Millisecond}},
	} {
		inst := connect(t, &tts.MockInstance{HealthF: func(context.Context) (tts.Health, error) { return want, nil }})
		got, err := inst.Health(testContext(t))
		if err != nil {
			t.Fatalf("Health: %v", err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Health = %+v, want %+v", got, want)
		}
	}
}

// Several requests share one connection at once; each gets its own chunks.
func TestSynthesizeConcurrent(t *testing.T) {
	inst := connect(t, &tts.MockInstance{SynthesizeF: func(_ context.Context, req tts.Request, emit func(tts.Chunk) error) error {
		for i := 0; i < 20; i++ {
			if err := emit(tts.Chunk{PCM: []float32{float32(len(req.ID)), float32(i)}, SampleRate: 24000, Index: i}); err != nil {
				return err
			}
		}
		return nil
	}})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := 0; r < 8; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := strings.Repeat("x", r+1)
			next := 0
			err := inst.Synthesize(testContext(t), tts.Request{ID: id, Text: "x"}, func(c tts.Chunk) error {
				if c.Index != next || c.PCM[0] != float32(len(id)) || c.PCM[1] != float32(next) {
					return fmt.Errorf("request %s: chunk %+v, want index %d", id, c, next)
				}
				next++
				return nil
			})
			if err == nil && next != 20 {
				err = fmt.Errorf("request %s: %d chunks, want 20", id, next)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// samePrompt compares prompts field by field; an empty slice and nil are the same (the wire
// does not tell them apart).
func samePrompt(a, b *tts.VoicePrompt) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	if a == nil {
		return true
	}
	bits := func(x, y []float32) bool {
		return slices.EqualFunc(x, y, func(u, v float32) bool { return math.Float32bits(u) == math.Float32bits(v) })
	}
	return a.Text == b.Text && slices.Equal(a.SpeechTokens, b.SpeechTokens) && bits(a.Mel, b.Mel) && a.MelBins == b.MelBins &&
		bits(a.Embedding, b.Embedding) && bits(a.Latents, b.Latents) && a.LatentDim == b.LatentDim
}

// Voice prompts cross the wire both ways, each family's fields: ExtractVoice's answer (instance to
// router) and a request's prompt (router to instance).
func TestVoicePromptRoundTrip(t *testing.T) {
	prompts := map[string]tts.VoicePrompt{
		"tokens": {Text: "<|endofprompt|>héllo", SpeechTokens: []int64{0, 6560, math.MaxInt64}, Mel: []float32{0.5, -1, 2, float32(math.Copysign(0, -1))},
			MelBins: 2, Embedding: []float32{0.1, math.SmallestNonzeroFloat32}},
		// A latent-space model's: 3 frames of 4 values, nothing of the others.
		"latents": {Text: "hello there", Latents: []float32{0, 1, -1, 0.25, 1e-30, -3.4e38, 0.1, 7, 8, 9, 10, math.Float32frombits(0x3f800001)}, LatentDim: 4},
		"both":    {Text: "x", SpeechTokens: []int64{1}, Mel: []float32{1}, MelBins: 1, Embedding: []float32{2}, Latents: []float32{3, 4}, LatentDim: 2},
	}
	for name, want := range prompts {
		t.Run(name, func(t *testing.T) {
			clip := tts.VoiceClip{PCM: oddRamp(1601), SampleRate: 16000, Text: "hello there"}
			var gotReq tts.Request
			inst := connect(t, &tts.MockInstance{
				ExtractF: func(_ context.Context, c tts.VoiceClip) (tts.VoicePrompt, error) {
					if c.SampleRate != clip.SampleRate || c.Text != clip.Text || !slices.Equal(c.PCM, clip.PCM) {
						return tts.VoicePrompt{}, fmt.Errorf("server saw clip rate %d text %q, %d samples", c.SampleRate, c.Text, len(c.PCM))
					}
					return want, nil
				},
				SynthesizeF: func(_ context.Context, req tts.Request, emit func(tts.Chunk) error) error {
					gotReq = req
					return nil
				},
			})
			got, err := inst.ExtractVoice(testContext(t), clip)
			if err != nil {
				t.Fatalf("ExtractVoice: %v", err)
			}
			if !samePrompt(&got, &want) {
				t.Errorf("client got prompt\n%+v\nwant\n%+v", got, want)
			}
			if err := inst.Synthesize(testContext(t), tts.Request{ID: "r", Text: "hi", Prompt: &want}, func(tts.Chunk) error { return nil }); err != nil {
				t.Fatalf("Synthesize: %v", err)
			}
			if !samePrompt(gotReq.Prompt, &want) {
				t.Errorf("server saw prompt\n%+v\nwant\n%+v", gotReq.Prompt, want)
			}
		})
	}
}

func TestEncodeDecodeF32(t *testing.T) {
	in := []float32{0, 1, -1, float32(math.Copysign(0, -1)), math.MaxFloat32, math.SmallestNonzeroFloat32, 0.3}
	b := encodeF32(in)
	if len(b) != 4*len(in) {
		t.Fatalf("encoded %d bytes, want %d", len(b), 4*len(in))
	}
	// Little-endian: 1.0 is 0x3f800000.
	if !slices.Equal(b[4:8], []byte{0x00, 0x00, 0x80, 0x3f}) {
		t.Errorf("1.0 encoded as % x, want 00 00 80 3f", b[4:8])
	}
	out := decodeF32(b)
	for i := range in {
		if math.Float32bits(out[i]) != math.Float32bits(in[i]) {
			t.Errorf("sample %d: %v, want %v", i, out[i], in[i])
		}
	}
	if got := decodeF32(nil); len(got) != 0 {
		t.Errorf("decodeF32(nil) = %v", got)
	}
}

func TestInstanceEnv(t *testing.T) {
	host := []string{
		"CUDA_VISIBLE_DEVICES=7",
		"PATH=/usr/bin:/bin",
		"HOME=/home/vox",
		"LD_LIBRARY_PATH=/opt/ort/lib",
		"CUDA_CACHE_PATH=/var/cache/cuda",
		"NVIDIA_DRIVER_CAPABILITIES=compute,utility",
		"SECRET_TOKEN=hunter2",
		"VOXMUX_PLUGIN=x",
		"AWS_SECRET_ACCESS_KEY=abc",
		"VOXMUX_ORT_TELEMETRY=1",
		"MALFORMED",
	}
	tests := []struct {
		name     string
		gpus     []int
		wantCUDA string
	}{
		{name: "two GPUs", gpus: []int{3, 4}, wantCUDA: "3,4"},
		{name: "one GPU", gpus: []int{0}, wantCUDA: "0"},
		{name: "no GPUs hides all", gpus: nil, wantCUDA: ""},
		{name: "empty GPU list hides all", gpus: []int{}, wantCUDA: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := InstanceEnv(host, tt.gpus)
			vals := map[string][]string{}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Errorf("entry %q has no '='", kv)
				}
				vals[k] = append(vals[k], v)
			}
			if got := vals["CUDA_VISIBLE_DEVICES"]; len(got) != 1 || got[0] != tt.wantCUDA {
				t.Errorf("CUDA_VISIBLE_DEVICES = %q, want exactly one %q", got, tt.wantCUDA)
			}
			for k, v := range map[string]string{
				"PATH":                       "/usr/bin:/bin",
				"HOME":                       "/home/vox",
				"LD_LIBRARY_PATH":            "/opt/ort/lib",
				"CUDA_CACHE_PATH":            "/var/cache/cuda",
				"NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
				"VOXMUX_ORT_TELEMETRY":       "1", // the operator's consent to ONNX Runtime's telemetry
			} {
				if got := vals[k]; len(got) != 1 || got[0] != v {
					t.Errorf("%s = %q, want [%q]", k, got, v)
				}
			}
			for _, k := range []string{"SECRET_TOKEN", "VOXMUX_PLUGIN", "AWS_SECRET_ACCESS_KEY", "MALFORMED"} {
				if _, ok := vals[k]; ok {
					t.Errorf("%s was passed on", k)
				}
			}
			if got := vals["CUDA_DEVICE_ORDER"]; len(got) != 1 || got[0] != "PCI_BUS_ID" {
				t.Errorf("CUDA_DEVICE_ORDER = %q, want PCI_BUS_ID (config indices are NVML's)", got)
			}
			if len(env) != 8 {
				t.Errorf("env has %d entries, want 8: %q", len(env), env)
			}
		})
	}
}

func TestInstanceEnvEmptyHost(t *testing.T) {
	env := InstanceEnv(nil, []int{1})
	if !slices.Equal(env, []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=1"}) {
		t.Errorf("InstanceEnv(nil, [1]) = %q", env)
	}
}

func TestInstanceEnvKeepsOperatorsDeviceOrder(t *testing.T) {
	env := InstanceEnv([]string{"CUDA_DEVICE_ORDER=FASTEST_FIRST"}, []int{1})
	if !slices.Equal(env, []string{"CUDA_DEVICE_ORDER=FASTEST_FIRST", "CUDA_VISIBLE_DEVICES=1"}) {
		t.Errorf("InstanceEnv = %q", env)
	}
}

func TestIsLaunchedByRouter(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want bool
	}{
		{name: "cookie set", env: map[string]string{Handshake.MagicCookieKey: Handshake.MagicCookieValue}, want: true},
		{name: "literal cookie", env: map[string]string{"VOXMUX_PLUGIN": "d6b1c7c4-voxmux-instance"}, want: true},
		{name: "no cookie", env: map[string]string{}, want: false},
		{name: "wrong value", env: map[string]string{Handshake.MagicCookieKey: "x"}, want: false},
		{name: "empty value", env: map[string]string{Handshake.MagicCookieKey: ""}, want: false},
		{name: "value under another key", env: map[string]string{"OTHER": Handshake.MagicCookieValue}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			if got := IsLaunchedByRouter(getenv); got != tt.want {
				t.Errorf("IsLaunchedByRouter = %v, want %v", got, tt.want)
			}
		})
	}
}
