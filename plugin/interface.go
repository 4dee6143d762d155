package plugin

import (
	"context"

	"github.com/voxmux/voxmux/instance"
)

// Instance is what an instance process offers across the boundary; the gRPC server adapter serves
// it and the gRPC client adapter implements it.
type Instance interface {
	Load(ctx context.Context, cfg instance.LoadConfig) (instance.Info, error)
	Synthesize(ctx context.Context, req instance.Request, emit func(instance.Chunk) error) error
	Health(ctx context.Context) (instance.Health, error)
}
