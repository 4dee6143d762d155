package piper

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Options are the piper family's engine options, set under a group's `engine:` (docs/piper.md,
// "Batching"). The zero value of each is the default for the provider (piperOptionsFrom).
type Options struct {
	ort.Options
	// Batch is the most sentences of one voice run as one graph run, 1 to 1024 (1: no batching).
	// 0: 64 on CUDA, 1 on the CPU (docs/piper.md, "Batching").
	Batch int `json:"piper_batch"`
	// Workers is how many graph runs of one voice run at once, 1 to 256. 0: 2 on CUDA (one run's
	// host work overlaps the other's kernels), max_inflight on the CPU.
	Workers int `json:"piper_workers"`
	// Queue is how many sentences may wait per voice before requests are refused as busy (HTTP
	// 429), 1 to 1048576. 0: 1024.
	Queue int `json:"piper_queue"`
	// Decode is how a sentence's audio is made: "chunks" (the default) runs the voice's decoder
	// over chunks of latent frames and sends each chunk's audio as it is done; "sentences" runs
	// the whole graph once per sentence (docs/piper.md, "First audio").
	Decode Decode `json:"piper_decode"`
	// FirstChunk is the frames of a sentence's first chunk, 1 to 1024 (a frame is the voice's hop,
	// 256 samples). 0: 12.
	FirstChunk int `json:"piper_first_chunk"`
	// Chunk is the most frames of a later chunk, 1 to 4096: chunks double from FirstChunk up to
	// it. 0: 256.
	Chunk int `json:"piper_chunk"`
	// Precision is the float type the voice's decoder computes in: "float32" (the default), or
	// "float16", the decoder graph converted in memory for the GPU's float16 convolutions
	// (float16.go; docs/piper.md, "Precision"). float16 needs piper_decode chunks, which splits
	// the decoder off.
	Precision Precision `json:"piper_precision"`
	// Front is where a chunked voice's front graph (text encoder, duration predictor, flow) runs:
	// "gpu" (the default) on the group's provider, or "cpu" on ONNX Runtime's CPU provider, the
	// decoder staying on the group's provider. On CUDA the front's hundreds of small operators
	// cost more in launches and shape work than in arithmetic (docs/piper.md, "Front on the
	// CPU"). cpu needs piper_decode chunks, which splits the front off; on the CPU provider it
	// is gpu's placement. auto loads the front both ways and runs a front batch of at most
	// autoCPURows sentences on the CPU while no other front runs there, any other on the group's
	// provider: the CPU's first audio for a few streams, the GPU's throughput for many.
	Front Front `json:"piper_front"`
	// Flow is where a chunked voice's flow (VITS's coupling layers, from z_p to the latent) runs:
	// "front" in the front graph, over each sentence's frames before its first chunk; "chunks" cut
	// out of the front as a graph of its own on the group's provider, run for a request's first
	// chunk's frames (with the flow's receptive field on each side) and then for the rest, so that
	// first audio waits only for the text encoder and duration predictor, the request's other
	// sentences running the front with the flow (docs/piper.md, "The flow in chunks"). A voice
	// whose flow lacks VITS's structure keeps it in the front, with the reason logged. chunks
	// needs piper_decode chunks. Default: chunks on the CPU provider; front on CUDA, where with the
	// front on the CPU it made first audio later (90 against 74 ms on an H100).
	Flow Flow `json:"piper_flow"`
}

// Flow is where a chunked voice's flow runs (piper_flow).
type Flow string

const (
	// FlowFront runs the flow in the front graph, over a sentence's frames at once.
	FlowFront Flow = "front"
	// FlowChunks runs the flow over each chunk's frames, beside the decoder.
	FlowChunks Flow = "chunks"
)

func (f *Flow) UnmarshalText(b []byte) (err error) {
	*f, err = engine.ParseEnum(b, FlowFront, FlowChunks)
	return err
}

// Front is where a chunked voice's front graph runs (piper_front).
type Front string

const (
	// FrontGPU runs the front on the group's provider, as the decoder.
	FrontGPU Front = "gpu"
	// FrontCPU runs the front on ONNX Runtime's CPU provider.
	FrontCPU Front = "cpu"
	// FrontAuto runs small front batches on the CPU, the others on the group's provider.
	FrontAuto Front = "auto"
)

func (f *Front) UnmarshalText(b []byte) (err error) {
	*f, err = engine.ParseEnum(b, FrontGPU, FrontCPU, FrontAuto)
	return err
}

// Precision is the decoder's float type (piper_precision).
type Precision = engine.Precision

const (
	Float32 = engine.Float32
	Float16 = engine.Float16
)

// Decode is how a sentence's audio is made (piper_decode).
type Decode string

const (
	// DecodeChunks decodes a sentence in chunks of latent frames, each sent as it is done.
	DecodeChunks Decode = "chunks"
	// DecodeSentences runs the whole graph for a sentence and sends its audio at once.
	DecodeSentences Decode = "sentences"
)

func (d *Decode) UnmarshalText(b []byte) (err error) {
	*d, err = engine.ParseEnum(b, DecodeChunks, DecodeSentences)
	return err
}

// Name is the family's name, the Kind of its descriptions.
func (Family) Name() string { return "piper" }

// OptionKeys are the keys of Options.
func (Family) OptionKeys() []string { return engine.OptionKeys(Options{}) }

// ParseOptions parses and checks a group's engine section.
func (Family) ParseOptions(section tts.EngineSection) (any, error) { return parseOptions(section) }

func parseOptions(section tts.EngineSection) (Options, error) {
	return engine.Parse[Options]("piper", section)
}

// Validate checks every option; the error is a *tts.OptionError naming the first bad one.
func (o Options) Validate() error {
	if err := o.Options.Validate(); err != nil {
		return err
	}
	for _, r := range []struct {
		key     string
		v, most int
	}{{"piper_batch", o.Batch, 1024}, {"piper_workers", o.Workers, 256}, {"piper_queue", o.Queue, 1 << 20},
		{"piper_first_chunk", o.FirstChunk, 1024}, {"piper_chunk", o.Chunk, 4096}} {
		if r.v < 0 || r.v > r.most {
			return &tts.OptionError{Key: r.key, Msg: fmt.Sprintf("%d is not a number from 1 to %d", r.v, r.most)}
		}
	}
	if o.Precision == Float16 && o.Decode == DecodeSentences {
		return &tts.OptionError{Key: "piper_precision", Msg: "float16 converts the decoder that piper_decode chunks splits off the voice's graph; it cannot be used with piper_decode sentences"}
	}
	if (o.Front == FrontCPU || o.Front == FrontAuto) && o.Decode == DecodeSentences {
		return &tts.OptionError{Key: "piper_front", Msg: fmt.Sprintf("%s moves the front graph, which piper_decode chunks splits off the voice's graph, to the CPU; it cannot be used with piper_decode sentences, which runs the graph whole", o.Front)}
	}
	if o.Flow == FlowChunks && o.Decode == DecodeSentences {
		return &tts.OptionError{Key: "piper_flow", Msg: "chunks runs the flow over the chunks that piper_decode chunks decodes; it cannot be used with piper_decode sentences, which runs the graph whole"}
	}
	return nil
}
