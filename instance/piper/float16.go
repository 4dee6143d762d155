package piper

import "github.com/voxmux/voxmux/instance/onnxedit"

// piper_precision float16 (docs/piper.md, "Precision"): the decoder graph (split.go), HiFi-GAN's
// convolutions over the latent frames and most of a voice's compute, is converted to float16 in
// memory (onnxedit.Float16), for the GPU's float16 convolutions; its inputs and outputs stay
// float32.

// float16Ops are the ops a Piper decoder runs in float16 on ONNX Runtime's CUDA provider besides
// the elementwise piperLocalOps: HiFi-GAN's convolutions, the speaker's conditioning and the shape
// ops around them. A decoder with another op is refused, naming it, rather than converted untried.
var float16Ops = map[string]bool{
	"Conv": true, "ConvTranspose": true, "Gather": true, "Constant": true, "ConstantOfShape": true,
	"Reshape": true, "Transpose": true, "Shape": true, "Concat": true, "Slice": true,
}

// decoderFloat16 is the decoder model (serialized) converted to float16.
func decoderFloat16(model []byte) ([]byte, onnxedit.Float16Stats, error) {
	return onnxedit.Float16(model, func(op string) bool { return float16Ops[op] || piperLocalOps[op] })
}
