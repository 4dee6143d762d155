package plugin

import (
	"fmt"
	"strings"

	"google.golang.org/grpc"

	"github.com/voxmux/voxmux/tts"
)

// MaxMessageBytes bounds one gRPC message between the router and an instance, both ways. The
// largest is a reference clip for a voice: the router accepts up to 30 s at up to 768 kHz, sent
// as float32 samples (92,160,000 bytes), with its transcript. gRPC's default of 4 MiB held only
// about 1.05 M samples (25 s at 48 kHz). Memory is spent per message received, not reserved.
const MaxMessageBytes = 96 << 20

// newGRPCServer is the instance's gRPC server, go-plugin's options plus the message limit.
func newGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes))...)
}

// dialOptions are the router's options for its connection to an instance.
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))}
}

// tooLarge reports gRPC's refusal of a message over a limit (its ResourceExhausted, the code an
// instance's busy answer has too) as an invalid request: retrying it cannot help.
func tooLarge(msg string) error {
	if !strings.Contains(msg, "larger than max") {
		return nil
	}
	return &tts.Error{Kind: tts.ErrInvalid, Msg: fmt.Sprintf("the request is larger than the %d MiB an instance takes in one message", MaxMessageBytes>>20)}
}
