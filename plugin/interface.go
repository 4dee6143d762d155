package plugin

import "github.com/voxmux/voxmux/tts"

// Instance is what an instance process offers across the boundary (the contract's): the gRPC
// server adapter serves it and the gRPC client adapter implements it.
type Instance = tts.Instance
