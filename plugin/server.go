package plugin

import (
	"context"
	"encoding/binary"
	"errors"
	"math"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/voxmux/voxmux/plugin/proto"
	"github.com/voxmux/voxmux/tts"
)

// grpcServer adapts an Instance to the generated gRPC service.
type grpcServer struct {
	proto.UnimplementedInstanceServer
	impl Instance
}

func (s *grpcServer) Load(ctx context.Context, r *proto.LoadRequest) (*proto.LoadResponse, error) {
	info, err := s.impl.Load(ctx, tts.LoadConfig{
		Manifest:        r.Manifest,
		Provider:        r.Provider,
		ORTLibrary:      r.OrtLibrary,
		ProviderOptions: r.ProviderOptions,
		MaxInflight:     int(r.MaxInflight),
		Placement:       r.Placement,
		GPUMemoryLimit:  memoryLimitFromProto(r.GpuMemoryLimit),
		Engine:          r.EngineSection,
	})
	if err != nil {
		var ie *tts.Error
		if errors.As(err, &ie) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, toStatus(err)
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error()) // a failed load: not ready
	}
	gpus := make([]*proto.Gpu, len(info.GPUs))
	for i, g := range info.GPUs {
		gpus[i] = &proto.Gpu{Index: uint32(g.Index), Uuid: g.UUID, Name: g.Name, MemoryTotal: g.MemoryTotal}
	}
	return &proto.LoadResponse{
		Gpus:               gpus,
		CudaVisibleDevices: info.CUDAVisibleDevices,
	}, nil
}

func (s *grpcServer) Synthesize(r *proto.SynthesizeRequest, out proto.Instance_SynthesizeServer) error {
	req := tts.Request{ID: r.RequestId, Text: r.Text, Voice: r.Voice, Speed: r.Speed, Seed: r.Seed, Instructions: r.Instructions, Prompt: promptFromProto(r.Prompt)}
	err := s.impl.Synthesize(out.Context(), req, func(c tts.Chunk) error {
		m := &proto.AudioChunk{PcmF32Le: encodeF32(c.PCM), SampleRate: uint32(c.SampleRate), Index: uint32(c.Index)}
		if c.Text != nil {
			m.Text = &proto.TextSpan{Start: uint32(c.Text.Start), End: uint32(c.Text.End)}
		}
		return out.Send(m)
	})
	return toStatus(err)
}

func (s *grpcServer) ExtractVoice(ctx context.Context, r *proto.VoiceClip) (*proto.VoicePrompt, error) {
	p, err := s.impl.ExtractVoice(ctx, tts.VoiceClip{PCM: decodeF32(r.PcmF32Le), SampleRate: int(r.SampleRate), Text: r.Text})
	if err != nil {
		return nil, toStatus(err)
	}
	return promptToProto(&p), nil
}

func (s *grpcServer) Health(ctx context.Context, _ *proto.HealthRequest) (*proto.HealthResponse, error) {
	h, err := s.impl.Health(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &proto.HealthResponse{Ready: h.Ready, Message: h.Message, Inflight: uint32(h.Inflight),
		Cancels: h.Cancels.Count, CancelFreeingNs: uint64(max(h.Cancels.Freeing, 0)), CancelFreeingMaxNs: uint64(max(h.Cancels.MaxFreeing, 0)),
		PromptCacheHits: h.PromptCache.Hits, PromptCacheMisses: h.PromptCache.Misses, PromptCacheEvictions: h.PromptCache.Evictions,
		PromptCacheBytes: uint64(max(h.PromptCache.Bytes, 0)), PromptCacheVoices: uint32(max(h.PromptCache.Voices, 0)),
		FlowKvBytes: uint64(max(h.FlowMemory.Bytes, 0)), FlowKvPeakBytes: uint64(max(h.FlowMemory.Peak, 0)), FlowKvLimitBytes: uint64(max(h.FlowMemory.Limit, 0)),
		FlowKvWaits: h.FlowMemory.Waits, FlowKvPreemptions: h.FlowMemory.Preemptions}
	for _, st := range h.Stages {
		resp.Stages = append(resp.Stages, &proto.StageStats{Stage: st.Stage, Batches: st.Batches, Items: st.Items, BusyNs: uint64(max(st.Busy, 0)), WaitNs: uint64(max(st.Wait, 0))})
	}
	return resp, nil
}

// toStatus keeps the kind of an instance error across the wire.
func toStatus(err error) error {
	var ie *tts.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.As(err, &ie) && ie.Kind == tts.ErrInvalid:
		st := status.New(codes.InvalidArgument, err.Error())
		if ie.Param != "" {
			// The field the error is about travels as gRPC's standard BadRequest detail.
			br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: ie.Param, Description: ie.Msg}}}
			if d, derr := st.WithDetails(br); derr == nil {
				st = d
			}
		}
		return st.Err()
	case errors.As(err, &ie) && ie.Kind == tts.ErrBusy:
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.As(err, &ie) && ie.Kind == tts.ErrNotReady:
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func encodeF32(pcm []float32) []byte {
	b := make([]byte, 4*len(pcm))
	for i, v := range pcm {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func decodeF32(b []byte) []float32 {
	pcm := make([]float32, len(b)/4)
	for i := range pcm {
		pcm[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return pcm
}
