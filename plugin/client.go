package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/voxmux/voxmux/plugin/proto"
	"github.com/voxmux/voxmux/tts"
)

// grpcClient adapts the generated gRPC client to Instance.
type grpcClient struct {
	c proto.InstanceClient
}

func (c *grpcClient) Load(ctx context.Context, cfg tts.LoadConfig) (tts.Info, error) {
	r, err := c.c.Load(ctx, &proto.LoadRequest{
		Manifest:        cfg.Manifest,
		Provider:        cfg.Provider,
		OrtLibrary:      cfg.ORTLibrary,
		ProviderOptions: cfg.ProviderOptions,
		MaxInflight:     uint32(cfg.MaxInflight),
		Placement:       cfg.Placement,
		GpuMemoryLimit:  memoryLimitToProto(cfg.GPUMemoryLimit),
		EngineSection:   cfg.Engine,
	})
	if err != nil {
		return tts.Info{}, fromStatus(err)
	}
	var gpus []tts.GPU
	for _, g := range r.Gpus {
		gpus = append(gpus, tts.GPU{Index: int(g.Index), UUID: g.Uuid, Name: g.Name, MemoryTotal: g.MemoryTotal})
	}
	return tts.Info{
		GPUs:               gpus,
		CUDAVisibleDevices: r.CudaVisibleDevices,
	}, nil
}

func (c *grpcClient) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the server's stream when emit fails
	st, err := c.c.Synthesize(ctx, &proto.SynthesizeRequest{RequestId: req.ID, Text: req.Text, Voice: req.Voice, Speed: req.Speed, Seed: req.Seed, Instructions: req.Instructions, Prompt: promptToProto(req.Prompt)})
	if err != nil {
		return fromStatus(err)
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fromStatus(err)
		}
		c := tts.Chunk{PCM: decodeF32(m.PcmF32Le), SampleRate: int(m.SampleRate), Index: int(m.Index)}
		if m.Text != nil {
			c.Text = &tts.TextSpan{Start: int(m.Text.Start), End: int(m.Text.End)}
		}
		if err := emit(c); err != nil {
			return err
		}
	}
}

func (c *grpcClient) ExtractVoice(ctx context.Context, clip tts.VoiceClip) (tts.VoicePrompt, error) {
	r, err := c.c.ExtractVoice(ctx, &proto.VoiceClip{PcmF32Le: encodeF32(clip.PCM), SampleRate: uint32(clip.SampleRate), Text: clip.Text})
	if err != nil {
		return tts.VoicePrompt{}, fromStatus(err)
	}
	return *promptFromProto(r), nil
}

func (c *grpcClient) Health(ctx context.Context) (tts.Health, error) {
	r, err := c.c.Health(ctx, &proto.HealthRequest{})
	if err != nil {
		return tts.Health{}, fromStatus(err)
	}
	h := tts.Health{Ready: r.Ready, Message: r.Message, Inflight: int(r.Inflight),
		Cancels: tts.CancelStats{Count: r.Cancels, Freeing: time.Duration(r.CancelFreeingNs), MaxFreeing: time.Duration(r.CancelFreeingMaxNs)},
		PromptCache: tts.PromptCacheStats{Hits: r.PromptCacheHits, Misses: r.PromptCacheMisses, Evictions: r.PromptCacheEvictions,
			Bytes: int64(r.PromptCacheBytes), Voices: int(r.PromptCacheVoices)},
		FlowMemory: tts.FlowMemoryStats{Bytes: int64(r.FlowKvBytes), Peak: int64(r.FlowKvPeakBytes), Limit: int64(r.FlowKvLimitBytes),
			Waits: r.FlowKvWaits, Preemptions: r.FlowKvPreemptions}}
	for _, st := range r.Stages {
		h.Stages = append(h.Stages, tts.StageStats{Stage: st.Stage, Batches: st.Batches, Items: st.Items, Busy: time.Duration(st.BusyNs), Wait: time.Duration(st.WaitNs)})
	}
	return h, nil
}

// fromStatus turns a gRPC status back into the instance error kinds the router acts on.
func fromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.InvalidArgument:
		e := &tts.Error{Kind: tts.ErrInvalid, Msg: st.Message()}
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
				e.Param = br.GetFieldViolations()[0].GetField()
			}
		}
		return e
	case codes.ResourceExhausted:
		if e := tooLarge(st.Message()); e != nil {
			return e
		}
		return &tts.Error{Kind: tts.ErrBusy, Msg: st.Message()}
	case codes.Canceled:
		return fmt.Errorf("instance: %s: %w", st.Message(), context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("instance: %s: %w", st.Message(), context.DeadlineExceeded)
	case codes.Unavailable, codes.FailedPrecondition:
		return &tts.Error{Kind: tts.ErrNotReady, Msg: st.Message()}
	}
	return &tts.Error{Kind: tts.ErrInternal, Msg: st.Message()}
}
