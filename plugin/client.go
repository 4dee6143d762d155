package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/plugin/proto"
)

// grpcClient adapts the generated gRPC client to Instance.
type grpcClient struct {
	c proto.InstanceClient
}

func (c *grpcClient) Load(ctx context.Context, cfg instance.LoadConfig) (instance.Info, error) {
	r, err := c.c.Load(ctx, &proto.LoadRequest{
		Manifest:        cfg.Manifest,
		Provider:        cfg.Provider,
		OrtLibrary:      cfg.ORTLibrary,
		ProviderOptions: cfg.ProviderOptions,
		MaxInflight:     uint32(cfg.MaxInflight),
		Placement:       cfg.Placement,
		GpuMemoryLimit:  cfg.GPUMemoryLimit,
	})
	if err != nil {
		return instance.Info{}, fromStatus(err)
	}
	var gpus []instance.GPU
	for _, g := range r.Gpus {
		gpus = append(gpus, instance.GPU{Index: int(g.Index), UUID: g.Uuid, Name: g.Name, MemoryTotal: g.MemoryTotal})
	}
	return instance.Info{
		GPUs:               gpus,
		Model:              r.Model,
		SampleRate:         int(r.SampleRate),
		Voices:             r.Voices,
		Provider:           r.Provider,
		CUDAVisibleDevices: r.CudaVisibleDevices,
		PID:                int(r.Pid),
	}, nil
}

func (c *grpcClient) Synthesize(ctx context.Context, req instance.Request, emit func(instance.Chunk) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the server's stream when emit fails
	st, err := c.c.Synthesize(ctx, &proto.SynthesizeRequest{RequestId: req.ID, Text: req.Text, Voice: req.Voice, Speed: req.Speed, Seed: req.Seed, Instructions: req.Instructions})
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
		if err := emit(instance.Chunk{PCM: decodeF32(m.PcmF32Le), SampleRate: int(m.SampleRate), Index: int(m.Index)}); err != nil {
			return err
		}
	}
}

func (c *grpcClient) Health(ctx context.Context) (instance.Health, error) {
	r, err := c.c.Health(ctx, &proto.HealthRequest{})
	if err != nil {
		return instance.Health{}, fromStatus(err)
	}
	h := instance.Health{Ready: r.Ready, Message: r.Message, Inflight: int(r.Inflight)}
	for _, st := range r.Stages {
		h.Stages = append(h.Stages, instance.StageStats{Stage: st.Stage, Batches: st.Batches, Items: st.Items, Busy: time.Duration(st.BusyNs), Wait: time.Duration(st.WaitNs)})
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
		return &instance.Error{Kind: instance.ErrInvalid, Msg: st.Message()}
	case codes.ResourceExhausted:
		return &instance.Error{Kind: instance.ErrBusy, Msg: st.Message()}
	case codes.Canceled:
		return fmt.Errorf("instance: %s: %w", st.Message(), context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("instance: %s: %w", st.Message(), context.DeadlineExceeded)
	case codes.Unavailable, codes.FailedPrecondition:
		return &instance.Error{Kind: instance.ErrNotReady, Msg: st.Message()}
	}
	return &instance.Error{Kind: instance.ErrInternal, Msg: st.Message()}
}
