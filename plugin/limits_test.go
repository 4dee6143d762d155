package plugin

import (
	"context"
	"errors"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/voxmux/voxmux/plugin/proto"
	"github.com/voxmux/voxmux/tts"
)

// serveWith serves impl on srv, as an instance does, and returns the router's client for it,
// dialled with the router's options.
func serveWith(t *testing.T, srv *grpc.Server, impl Instance) Instance {
	t.Helper()
	proto.RegisterInstanceServer(srv, &grpcServer{impl: impl})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append(dialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &grpcClient{c: proto.NewInstanceClient(conn)}
}

func countingExtractor(n *int) *tts.MockInstance {
	return &tts.MockInstance{ExtractF: func(_ context.Context, c tts.VoiceClip) (tts.VoicePrompt, error) {
		*n = len(c.PCM)
		return tts.VoicePrompt{Text: c.Text, Latents: make([]float32, 4), LatentDim: 4}, nil
	}}
}

// A clip of the longest length the router takes (30 s) reaches the instance at 48 and 96 kHz:
// gRPC's default 4 MiB held 25 s at 48 kHz.
func TestLongClipCrossesTheWire(t *testing.T) {
	var got int
	inst := serveWith(t, newGRPCServer(nil), countingExtractor(&got))
	for _, rate := range []int{44100, 48000, 96000} {
		n := 30 * rate
		if _, err := inst.ExtractVoice(testContext(t), tts.VoiceClip{PCM: make([]float32, n), SampleRate: rate, Text: "hello"}); err != nil {
			t.Fatalf("30 s at %d Hz: %v", rate, err)
		}
		if got != n {
			t.Fatalf("30 s at %d Hz: the instance saw %d samples, want %d", rate, got, n)
		}
	}
}

// A message over an instance's limit is an invalid request, not a busy instance (which the router
// would answer 429, and clients retry).
func TestTooLargeMessageIsNotBusy(t *testing.T) {
	var got int
	inst := serveWith(t, grpc.NewServer(grpc.MaxRecvMsgSize(1<<20)), countingExtractor(&got))
	_, err := inst.ExtractVoice(testContext(t), tts.VoiceClip{PCM: make([]float32, 1<<20), SampleRate: 48000, Text: "hello"})
	var ie *tts.Error
	if !errors.As(err, &ie) || ie.Kind != tts.ErrInvalid {
		t.Fatalf("a clip over the instance's message limit: %v, want an invalid request", err)
	}
	// A busy instance is still busy.
	busy := serveWith(t, newGRPCServer(nil), &tts.MockInstance{ExtractF: func(context.Context, tts.VoiceClip) (tts.VoicePrompt, error) {
		return tts.VoicePrompt{}, &tts.Error{Kind: tts.ErrBusy, Msg: "every slot is taken"}
	}})
	_, err = busy.ExtractVoice(testContext(t), tts.VoiceClip{PCM: make([]float32, 16000), SampleRate: 16000, Text: "hello"})
	if !errors.As(err, &ie) || ie.Kind != tts.ErrBusy {
		t.Fatalf("a busy instance: %v, want busy", err)
	}
}
