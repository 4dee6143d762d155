package plugin

import (
	"context"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/voxmux/voxmux/plugin/proto"
)

// GRPCPlugin is the go-plugin glue: on the instance side it serves Impl, on the router side it
// hands out a client.
type GRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl Instance
}

// GRPCServer registers the server adapter.
func (p *GRPCPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	proto.RegisterInstanceServer(s, &grpcServer{impl: p.Impl})
	return nil
}

// GRPCClient returns the client adapter.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &grpcClient{c: proto.NewInstanceClient(c)}, nil
}

// Serve runs impl as an instance process until the router stops it.
func Serve(impl Instance) {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         goplugin.PluginSet{Name: &GRPCPlugin{Impl: impl}},
		GRPCServer:      newGRPCServer,
	})
}
